"""The engine's data plane: models and generations, independent of gRPC.

The servicers translate protobuf to these calls and back; nothing here knows
about the wire. It owns the loaded engine and its lifecycle state, runs the
validation pipeline (cheap checks, tokenization off the event loop, context
fit) and hands validated jobs to the engine.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass

from service import field_policy
from service.engines import reading
from service.engines.base import Engine, EngineStatus, LoadedModel
from service.engines.scheduler import SchedulerLimits
from service.errors import (
    EngineError,
    context_length_exceeded,
    invalid_parameter,
    model_busy,
    model_not_found,
    model_not_loaded,
    unused_fields_refused,
)
from service.generation_job import (
    ChoiceDelta,
    FinishReason,
    GenerationJob,
    StepOutput,
    ValidatedGeneration,
)
from service.model_lifecycle import Lease, LifecycleConfig, ModelLifecycle, ModelState, ModelView
from service.model_registry import GGUF, ModelEntry, ModelRegistry
from service.steering import intensity, readout
from service.steering.manager import UNSTEERED, SteeringManager
from service.steering.runtime import UNSTEERED as UNSTEERED_READ
from service.steering.runtime import ActivationRecorder
from service.structured_output import Constraint, document_problem
from service.validation import (
    GenerateParams,
    check_allowed_token_ids,
    check_fields,
    check_no_special_tokens,
    check_params,
    check_token_ids,
    conversations,
    outside_vocabulary,
    refuse_if_strict,
    resolve,
    scoring_unused,
)

log = logging.getLogger(__name__)


__all__ = ["InferenceService", "ModelState", "ModelView"]

# The leases taken while one request is prepared (see InferenceService.prepare).
_pending_lease: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "pending_lease", default=None)


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
    # Steering headers: the resolved dial of a dialed request, the rung of a
    # circuit genuinely steering, and whether the pass is unsteered by rule (scoring).
    steering_echo: float | None = None
    circuit_rung: int | None = None
    unsteered: bool = False


@dataclass(frozen=True)
class ActivationsRead:
    """return_sae_activations' answer, after everything else."""

    result: readout.ActivationResult


@dataclass(frozen=True)
class Echoed:
    """Echoed prompts: (prompt index, text, reading.TokenScore per token or ())."""

    prompts: tuple


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


@dataclass(frozen=True)
class EmbedParams:
    model: str
    inputs: tuple  # str or tuple of token ids
    request_id: str = ""
    extra_fields: dict = dataclasses.field(default_factory=dict)
    unused_fields: tuple[str, ...] = ()
    user: str | None = None
    strict: bool = False


@dataclass(frozen=True)
class EmbedResult:
    vectors: list[list[float]]
    prompt_tokens: int
    model: str
    ignored_fields: tuple[str, ...]


MAX_EMBED_INPUTS = 2048


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
        if len(messages) == 1:
            # Nothing before the partial answer: no template renders an empty
            # conversation (HF's refuses it), so this is the caller's to fix.
            raise invalid_parameter("messages", "A trailing assistant message is continued, "
                                    "so it needs at least one message before it.")
        return messages[:-1], messages[-1]["content"]
    return messages, None


