"""The engine kinds, and what differs between them before an engine exists:
which class serves a registry entry, where it loads, and the memory it will
hold (for a GGUF file, the KV cells it will open: engines/gguf/kv_plan.py).
The lifecycle asks here rather than branching on a kind itself."""

from __future__ import annotations

import os

from service.engines.base import Engine
from service.engines.gguf.kv_plan import CellCost, KvPlan, plan
from service.models.lifecycle_config import LifecycleConfig
from service.models.registry import GGUF, ModelEntry


def make_engine(entry: ModelEntry, config: LifecycleConfig,
                kv: KvPlan | None = None) -> Engine:
    """The engine for `entry`; a GGUF engine opens the cells `kv` plans."""
    if entry.engine == GGUF:
        from service.engines.gguf.engine import GgufEngine

        if kv is None:  # not planned by a load check: plan with the memory free now
            kv = gguf_plan(entry, config, max(f for _, f in available_memory_bytes("cpu")))
        return GgufEngine(entry, kv, threads=config.gguf_threads,
                          flash_attn=config.gguf_flash_attn, kv_f32=config.gguf_kv_f32,
                          limits=config.limits,
                          prefix_cache_tokens=config.prefix_cache_tokens)
    from service.engines.transformers.engine import TransformersEngine

    return TransformersEngine(entry, device=config.device, limits=config.limits,
                              prefix_cache_tokens=config.prefix_cache_tokens,
                              linear_layout=config.torch_linear)


def load_device(entry: ModelEntry, device: str) -> str:
    """Where the entry's weights will live: llama.cpp runs on the CPU here."""
    return "cpu" if entry.engine == GGUF else device


def cell_cost(entry: ModelEntry) -> CellCost:
    return CellCost(entry.kv_bytes_per_token, entry.attention_heads)


def gguf_plan(entry: ModelEntry, config: LifecycleConfig, free: int) -> KvPlan:
    """The slots and window a GGUF file gets, given `free` bytes on its device:
    the engine may use MILLM_GGUF_KV_MEMORY_MIB, or else what is free beyond
    its weights and the headroom. MILLM_MAX_BATCH caps the slots: it is the
    most rows either engine decodes together."""
    budget = config.gguf_kv_memory_bytes or max(
        0, free - entry.size_bytes - config.memory_headroom_bytes)
    slots = min(config.gguf_slots, config.limits.max_batch)
    return plan(cell_cost(entry), entry.context_length, slots, budget, config.gguf_context,
                kv_width=4 if config.gguf_kv_f32 else 2)


def memory_needed(entry: ModelEntry, device: str, kv: KvPlan | None = None) -> tuple[int, int]:
    """(weights, KV cache and attention buffers) in bytes, as the engine will
    hold them at most (a GGUF model's: those its plan `kv` counts)."""
    if entry.engine == GGUF:
        return entry.size_bytes, kv.engine_bytes if kv is not None else 0
    weights = entry.size_bytes
    on_cpu = device == "cpu" or (device == "auto" and not any(
        name.startswith("cuda") for name, _ in available_memory_bytes("auto")))
    if on_cpu and entry.stored_bytes_per_param == 2:
        weights *= 2  # the transformers engine computes in float32 on a CPU
    # The transformers engine grows its KV cache with the requests: headroom covers it.
    return weights, 0


def memory_held(engine: Engine, device: str) -> int:
    """Bytes unloading `engine` surely frees: its weights and, for a GGUF
    engine, the shared context it opened at load (lanes and readers it may
    hold are not counted: they may not exist)."""
    weights, _ = memory_needed(engine.entry, device)
    kv = getattr(engine, "kv", None)
    if engine.entry.engine == GGUF and kv is not None:
        return weights + cell_cost(engine.entry).context_bytes(kv.cells)
    return weights


def available_memory_bytes(device: str) -> list[tuple[str, int]]:
    """(device name, bytes free) for each device a load could use."""
    if device.startswith("cuda") or device == "auto":
        try:
            import torch

            if torch.cuda.is_available():
                return [(f"cuda:{i}", torch.cuda.mem_get_info(i)[0])
                        for i in range(torch.cuda.device_count())]
        except Exception:  # no usable CUDA runtime: the model goes to the CPU
            pass
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return [("cpu", int(line.split()[1]) * 1024)]
    except OSError:
        pass
    pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return [("cpu", pages)]
