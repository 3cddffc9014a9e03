"""Which model is loaded, and moving from one to another safely.

One model is loaded at a time. A request naming another model loads it first:

1. the load is checked before anything is unloaded: a quantization the
   engine cannot load is 400 unsupported_quantization, a model that does not
   fit in the memory that would be free is 503 insufficient_memory with the
   figures; the loaded model keeps serving;
2. the unload begins: from this moment every new request is refused with
   503 model_busy (retry), whichever model it names, so no request ever
   starts on a model that is being moved;
3. requests already running finish first, for up to the graceful unload
   timeout; any still running then are ended with model_busy;
4. the new model loads; if that fails, 500 model_load_failed, and the model
   is FAILED until a later request or LoadModel tries it again.

Only one transition runs at a time: a request for a third model while one
runs is model_busy, and requests for the model that is loading wait for it
rather than starting a second load.

Each request holds a *lease* on the loaded engine from validation to its last
event; the unload waits for the leases to end.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field

from service.engines.base import Engine, LoadedModel
from service.engines.scheduler import SchedulerLimits
from service.errors import (
    EngineError,
    invalid_parameter,
    model_busy,
    model_not_found,
    model_not_loaded,
)
from service.generation_job import GenerationJob, GroupFailed
from service.model_registry import GGUF, ModelEntry, ModelRegistry

log = logging.getLogger(__name__)

MIB = 1024 * 1024


class ModelState:
    READY = "ready"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    FAILED = "failed"


@dataclass(frozen=True)
class ModelView:
    entry: ModelEntry
    state: str
    loaded: LoadedModel | None
    error: str = ""
    locked_out: bool = False


@dataclass(frozen=True)
class LifecycleConfig:
    device: str = "auto"
    limits: SchedulerLimits = field(default_factory=SchedulerLimits)
    prefix_cache_tokens: int = 32768
    # Only this model is served (and listed) when set.
    lock_model: str = ""
    # How long an unload waits for running requests before ending them.
    graceful_unload_timeout: float = 30.0
    # Memory a load must leave free beyond the weights (activations, KV cache).
    memory_headroom_bytes: int = 256 * MIB
    gguf_threads: int = 1
    gguf_context: int = 0  # 0: the file's trained context


class Lease:
    """One request's hold on the loaded engine."""

    def __init__(self, lifecycle: ModelLifecycle, engine: Engine, info: LoadedModel):
        self._lifecycle = lifecycle
        self.engine, self.info = engine, info
        self.jobs: list[GenerationJob] = []
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._lifecycle._release(self)


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


