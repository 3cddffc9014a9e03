"""Which model is loaded, and moving from one to another safely.

One model is loaded at a time, in one slot. What the slot holds is a state
machine: `Phase` names its states, `MOVES` the moves between them, and `_move`
is the only code that changes it (a move not in MOVES is an internal error).

    STARTING ──load──▶ FIRST_LOAD ──ok──▶ LOADED ◀───────ok─────── LOADING
       ▲                   │                │ ▲                      ▲ │
       └─────fails─────────┘  unload, switch│ │cancelled         load│ │fails
                                            ▼ │                      │ ▼
                                         DRAINING ──▶ RELEASING ──▶ EMPTY

A model's own state (ModelView.state): the model in the slot is loading,
loaded or unloading as the slot's phase says; any other model is failed when
its last load failed (`failed`), else ready.

A request naming another model than the loaded one loads it first:

1. the load is checked before anything is unloaded: a quantization or an
   architecture the engine cannot load is 400 unsupported_quantization or
   unsupported_architecture, a model that does not
   fit in the memory that would be free is 503 insufficient_memory with the
   figures (a GGUF file's KV cells are planned to fit here first:
   engines/gguf/kv_plan.py); the loaded model keeps serving;
2. the unload begins: from this moment every new request is refused with
   503 model_busy (retry), whichever model it names, so no request ever
   starts on a model that is being moved;
3. requests already running finish first, for up to the graceful unload
   timeout; any still running then are ended with model_busy;
4. the new model loads; if that fails, 500 model_load_failed, and the model
   is FAILED until a later request or LoadModel tries it again.

Only one change runs at a time (`_change`, a task of its own): a request for a
third model while one runs is model_busy, and requests for the model that is
loading wait for it rather than starting a second load.

Each request holds a *lease* on the loaded engine from validation to its last
event; the unload waits for the leases to end.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from dataclasses import dataclass

from service import formats
from service.engines import kinds
from service.engines.base import Engine, LoadedModel
from service.engines.gguf.kv_plan import KvPlan
from service.errors import (
    EngineError,
    internal_error,
    invalid_parameter,
    model_busy,
    model_not_found,
    model_not_loaded,
)
from service.generation.job import GenerationJob
from service.models.lifecycle_config import LifecycleConfig
from service.models.loading import check_load
from service.models.registry import ModelEntry, ModelRegistry

log = logging.getLogger(__name__)


class ModelState(enum.StrEnum):
    """A model's state as ListModels and /api/models report it."""

    READY = "ready"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    FAILED = "failed"


class Phase(enum.StrEnum):
    """What the slot holds (moves: MOVES, drawn in the module docstring)."""

    STARTING = "starting"  # nothing has loaded yet: requests are model_not_loaded
    FIRST_LOAD = "first_load"  # the first load runs: requests are still model_not_loaded
    LOADING = "loading"  # a load runs: requests naming its model wait for it
    LOADED = "loaded"  # the model serves
    DRAINING = "draining"  # unloading: running requests finish, new ones are model_busy
    RELEASING = "releasing"  # unloading: the engine is detached and its memory freed
    EMPTY = "empty"  # nothing loaded: a request loads the model it names


MOVES: frozenset[tuple[Phase, Phase]] = frozenset({
    (Phase.STARTING, Phase.FIRST_LOAD), (Phase.FIRST_LOAD, Phase.LOADED),
    (Phase.EMPTY, Phase.LOADING), (Phase.LOADING, Phase.LOADED),
    (Phase.FIRST_LOAD, Phase.STARTING), (Phase.LOADING, Phase.EMPTY),  # the load failed
    (Phase.LOADED, Phase.DRAINING), (Phase.DRAINING, Phase.RELEASING),
    (Phase.RELEASING, Phase.EMPTY),
    (Phase.DRAINING, Phase.LOADED),  # the unload was cancelled (the loop is stopping)
})