class InferenceService:
    def __init__(
        self,
        registry: ModelRegistry,
        device: str = "auto",
        limits: SchedulerLimits | None = None,
        prefix_cache_tokens: int = 32768,
        lifecycle: LifecycleConfig | None = None,
        steering: SteeringManager | None = None,
    ):
        self.registry = registry
        self.steering = steering
        self.lifecycle = ModelLifecycle(registry, lifecycle or LifecycleConfig(
            device=device, limits=limits or SchedulerLimits(),
            prefix_cache_tokens=prefix_cache_tokens))
        if steering is not None:
            # SAEs attach to whichever model is loaded, whenever it changes.
            self.lifecycle.on_engine_change.append(steering.bind)
        # Each prepared request's lease on the engine, until generate() ends it
        # (or the prepared request is dropped unused).
        self._leases: dict[int, Lease] = {}

    @property
    def engine(self) -> Engine | None:
        return self.lifecycle.engine

    @property
    def loaded(self) -> LoadedModel | None:
        return self.lifecycle.loaded

    # -- lifecycle (service/model_lifecycle.py) --------------------------------------

    async def load(self, model_id: str) -> LoadedModel:
        return await self.lifecycle.load(model_id)

    async def unload(self, model_id: str) -> ModelEntry:
        return await self.lifecycle.unload(model_id)

    def shutdown(self) -> None:
        self.lifecycle.shutdown()

    # -- models -------------------------------------------------------------------

    def list_models(self) -> list[ModelView]:
        views = [self.lifecycle.view(e) for e in self.registry.scan()]
        # The loaded model first: clients that take the first id get one that answers.
        return sorted(views, key=lambda v: (v.state != ModelState.LOADED, v.entry.id))

    def get_model(self, model_id: str) -> ModelView:
        try:
            entry = self.registry.resolve(model_id)
        except EngineError as exc:
            if exc.code == "AMBIGUOUS_MODEL_NAME" and self.lifecycle.config.lock_model:
                raise model_not_found(model_id) from None  # nothing else exists when locked
            raise
        return self.lifecycle.view(entry)

    def status(self) -> EngineStatus | None:
        return self.engine.status() if self.engine is not None else None

    async def clear_prefix_cache(self) -> int:
        if self.engine is None:
            raise model_not_loaded("No model is loaded.")
        return await self.engine.clear_prefix_cache()

    # -- generation ----------------------------------------------------------------

    async def _serving_engine(self, model_id: str) -> Engine:
        """The engine serving the named model, loaded first if another one is
        (model_lifecycle.py); the request holds a lease on it until it ends."""
        lease = await self.lifecycle.acquire(model_id)
        holder = _pending_lease.get()
        if holder is None:
            lease.release()  # nobody would end it; the caller only reads facts
        else:
            holder.append(lease)
        return lease.engine

    def _entry(self, model_id: str) -> ModelEntry:
        return self.lifecycle.resolve(model_id)

    async def prepare(self, params: GenerateParams) -> ValidatedGeneration:
        """Validate a request completely, before anything is generated; the
        prepared request holds a lease on the engine until generate() ends."""
        holder: list[Lease] = []
        token = _pending_lease.set(holder)
        try:
            spec = await self._prepare(params)
        except BaseException:
            for lease in holder:
                lease.release()
            raise
        finally:
            _pending_lease.reset(token)
        for lease in holder:
            self._leases[id(spec)] = lease
            # A prepared request dropped without generate() still ends its lease.
            weakref.finalize(spec, self._end_lease, id(spec))
        return spec

    def _end_lease(self, key: int) -> None:
        lease = self._leases.pop(key, None)
        if lease is not None:
            lease.release()

    async def _prepare(self, params: GenerateParams) -> ValidatedGeneration:
        entry = self._entry(params.model)
        # Which fields this route and engine honour is known without the model,
        # so a field that cannot be honoured is refused before any load.
        ignored = check_fields(params, entry.engine)
        request_id = params.request_id or uuid.uuid4().hex
        engine = await self._serving_engine(params.model)
        checked = check_params(params)
        if checked.scoring:
            ignored.extend(scoring_unused(params))
        refuse_if_strict(params, ignored)
        resolved, activations = self._steering(params, engine, checked.scoring)
        if ignored:
            # Locations only: values can hold anything the client typed.
            log.warning("request_fields_unused request_id=%s locations=%s",
                        request_id, ",".join(ignored))
        info = self.loaded
        if params.messages is not None:
            check_no_special_tokens(params, engine.special_tokens)
            if checked.scoring and not engine.has_chat_template:
                raise EngineError("no_chat_template", f"The model '{info.id}' has no chat "
                                  "template, so there is no prompt it was trained to score; "
                                  "send the rendered prompt to /v1/completions.", "messages")
        if params.prompts is not None:
            check_token_ids(params, info.vocab_size)
        check_allowed_token_ids(params, info.vocab_size)

        def tokenize() -> list[list[int]]:
            if params.messages is not None:
                return [engine.encode_chat(*continuation(turns))
                        for _, turns in conversations(params)]
            add_special = params.add_special_tokens is not False
            return [
                list(p) if isinstance(p, tuple)
                else engine.encode_text(p, parse_special=params.parse_special_tokens,
                                        add_special=add_special)
                for p in params.prompts
            ]

        prompt_ids = await asyncio.to_thread(tokenize)
        grammar = None
        if checked.constraint is not None:
            grammar = await asyncio.to_thread(engine.grammar_for, checked.constraint)
        spec = resolve(params, checked, prompt_ids, info.context_window, request_id,
                       tuple(ignored), grammar)
        if activations is not None:
            group = spec.groups[0]
            readout.check_size(activations, len(group.prompt_ids),
                               0 if checked.scoring else group.max_tokens)
        spec = dataclasses.replace(spec, steering=resolved.plan, steering_echo=resolved.echo,
                                   circuit_rung=resolved.rung, activations=activations)
        if spec.echo:
            texts = [p if isinstance(p, str) else await asyncio.to_thread(engine.decode, list(p))
                     for p in params.prompts]
            spec = dataclasses.replace(spec, prompt_texts=tuple(texts))
        return spec

    def _steering(self, params: GenerateParams, engine: Engine, scoring: bool):
        """(the request's resolved steering, its checked activation readout).
        Scoring is never steered: its refusal of profile and dial is a
        parameter check (validation.check_params)."""
        dial = intensity.parse_dial(params.steering_intensity)
        manager = self.steering if getattr(engine, "can_steer", False) else None
        resolved = UNSTEERED
        if manager is not None and not scoring:
            resolved = manager.resolve(params.profile, dial)
        activations = None
        if params.sae_activations is not None:
            attached = manager.attached if manager is not None else {}
            activations = readout.check_request(params.sae_activations, attached)
        return resolved, activations

    async def embed(self, params: EmbedParams) -> EmbedResult:
        """Mean-pooled last hidden layer of each input, from an unsteered pass."""
        entry = self._entry(params.model)
        unused = field_policy.check_extra_fields(params.extra_fields, field_policy.EMBEDDINGS,
                                                 entry.engine)
        unused.extend(params.unused_fields)
        if params.user is not None:
            unused.append("user")
        if params.strict and unused:
            raise unused_fields_refused(unused)
        lease = await self.lifecycle.acquire(params.model)
        try:
            return await self._embed(params, lease, unused)
        finally:
            lease.release()

    async def _embed(self, params: EmbedParams, lease: Lease, unused: list[str]) -> EmbedResult:
        engine, info = lease.engine, lease.info
        if not params.inputs:
            raise invalid_parameter("input", "'input' must not be empty.")
        if len(params.inputs) > MAX_EMBED_INPUTS:
            raise invalid_parameter("input", f"'input' takes at most {MAX_EMBED_INPUTS} items; "
                                    f"got {len(params.inputs)}.")
        for i, item in enumerate(params.inputs):
            if isinstance(item, tuple):
                bad = outside_vocabulary(item, info.vocab_size)
                if bad is not None:
                    raise invalid_parameter(f"input[{i}]", f"Input {i} holds token id {bad}, "
                                            f"outside the vocabulary (0-{info.vocab_size - 1}).")

        def tokenize() -> list[list[int]]:
            return [list(p) if isinstance(p, tuple) else engine.encode_text(p)
                    for p in params.inputs]

        ids = await asyncio.to_thread(tokenize)
        for i, tokens in enumerate(ids):
            if not tokens:
                raise invalid_parameter(f"input[{i}]", f"Input {i} tokenizes to no tokens.")
            if len(tokens) > info.context_window:
                raise context_length_exceeded(
                    f"input[{i}]", f"This model's maximum context length is "
                    f"{info.context_window} tokens. However, input {i} has {len(tokens)} "
                    "tokens. Please shorten it.")
        if engine.kind == GGUF:
            vectors = await engine.embed_inputs(ids)
        else:
            vectors = await engine.call(lambda ctx: reading.embed(ctx, ids))
        return EmbedResult(vectors, sum(len(t) for t in ids), info.id, tuple(unused))

    def _started(self, spec: ValidatedGeneration) -> GenerationStarted:
        info = self.loaded
        return GenerationStarted(
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
            steering_echo=spec.steering_echo,
            circuit_rung=spec.circuit_rung,
            unsteered=spec.scoring,
        )

    async def _read(self, spec: ValidatedGeneration, next_token: bool,
                    recorder: ActivationRecorder | None = None) -> list:
        """Scoring passes over every prompt (scoring mode, or echo)."""
        temperature = spec.options.temperature
        top = spec.logprobs or 0
        allowed = list(spec.allowed_token_ids) if spec.allowed_token_ids else None
        if self.engine.kind == GGUF:
            return await self.engine.score_prompts(
                [list(g.prompt_ids) for g in spec.groups], temperature=temperature,
                allowed=allowed, top=top, echo=spec.echo, next_token=next_token)

        def run(ctx):
            # Scoring is never steered; an echo is read as its completion is generated.
            plan = None if spec.scoring else spec.steering
            return [reading.score_prompt(ctx, list(g.prompt_ids), temperature=temperature,
                                         allowed=allowed, top=top, echo=spec.echo,
                                         next_token=next_token, recorder=recorder, plan=plan)
                    for g in spec.groups]

        return await self.engine.call(run)

    async def generate(
        self, spec: ValidatedGeneration
    ) -> AsyncIterator[GenerationStarted | Echoed | StepOutput | GenerationFinished]:
        """Run a prepared generation. Closing the iterator early cancels it."""
        lease = self._leases.pop(id(spec), None)
        try:
            async for event in self._generate(spec, lease):
                yield event
        finally:
            if lease is not None:
                lease.release()

    async def _generate(self, spec: ValidatedGeneration, lease: Lease | None):
        if spec.scoring or spec.echo:
            async for event in self._generate_reading(spec):
                yield event
            if spec.scoring or spec.groups[0].max_tokens == 0:
                return
        job = GenerationJob(spec=spec, loop=asyncio.get_running_loop())
        engine = self.engine
        if lease is not None:
            if lease.released:  # a forced unload ended it: its engine is gone
                raise model_busy("The model was unloaded before this request ran; retry.")
            engine = lease.engine
            lease.jobs.append(job)  # ended by a forced unload (model_lifecycle.py)
        # Submitting first means a full queue is refused before the stream opens.
        engine.submit(job)
        try:
            if not spec.echo:
                yield self._started(spec)
            documents = DocumentCheck(spec.constraint) if spec.constraint else None
            async for step in job.events():
                if documents is not None:
                    documents.check(step)
                yield step
        finally:
            # Closed before or between events: the model thread drops the job.
            job.cancelled.set()
        yield GenerationFinished(spec.prompt_tokens, job.completion_tokens, job.cached_tokens)
        if spec.activations is not None:
            yield ActivationsRead(readout.result(spec.activations, job.recorder))

    async def _generate_reading(self, spec: ValidatedGeneration):
        """Scoring mode (the answer is the most probable allowed token, from one
        forward pass) and echo (the prompt back, with its log-probabilities)."""
        yield self._started(spec)
        scored = None
        recorder = None
        if spec.activations is not None:  # scoring: readout is refused with echo
            recorder = ActivationRecorder(spec.activations, len(spec.groups[0].prompt_ids))
        if spec.scoring or spec.logprobs is not None:
            scored = await self._read(spec, next_token=spec.scoring, recorder=recorder)
        if spec.echo:
            yield Echoed(tuple(
                (i, spec.prompt_texts[i], scored[i].prompt_tokens if scored else ())
                for i in range(len(spec.groups))))
        if spec.scoring:
            yield StepOutput(tuple(
                ChoiceDelta(g.first_index, s.next.token.text, (s.next.token.token_id,),
                            FinishReason.LENGTH, (s.next,))
                for g, s in zip(spec.groups, scored, strict=True)))
            yield GenerationFinished(spec.prompt_tokens, len(spec.groups), 0)
            if recorder is not None:
                yield ActivationsRead(readout.result(spec.activations, recorder, UNSTEERED_READ))
        elif spec.groups[0].max_tokens == 0:
            # Echo alone: every choice is its prompt, with nothing generated.
            yield StepOutput(tuple(ChoiceDelta(g.first_index + j, "", (), FinishReason.LENGTH)
                                   for g in spec.groups for j in range(g.n)))
            yield GenerationFinished(spec.prompt_tokens, 0, 0)
