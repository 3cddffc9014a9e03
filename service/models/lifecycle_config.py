"""LifecycleConfig: the engine settings the server reads from its environment
and hands to the model lifecycle.

Its own module because both sides of a load read it: models/loading.py
checks a load against it, and engines/kinds.py builds the engine and plans
its memory from it; loading.py imports kinds.py, so the config living in
loading.py made the two import each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from service.engines.admission import SchedulerLimits

MIB = 1024 * 1024


@dataclass(frozen=True)
class LifecycleConfig:
    device: str = "auto"
    limits: SchedulerLimits = field(default_factory=SchedulerLimits)
    prefix_cache_tokens: int = 32768
    # How the transformers engine lays out float32 linear weights on a CPU
    # (engines/transformers/packed_linear.py): auto, packed, plain or bf16.
    torch_linear: str = "auto"
    # Only this model is served (and listed) when set.
    lock_model: str = ""
    # How long an unload waits for running requests before ending them.
    graceful_unload_timeout: float = 30.0
    # Memory a load must leave free beyond the weights (activations, KV cache).
    memory_headroom_bytes: int = 256 * MIB
    gguf_threads: int = 1
    gguf_context: int = 0  # 0: sized to memory (engines/gguf/kv_plan.py)
    gguf_slots: int = 8  # sequences decoded together, each with a window of KV cells
    gguf_flash_attn: bool = False  # llama.cpp's flash attention in GGUF contexts
    gguf_kv_f32: bool = False  # f32 generation KV cells (MILLM_GGUF_KV_TYPE=f32)
    gguf_kv_memory_bytes: int = 0  # what GGUF KV cells may take (0: the memory free)