# The state the model in the slot reports, by phase (STARTING and EMPTY hold none).
SLOT_MODEL_STATE = {
    Phase.FIRST_LOAD: ModelState.LOADING, Phase.LOADING: ModelState.LOADING,
    Phase.LOADED: ModelState.LOADED,
    Phase.DRAINING: ModelState.UNLOADING, Phase.RELEASING: ModelState.UNLOADING,
}


@dataclass(frozen=True)
class ModelView:
    entry: ModelEntry
    state: ModelState
    loaded: LoadedModel | None
    error: str = ""
    locked_out: bool = False


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


class ModelLifecycle:
    def __init__(self, registry: ModelRegistry, config: LifecycleConfig | None = None):
        self.registry = registry
        self.config = config or LifecycleConfig()
        # The slot: its phase, the model in it, and the engine while it holds one
        # (LOADED and DRAINING). Only _move assigns these.
        self._phase = Phase.STARTING
        self._model: str | None = None
        self._engine: Engine | None = None
        self._info: LoadedModel | None = None
        # Each model whose last load failed, with why.
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
        # Called with each new phase, synchronously (server.py: health turns
        # NOT_SERVING while the slot is not LOADED, so a switching replica
        # gets no traffic from a health-checking balancer).
        self.on_phase: list = []

    # -- the state machine ----------------------------------------------------------

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def engine(self) -> Engine | None:
        return self._engine

    @property
    def loaded(self) -> LoadedModel | None:
        return self._info

    @property
    def started(self) -> bool:
        """Whether a model has loaded: until then requests are model_not_loaded."""
        return self._phase not in (Phase.STARTING, Phase.FIRST_LOAD)

    def _move(self, to: Phase, model: str | None = None, engine: Engine | None = None,
              info: LoadedModel | None = None) -> None:
        """The one place the slot changes: to `to`, holding `model` (and, when
        LOADED or DRAINING, its engine)."""
        before = self._phase
        if (before, to) not in MOVES:
            log.error("illegal model state move %s -> %s (%s)", before, to, model)
            raise internal_error()
        self._phase, self._model, self._engine, self._info = to, model, engine, info
        log.debug("model state %s -> %s (%s)", before, to, model or "no model")
        for callback in self.on_phase:
            callback(to)

    # -- names --------------------------------------------------------------------

    def resolve(self, name: str) -> ModelEntry:
        if not name:
            raise invalid_parameter("model", "You must provide a model parameter.")
        if self._info is not None and name == self._info.id:
            return self._engine.entry  # no disk scan on the hot path
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
        if entry.id == self._model:
            return ModelView(entry, SLOT_MODEL_STATE[self._phase], self._info,
                             locked_out=locked_out)
        if entry.id in self.failed:
            return ModelView(entry, ModelState.FAILED, None, self.failed[entry.id], locked_out)
        return ModelView(entry, ModelState.READY, None, locked_out=locked_out)

    # -- leases -------------------------------------------------------------------

    def _busy(self) -> EngineError:
        doing = SLOT_MODEL_STATE.get(self._phase)
        if doing not in (ModelState.LOADING, ModelState.UNLOADING):
            return model_busy("Another model change is running; retry once it finishes.")
        return model_busy(f"The server is {doing} '{self._model}'; retry once it finishes.")

    def _changing(self) -> bool:
        return self._change is not None and not self._change.done()

    async def acquire(self, name: str) -> Lease:
        """A lease on the engine serving `name`, loading it first if needed."""
        entry = self.resolve(name)
        while True:
            if not self.started:
                raise model_not_loaded("The engine is still starting: its startup model is not "
                                       "loaded yet; retry shortly.")
            serving = self._phase is Phase.LOADED and self._model == entry.id
            if self._changing():
                if self._change_target == entry.id and self._phase in (
                        Phase.EMPTY, Phase.LOADING, Phase.LOADED):
                    # Wait for the load that is coming rather than start another.
                    await asyncio.shield(self._change)
                    continue
                if not serving:
                    raise self._busy()
                # A change is about to start: this request holds the model, and
                # the unload waits for it like for any running request.
            if serving:
                lease = Lease(self, self._engine, self._info)
                self._leases.add(lease)
                self._idle.clear()
                return lease
            await self.switch(entry)

    def _release(self, lease: Lease) -> None:
        self._leases.discard(lease)
        if not self._leases:
            self._idle.set()

    # -- loading and unloading ------------------------------------------------------

    def check_load(self, entry: ModelEntry) -> KvPlan | None:
        """Refuse a load that cannot succeed, before anything is unloaded
        (models/loading.py); for a GGUF file, the KV cells it will open."""
        return check_load(entry, self.config, self.engine, self.loaded)

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
        kv = self.check_load(entry)
        if self.engine is not None:
            await self._unload()
        return await self._load(entry, kv)

    async def _unload(self) -> None:
        engine, info = self._engine, self._info
        self._move(Phase.DRAINING, info.id, engine, info)
        started = time.monotonic()
        try:
            await asyncio.wait_for(self._idle.wait(), self.config.graceful_unload_timeout)
        except TimeoutError:
            log.warning("unloading %s: %d requests still running after %.1fs; ending them",
                        info.id, len(self._leases), self.config.graceful_unload_timeout)
            self._end_running(info.id)
        except BaseException:
            self._move(Phase.LOADED, info.id, engine, info)
            raise
        self._move(Phase.RELEASING, info.id)
        try:
            await self._announce(None)
            await asyncio.to_thread(engine.shutdown)
            log.info("unloaded %s in %.1fs", info.id, time.monotonic() - started)
        finally:
            self._move(Phase.EMPTY)

    def _end_running(self, model_id: str) -> None:
        error = model_busy(f"The model '{model_id}' was unloaded while this request ran "
                           "(it outlasted the graceful unload timeout); retry.")
        for lease in list(self._leases):
            for job in lease.jobs:
                job.fail(error)
            lease.release()

    async def _load(self, entry: ModelEntry, kv: KvPlan | None) -> LoadedModel:
        back = Phase.STARTING if self._phase is Phase.STARTING else Phase.EMPTY
        self._move(Phase.FIRST_LOAD if back is Phase.STARTING else Phase.LOADING, entry.id)
        try:
            engine = kinds.make_engine(entry, self.config, kv)
            started = time.monotonic()
            info = await self._start(engine, entry)
            await self._announce(engine)  # before any request can reach it
        except BaseException:
            self._move(back)
            raise
        self.failed.pop(entry.id, None)
        self._move(Phase.LOADED, entry.id, engine, info)
        log.info("loaded %s in %.1fs (%s)", entry.id, time.monotonic() - started,
                 info.system_fingerprint)
        return info

    async def _start(self, engine: Engine, entry: ModelEntry) -> LoadedModel:
        """Load the weights and start the engine; a failure is model_load_failed
        (or the engine's own refusal) and the model is FAILED."""
        try:
            info = await asyncio.to_thread(engine.load)
            engine.format = formats.resolve(engine.chat_template, engine.special_tokens,
                                            dict(entry.format_settings))
            log.info("%s: tool_call_format=%s reasoning_format=%s", entry.id,
                     engine.format.tool_call_format, engine.format.reasoning_format)
            engine.start(asyncio.get_running_loop())
            return info
        except Exception as exc:
            # An engine's own refusal keeps its code (unsupported_architecture);
            # any other failure is model_load_failed.
            known = isinstance(exc, EngineError)
            code = exc.code if known else "model_load_failed"
            message = exc.message if known else f"{type(exc).__name__}: {exc}"
            self.failed[entry.id] = message
            log.error("loading %s failed: %s", entry.id, message)
            try:
                engine.shutdown()
            except Exception:  # nothing more to free
                pass
            raise EngineError(code, f"Loading the model '{entry.id}' failed: {message}",
                              "model") from None

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
        if self._changing():
            raise self._busy()
        if self._phase is not Phase.LOADED or self._model != entry.id:
            raise invalid_parameter("model", f"The model '{entry.id}' is not loaded.")
        await self._run_change(f"unload:{entry.id}", self._unload())
        return entry

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
