"""The engine's data plane: models and generations, independent of gRPC.

The servicers translate protobuf to these calls and back; nothing here knows
about the wire. It owns the loaded engine and its lifecycle state, runs the
validation pipeline (cheap checks, tokenization off the event loop, context
fit) and hands validated jobs to the engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from service.engines.base import Engine, EngineStatus, LoadedModel
from service.engines.scheduler import SchedulerLimits
from service.engines.transformers_engine import TransformersEngine
from service.errors import EngineError, invalid_parameter, model_not_found, model_not_loaded
from service.generation_job import FinishReason, GenerationJob, StepOutput, ValidatedGeneration
from service.model_registry import ModelEntry, ModelRegistry
from service.structured_output import Constraint, document_problem
from service.validation import (
    GenerateParams,
    check_fields,
    check_no_special_tokens,
    check_params,
    check_token_ids,
    resolve,
)

log = logging.getLogger(__name__)


class ModelState:
    READY = "ready"
    LOADING = "loading"
    LOADED = "loaded"


@dataclass(frozen=True)
class ModelView:
    entry: ModelEntry
    state: str
    loaded: LoadedModel | None


@dataclass(frozen=True)
class GenerationStarted:
    id: str
    created: int
    model: str
    system_fingerprint: str
    seed: int | None
    seed_scope: str | None
    prompt_tokens: int
    ignored_fields: tuple[str, ...] = ()
    constraint: Constraint | None = None


@dataclass(frozen=True)
class GenerationFinished:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class DocumentCheck:
    """Validates each constrained choice when it ends, before its last delta
    leaves the engine: "stop" is only ever reported for a document that parses
    and, for json_schema, validates. A choice cut by max_tokens ends "length"
    and is not checked (its text is incomplete by definition)."""

    def __init__(self, constraint: Constraint):
        self.constraint = constraint
        self.texts: dict[int, list[str]] = {}

    def check(self, step: StepOutput) -> None:
        for delta in step.deltas:
            self.texts.setdefault(delta.index, []).append(delta.text)
            if delta.finish_reason == FinishReason.STOP:
                problem = document_problem(self.constraint, "".join(self.texts[delta.index]))
                if problem is not None:
                    # The problem text can quote the output: it goes to the caller only.
                    log.error("constrained output of choice %d failed validation", delta.index)
                    raise EngineError("constrained_output_invalid", f"Choice {delta.index} "
                                      f"finished a document that is not valid: {problem}.")


def continuation(turns) -> tuple[list[dict[str, str]], str | None]:
    """(messages to render with the generation prompt, partial answer to append).

    A conversation that ends with an assistant message is a truncated answer
    to continue (a client's Continue button): rendering it as a closed turn
    would make the model start a new answer instead.
    """
    messages = [
        # OpenAI's developer role is the system role for templates.
        {"role": "system" if t.role == "developer" else t.role, "content": t.content}
        for t in turns
    ]
    if messages and messages[-1]["role"] == "assistant":
        return messages[:-1], messages[-1]["content"]
    return messages, None


class InferenceService:
    def __init__(
        self,
        registry: ModelRegistry,
        device: str = "auto",
        limits: SchedulerLimits | None = None,
        prefix_cache_tokens: int = 32768,
    ):
        self.registry = registry
        self.device = device
        self.limits = limits or SchedulerLimits()
        self.prefix_cache_tokens = prefix_cache_tokens
        self.engine: Engine | None = None
        self.loaded: LoadedModel | None = None
        self.loading: str | None = None
        self.load_error: str | None = None

    # -- lifecycle ---------------------------------------------------------------

    async def load(self, model_id: str) -> LoadedModel:
        entry = self.registry.get(model_id)
        if entry is None:
            raise model_not_found(model_id)
        self.loading = model_id
        try:
            engine = TransformersEngine(entry, device=self.device, limits=self.limits,
                                        prefix_cache_tokens=self.prefix_cache_tokens)
            started = time.monotonic()
            info = await asyncio.to_thread(engine.load)
            engine.start(asyncio.get_running_loop())
            log.info("loaded %s in %.1fs (%s)", model_id, time.monotonic() - started,
                     info.system_fingerprint)
        except Exception as exc:
            self.load_error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.loading = None
        self.engine, self.loaded = engine, info
        return info

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()

    # -- models -------------------------------------------------------------------

    def _view(self, entry: ModelEntry) -> ModelView:
        if self.loaded is not None and entry.id == self.loaded.id:
            return ModelView(entry, ModelState.LOADED, self.loaded)
        if entry.id == self.loading:
            return ModelView(entry, ModelState.LOADING, None)
        return ModelView(entry, ModelState.READY, None)

    def list_models(self) -> list[ModelView]:
        views = [self._view(e) for e in self.registry.scan()]
        # The loaded model first: clients that take the first id get one that answers.
        return sorted(views, key=lambda v: (v.state != ModelState.LOADED, v.entry.id))

    def get_model(self, model_id: str) -> ModelView:
        entry = self.registry.get(model_id)
        if entry is None:
            raise model_not_found(model_id)
        return self._view(entry)

    def status(self) -> EngineStatus | None:
        return self.engine.status() if self.engine is not None else None

    # -- generation ----------------------------------------------------------------

    def _serving_engine(self, model_id: str) -> Engine:
        if not model_id:
            raise invalid_parameter("model", "You must provide a model parameter.")
        if self.loaded is not None and model_id == self.loaded.id:
            return self.engine
        if self.registry.get(model_id) is None:
            raise model_not_found(model_id)
        if model_id == self.loading:
            raise model_not_loaded(f"The model '{model_id}' is still loading; retry shortly.")
        serving = f"this engine serves '{self.loaded.id}'" if self.loaded else "no model is loaded"
        raise model_not_loaded(
            f"The model '{model_id}' is on disk but not loaded, and {serving}."
        )

    async def prepare(self, params: GenerateParams) -> ValidatedGeneration:
        """Validate a request completely, before anything is generated."""
        if not params.model:
            raise invalid_parameter("model", "You must provide a model parameter.")
        if self.loaded is not None and params.model == self.loaded.id:
            entry = self.engine.entry  # no disk scan on the hot path
        else:
            entry = self.registry.get(params.model)
        if entry is None:
            raise model_not_found(params.model)
        # Which fields this route and engine honour is known without the model,
        # so a field that cannot be honoured is refused before any load.
        ignored = check_fields(params, entry.engine)
        request_id = params.request_id or uuid.uuid4().hex
        if ignored:
            # Locations only: values can hold anything the client typed.
            log.warning("request_fields_unused request_id=%s locations=%s",
                        request_id, ",".join(ignored))
        engine = self._serving_engine(params.model)
        checked = check_params(params)
        info = self.loaded
        if params.messages is not None:
            check_no_special_tokens(params, engine.special_tokens)
        if params.prompts is not None:
            check_token_ids(params, info.vocab_size)

        def tokenize() -> list[list[int]]:
            if params.messages is not None:
                return [engine.encode_chat(*continuation(params.messages))]
            return [
                list(p) if isinstance(p, tuple)
                else engine.encode_text(p, parse_special=params.parse_special_tokens)
                for p in params.prompts
            ]

        prompt_ids = await asyncio.to_thread(tokenize)
        grammar = None
        if checked.constraint is not None:
            grammar = await asyncio.to_thread(engine.grammar_for, checked.constraint)
        return resolve(params, checked, prompt_ids, info.context_window, request_id, ignored,
                       grammar)

    async def generate(
        self, spec: ValidatedGeneration
    ) -> AsyncIterator[GenerationStarted | StepOutput | GenerationFinished]:
        """Run a prepared generation. Closing the iterator early cancels it."""
        info = self.loaded
        job = GenerationJob(spec=spec, loop=asyncio.get_running_loop())
        # Submitting first means a full queue is refused before the stream opens.
        self.engine.submit(job)
        try:
            yield GenerationStarted(
                id=spec.request_id,
                created=int(time.time()),
                model=info.id,
                system_fingerprint=info.system_fingerprint,
                seed=spec.seed,
                # Seeded groups run in a lane of their own (engines/scheduler.py).
                seed_scope="request" if spec.seed is not None else None,
                prompt_tokens=spec.prompt_tokens,
                ignored_fields=spec.ignored_fields,
                constraint=spec.constraint,
            )
            documents = DocumentCheck(spec.constraint) if spec.constraint else None
            async for step in job.events():
                if documents is not None:
                    documents.check(step)
                yield step
        finally:
            # Closed before or between events: the model thread drops the job.
            job.cancelled.set()
        yield GenerationFinished(spec.prompt_tokens, job.completion_tokens, job.cached_tokens)
