"""The engine kinds, and what differs between them before an engine exists:
which class serves a registry entry, where it loads, and the memory it will
hold. The lifecycle asks here rather than branching on a kind itself."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from service.engines.base import Engine
from service.models.registry import GGUF, ModelEntry

if TYPE_CHECKING:
    from service.models.lifecycle import LifecycleConfig


def make_engine(entry: ModelEntry, config: LifecycleConfig) -> Engine:
    if entry.engine == GGUF:
        from service.engines.gguf.engine import GgufEngine

        return GgufEngine(entry, threads=config.gguf_threads,
                          max_queued=config.limits.max_queued, context=config.gguf_context,
                          slots=config.gguf_slots, stall_s=config.limits.stall_s)
    from service.engines.transformers.engine import TransformersEngine

    return TransformersEngine(entry, device=config.device, limits=config.limits,
                              prefix_cache_tokens=config.prefix_cache_tokens)


def load_device(entry: ModelEntry, device: str) -> str:
    """Where the entry's weights will live: llama.cpp runs on the CPU here."""
    return "cpu" if entry.engine == GGUF else device


def memory_needed(entry: ModelEntry, device: str, gguf_context: int = 0,
                  gguf_slots: int = 1) -> tuple[int, int]:
    """(weights, KV cache allocated at load) in bytes, as the engine will hold them
    (a GGUF model's cache: a context window per slot)."""
    if entry.engine == GGUF:
        context = entry.context_length
        if gguf_context:
            context = min(context, gguf_context) if context else gguf_context
        return entry.size_bytes, entry.kv_bytes_per_token * context * gguf_slots
    weights = entry.size_bytes
    on_cpu = device == "cpu" or (device == "auto" and not any(
        name.startswith("cuda") for name, _ in available_memory_bytes("auto")))
    if on_cpu and entry.stored_bytes_per_param == 2:
        weights *= 2  # the transformers engine computes in float32 on a CPU
    # The transformers engine grows its KV cache with the requests: headroom covers it.
    return weights, 0


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
