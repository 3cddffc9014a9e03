"""What a model load is given and whether it can succeed, checked before the
loaded model is unloaded (step 1 of models/lifecycle.py's docstring).

Given the engine settings (LifecycleConfig, models/lifecycle_config.py),
check_load refuses a quantization or architecture no engine
loads, and a model that would not fit in the memory free once the loaded
model's is counted back, naming the figures. For a GGUF file it plans the KV
cells first (engines/gguf/kv_plan.py), since they are part of what must fit.
"""

from __future__ import annotations

from service.engines import kinds
from service.engines.base import Engine, LoadedModel
from service.engines.gguf.kv_plan import KvPlan
from service.engines.kinds import available_memory_bytes
from service.errors import EngineError
from service.models.lifecycle_config import MIB, LifecycleConfig
from service.models.registry import GGUF, ModelEntry


def check_load(entry: ModelEntry, config: LifecycleConfig, engine: Engine | None,
               loaded: LoadedModel | None) -> KvPlan | None:
    """Refuse a load that cannot succeed, before anything is unloaded; for
    a GGUF file, the KV cells it will open (engines/gguf/kv_plan.py)."""
    if entry.unsupported:
        raise EngineError(entry.unsupported_code, f"The model '{entry.id}' cannot be "
                          f"loaded: {entry.unsupported}.", "model")
    device = kinds.load_device(entry, config.device)
    freed = kinds.memory_held(engine, device) if engine else 0
    figures = [(name, free + freed) for name, free in available_memory_bytes(device)]
    by_device = "; ".join(
        f"{name}: {free / MIB:.0f} MiB free"
        + (f" (counting {freed / MIB:.0f} MiB the unload of '{loaded.id}' frees)"
           if freed and loaded else "")
        for name, free in figures)
    kv = None
    if entry.engine == GGUF:
        kv = kinds.gguf_plan(entry, config, max(free for _, free in figures))
        if kv.refusal:
            raise EngineError(
                "insufficient_memory", f"The model '{entry.id}' cannot be loaded: "
                f"{kv.refusal} ({by_device}). The loaded model keeps serving.", "model",
                details={"needed_bytes": kv.engine_bytes + entry.size_bytes,
                         "free_bytes": ",".join(f"{n}={f}" for n, f in figures)})
    weights, cache = kinds.memory_needed(entry, device, kv)
    needed = weights + cache + config.memory_headroom_bytes
    if not any(free >= needed for _, free in figures):
        raise EngineError(
            "insufficient_memory",
            f"The model '{entry.id}' needs about {needed / MIB:.0f} MiB "
            f"({weights / MIB:.0f} MiB of weights, {cache / MIB:.0f} MiB of KV cache and "
            f"{config.memory_headroom_bytes / MIB:.0f} MiB of headroom), and no "
            f"device holds it: {by_device}. The loaded model keeps serving.", "model",
            details={"needed_bytes": needed,
                     "free_bytes": ",".join(f"{n}={f}" for n, f in figures)})
    return kv