class ModelLifecycle:
    def __init__(self, registry: ModelRegistry, config: LifecycleConfig | None = None):
        self.registry = registry
        self.config = config or LifecycleConfig()
        self.engine: Engine | None = None
        self.loaded: LoadedModel | None = None
        # (state, model id) while a transition runs: UNLOADING or LOADING.
        self.transition: tuple[str, str] | None = None
        self.failed: dict[str, str] = {}
        self._leases: set[Lease] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        # The model change that runs (a task of its own), and the model it is for.
        self._change: asyncio.Future | None = None
        self._change_target: str | None = None
        # Called with the new engine once it has started (before any request
        # can use it) and with None after an unload: steering binds here.
        self.on_engine_change: list = []
        # Requests load models on demand only once the startup model has
        # loaded (before that the engine is not SERVING and answers
        # model_not_loaded).
        self.started = False

    # -- names --------------------------------------------------------------------

    def resolve(self, name: str) -> ModelEntry:
        if not name:
            raise invalid_parameter("model", "You must provide a model parameter.")
        if self.loaded is not None and name == self.loaded.id:
            return self.engine.entry  # no disk scan on the hot path
        lock = self.config.lock_model
        if not lock:
            return self.registry.resolve(name)
        try:
            entry = self.registry.resolve(name)
        except EngineError as exc:
            if exc.code != "AMBIGUOUS_MODEL_NAME":
                raise
            raise model_not_found(name) from None
        if entry.id != lock:
            # A locked server presents one model; the others do not exist for it.
            raise model_not_found(name)
        return entry

    def view(self, entry: ModelEntry) -> ModelView:
        locked_out = bool(self.config.lock_model) and entry.id != self.config.lock_model
        if self.transition is not None and self.transition[1] == entry.id:
            state = self.transition[0]
            loaded = self.loaded if state == ModelState.UNLOADING else None
            return ModelView(entry, state, loaded, locked_out=locked_out)
        if self.loaded is not None and entry.id == self.loaded.id:
            return ModelView(entry, ModelState.LOADED, self.loaded, locked_out=locked_out)
        if entry.id in self.failed:
            return ModelView(entry, ModelState.FAILED, None, self.failed[entry.id], locked_out)
        return ModelView(entry, ModelState.READY, None, locked_out=locked_out)

    # -- leases -------------------------------------------------------------------

    def _busy(self) -> EngineError:
        if self.transition is None:
            return model_busy("Another model change is running; retry once it finishes.")
        state, model = self.transition
        doing = "unloading" if state == ModelState.UNLOADING else "loading"
        return model_busy(f"The server is {doing} '{model}'; retry once it finishes.")

    def _changing(self) -> bool:
        return self._change is not None and not self._change.done()

    async def acquire(self, name: str) -> Lease:
        """A lease on the engine serving `name`, loading it first if needed."""
        entry = self.resolve(name)
        while True:
            if not self.started:
                raise model_not_loaded("The engine is still starting: its startup model is not "
                                       "loaded yet; retry shortly.")
            if self._changing():
                if self.transition == (ModelState.LOADING, entry.id) or (
                        self.transition is None and self._change_target == entry.id):
                    # Wait for the load that is coming rather than start another.
                    await asyncio.shield(self._change)
                    continue
                if self.transition is not None or self.loaded is None \
                        or self.loaded.id != entry.id:
                    raise self._busy()
                # A change is about to start: this request holds the model, and
                # the unload waits for it like for any running request.
            if self.loaded is not None and self.loaded.id == entry.id:
                lease = Lease(self, self.engine, self.loaded)
                self._leases.add(lease)
                self._idle.clear()
                return lease
            await self.switch(entry)

    def _release(self, lease: Lease) -> None:
        self._leases.discard(lease)
        if not self._leases:
            self._idle.set()

    # -- loading and unloading ------------------------------------------------------

    def check_load(self, entry: ModelEntry) -> None:
        """Refuse a load that cannot succeed, before anything is unloaded."""
        if entry.unsupported:
            raise EngineError("unsupported_quantization", f"The model '{entry.id}' cannot be "
                              f"loaded: {entry.unsupported}.", "model")
        device = "cpu" if entry.engine == GGUF else self.config.device
        weights, cache = self.memory_needed(entry, device)
        needed = weights + cache + self.config.memory_headroom_bytes
        freed = sum(self.memory_needed(self.engine.entry, device)) if self.engine else 0
        figures = [(name, free + freed) for name, free in available_memory_bytes(device)]
        if not any(free >= needed for _, free in figures):
            by_device = "; ".join(
                f"{name}: {free / MIB:.0f} MiB free"
                + (f" (counting {freed / MIB:.0f} MiB the unload of '{self.loaded.id}' frees)"
                   if freed and self.loaded else "")
                for name, free in figures)
            raise EngineError(
                "insufficient_memory",
                f"The model '{entry.id}' needs about {needed / MIB:.0f} MiB "
                f"({weights / MIB:.0f} MiB of weights, {cache / MIB:.0f} MiB of KV cache and "
                f"{self.config.memory_headroom_bytes / MIB:.0f} MiB of headroom), and no "
                f"device holds it: {by_device}. The loaded model keeps serving.", "model",
                details={"needed_bytes": needed,
                         "free_bytes": ",".join(f"{n}={f}" for n, f in figures)})

    def memory_needed(self, entry: ModelEntry, device: str) -> tuple[int, int]:
        """(weights, KV cache allocated at load) in bytes, as the engine will hold them."""
        if entry.engine == GGUF:
            context = entry.context_length
            if self.config.gguf_context:
                context = min(context, self.config.gguf_context) if context \
                    else self.config.gguf_context
            return entry.size_bytes, entry.kv_bytes_per_token * context
        weights = entry.size_bytes
        on_cpu = device == "cpu" or (device == "auto" and not any(
            name.startswith("cuda") for name, _ in available_memory_bytes("auto")))
        if on_cpu and entry.stored_bytes_per_param == 2:
            weights *= 2  # the transformers engine computes in float32 on a CPU
        # The transformers engine grows its KV cache with the requests: headroom covers it.
        return weights, 0

    def _make_engine(self, entry: ModelEntry) -> Engine:
        config = self.config
        if entry.engine == GGUF:
            from service.engines.gguf_engine import GgufEngine

            return GgufEngine(entry, threads=config.gguf_threads,
                              max_queued=config.limits.max_queued, context=config.gguf_context)
        from service.engines.transformers_engine import TransformersEngine

        return TransformersEngine(entry, device=config.device, limits=config.limits,
                                  prefix_cache_tokens=config.prefix_cache_tokens)

    async def switch(self, entry: ModelEntry) -> LoadedModel:
        """Make `entry` the loaded model (steps 1-4 of the module docstring).
        The change runs as a task of its own: a caller that goes away mid-way
        never leaves a half-moved model behind."""
        return await self._run_change(entry.id, self._switch(entry))

    async def _run_change(self, target: str, change) -> object:
        """Start a model change unless one runs (checked and claimed with no
        await in between, so two callers can never both start one)."""
        if self._changing():
            change.close()
            if self._change_target == target:
                return await asyncio.shield(self._change)
            raise self._busy()
        self._change_target = target
        self._change = asyncio.ensure_future(change)
        return await asyncio.shield(self._change)

    async def _switch(self, entry: ModelEntry) -> LoadedModel:
        if self.loaded is not None and self.loaded.id == entry.id:
            return self.loaded
        self.check_load(entry)
        if self.engine is not None:
            await self._unload()
        return await self._load(entry)

    async def _unload(self) -> None:
        engine, info = self.engine, self.loaded
        self.transition = (ModelState.UNLOADING, info.id)
        started = time.monotonic()
        try:
            try:
                await asyncio.wait_for(self._idle.wait(), self.config.graceful_unload_timeout)
            except TimeoutError:
                log.warning("unloading %s: %d requests still running after %.1fs; ending them",
                            info.id, len(self._leases), self.config.graceful_unload_timeout)
                self._end_running(info.id)
            self.engine = self.loaded = None
            await self._announce(None)
            await asyncio.to_thread(engine.shutdown)
            log.info("unloaded %s in %.1fs", info.id, time.monotonic() - started)
        finally:
            self.transition = None

    def _end_running(self, model_id: str) -> None:
        error = model_busy(f"The model '{model_id}' was unloaded while this request ran "
                           "(it outlasted the graceful unload timeout); retry.")
        for lease in list(self._leases):
            for job in lease.jobs:
                job.cancelled.set()
                job.queue.put_nowait(GroupFailed(error))
            lease.release()

    async def _load(self, entry: ModelEntry) -> LoadedModel:
        self.transition = (ModelState.LOADING, entry.id)
        engine = self._make_engine(entry)
        started = time.monotonic()
        try:
            info = await asyncio.to_thread(engine.load)
            engine.start(asyncio.get_running_loop())
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            self.failed[entry.id] = message
            log.error("loading %s failed: %s", entry.id, message)
            try:
                engine.shutdown()
            except Exception:  # nothing more to free
                pass
            raise EngineError("model_load_failed", f"Loading the model '{entry.id}' "
                              f"failed: {message}", "model") from None
        else:
            await self._announce(engine)  # before any request can reach it
        finally:
            self.transition = None
        self.failed.pop(entry.id, None)
        self.engine, self.loaded = engine, info
        self.started = True
        log.info("loaded %s in %.1fs (%s)", entry.id, time.monotonic() - started,
                 info.system_fingerprint)
        return info

    async def _announce(self, engine: Engine | None) -> None:
        for callback in self.on_engine_change:
            try:
                await callback(engine)
            except Exception:  # a listener's failure must not fail the model change
                log.exception("model change listener failed")

    async def load(self, name: str) -> LoadedModel:
        return await self.switch(self.resolve(name))

    async def unload(self, name: str) -> ModelEntry:
        entry = self.resolve(name)
        if self.loaded is None or self.loaded.id != entry.id or self._changing():
            if self._changing():
                raise self._busy()
            raise invalid_parameter("model", f"The model '{entry.id}' is not loaded.")
        await self._run_change(f"unload:{entry.id}", self._unload())
        return entry

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
