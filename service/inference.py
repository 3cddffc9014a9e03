"""The engine's data plane: models, generations and embeddings, independent
of gRPC.

The servicers translate protobuf to these calls and back; nothing here knows
about the wire, and nothing here knows which engine serves: it reads the
engine's capabilities (engines/base.py). A generation is prepared in one
sequence: the field table with the engine kind's capabilities (before any
load), a lease on the serving engine (loading it if another model is
loaded), the field table again with the loaded model's capabilities, the
parameter checks, steering, tokenization (on the event loop or in a worker
thread: tokenizer_calls.py), the context fit;
the result is one frozen ValidatedGeneration, held with its lease by a
Generation for as long as the caller's `async with` block runs. Tokenize and
detokenize (TokenizationService) hold a lease too, and encode through the
same function as generation (encode_conversation), so their ids are the
ones a generation of the same input would use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator

from common.log_text import shown
from service import formats
from service.engines.admission import SchedulerLimits
from service.engines.base import (
    KIND_CAPABILITIES,
    Engine,
    EngineCapabilities,
    EngineStatus,
    LoadedModel,
)
from service.errors import EngineError, invalid_parameter, model_not_found, model_not_loaded
from service.generation.compare import ComparedGeneration, twin
from service.generation.run import Generation
from service.models.lifecycle import Lease, ModelLifecycle, ModelState, ModelView
from service.models.lifecycle_config import LifecycleConfig
from service.models.registry import ModelEntry, ModelRegistry
from service.requests import checks, embeddings, reasoning, tokenization, tools
from service.requests.generation import ValidatedGeneration, fit_groups, validated
from service.requests.logit_bias import check_logit_bias_ids
from service.requests.params import EmbedParams, GenerateParams
from service.requests.tools import ToolPlan
from service.steering import intensity, readout
from service.steering.manager import UNSTEERED, SteeringManager
from service.steering.monitoring import MonitoringManager
from service.tokenizer_calls import TokenizerCalls

log = logging.getLogger(__name__)

__all__ = ["InferenceService", "ModelState", "ModelView"]


class InferenceService:
    def __init__(
        self,
        registry: ModelRegistry,
        device: str = "auto",
        limits: SchedulerLimits | None = None,
        prefix_cache_tokens: int = 32768,
        lifecycle: LifecycleConfig | None = None,
        steering: SteeringManager | None = None,
        monitoring: MonitoringManager | None = None,
    ):
        self.registry = registry
        self.steering = steering
        self.monitoring = monitoring
        # service/request_metrics.py's RequestMetrics once the server has one.
        self.request_metrics = None
        self.tokenizer_calls = TokenizerCalls()  # every tokenizer call below goes through it
        self.lifecycle = ModelLifecycle(registry, lifecycle or LifecycleConfig(
            device=device, limits=limits or SchedulerLimits(),
            prefix_cache_tokens=prefix_cache_tokens))
        if steering is not None:
            # SAEs attach to whichever model is loaded, whenever it changes.
            self.lifecycle.on_engine_change.append(steering.bind)

    @property
    def engine(self) -> Engine | None:
        return self.lifecycle.engine

    @property
    def loaded(self) -> LoadedModel | None:
        return self.lifecycle.loaded

    # -- models (models/lifecycle.py) -----------------------------------------------

    async def load(self, model_id: str) -> LoadedModel:
        return await self.lifecycle.load(model_id)

    async def unload(self, model_id: str) -> ModelEntry:
        return await self.lifecycle.unload(model_id)

    def shutdown(self) -> None:
        self.lifecycle.shutdown()

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

    def capabilities(self) -> tuple[EngineCapabilities, EngineCapabilities] | None:
        """(what the loaded engine's kind offers, what the loaded model does)."""
        engine = self.engine
        if engine is None:
            return None
        return engine.kind_capabilities, self._model_capabilities(engine)

    def _model_capabilities(self, engine: Engine) -> EngineCapabilities:
        caps = engine.capabilities
        if engine.format is not None and engine.format.reasoning is None:
            caps = dataclasses.replace(caps, reasoning=False)
        if self.steering is None and caps.steer:
            # No steering state in this process: steering fields are refused
            # (steering_unavailable), never silently dropped.
            caps = dataclasses.replace(caps, steer=False)
        return caps

    def status(self) -> EngineStatus | None:
        return self.engine.status() if self.engine is not None else None

    async def clear_prefix_cache(self) -> int:
        if self.engine is None:
            raise model_not_loaded("No model is loaded.")
        return await self.engine.clear_prefix_cache()

    # -- generation -------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def generation(self, params: GenerateParams) -> AsyncIterator[Generation]:
        """Validate a request completely, before anything is generated, and
        hold a lease on its engine until the block ends."""
        started = time.monotonic()
        entry = self.lifecycle.resolve(params.model)
        # Which fields this route and engine kind honour is known without the
        # model, so a field that cannot be honoured is refused before any load.
        checks.check_fields(params, KIND_CAPABILITIES[entry.engine])
        lease = await self.lifecycle.acquire(params.model)
        try:
            spec = await self._validate(params, lease)
            metrics = self.request_metrics
            generation = Generation(spec, lease, metrics.request(lease.info.id, started)
                                    if metrics is not None else None, self.monitoring)
            if params.steering_compare:
                generation = ComparedGeneration(generation, Generation(twin(spec), lease))
            yield generation
        finally:
            lease.release()

    async def _validate(self, params: GenerateParams, lease: Lease) -> ValidatedGeneration:
        engine, info = lease.engine, lease.info
        caps = self._model_capabilities(engine)
        ignored = checks.check_fields(params, engine.kind_capabilities, caps)
        request_id = params.request_id or uuid.uuid4().hex
        checked = checks.check_params(params)
        ignored.extend(checked.tools_unused)
        if checked.scoring:
            ignored.extend(checks.scoring_unused(params))
        fmt = engine.format or formats.detect(engine.chat_template, engine.special_tokens)
        if checked.tools is not None:
            # Calls are written (and constrained) in the model's own syntax.
            checked = dataclasses.replace(checked, tools=dataclasses.replace(
                checked.tools, syntax=fmt.calls))
            if fmt.calls.arguments is not None:
                # A custom tool's grammar is for JSON text; this notation is not.
                ignored.extend(f"tools[{i}].custom" for _, _, i in checked.tools.custom)
        variables = {}
        if params.messages is not None:
            # (A model with no reasoning format reports the fields: fields.py.)
            variables = reasoning.template_variables(
                checked.reasoning, engine.chat_template, ignored if caps.reasoning else [])
        checks.refuse_if_strict(params, ignored)
        dial = intensity.parse_dial(params.steering_intensity)
        steering = self.steering if caps.steer else None
        resolved = UNSTEERED
        if steering is not None and not checked.scoring:
            # Scoring is never steered: check_params refuses profile and dial.
            resolved = steering.resolve(params.profile, dial)
            if params.steering_compare and resolved.plan is not None and resolved.plan.scored:
                raise invalid_parameter("steering_compare", "This steering has a condition on "
                                        "a probe or a feature, read as each row generates; a "
                                        "side-by-side comparison cannot replay it.")
        # Every generation of a monitored model is read (validated() leaves
        # scoring out).
        monitoring = None
        if steering is not None and self.monitoring is not None:
            monitoring = self.monitoring.spec_for(info.id)
        activations = None
        if params.sae_activations is not None:
            activations = readout.check_request(params.sae_activations, steering.attached)
        if ignored:
            # Locations only: values can hold anything the client typed.
            log.warning("request_fields_unused request_id=%s locations=%s",
                        shown(request_id), shown(",".join(ignored), 1024))
        if params.messages is not None:
            checks.check_no_special_tokens(params, engine.special_tokens)
            if checked.scoring and not engine.has_chat_template:
                raise EngineError("no_chat_template", f"The model '{info.id}' has no chat "
                                  "template, so there is no prompt it was trained to score; "
                                  "send the rendered prompt to /v1/completions.", "messages")
        if params.prompts is not None:
            checks.check_token_ids(params, info.vocab_size)
        checks.check_allowed_token_ids(params, info.vocab_size)
        check_logit_bias_ids(params.logit_bias, info.vocab_size)
        prompt_ids = await self.tokenizer_calls.run(params.text_chars, self._tokenize, engine,
                                                    params, checked.tools, variables)
        plan = None
        if params.messages is not None and fmt.reasoning is not None and not checked.scoring:
            # Where the answer starts: the rendered prompt's end says.
            tail = await self.tokenizer_calls.run(  # a few tokens
                0, engine.decode, prompt_ids[0][-reasoning.PROMPT_TAIL_TOKENS:])
            plan = reasoning.plan_for(fmt.reasoning, reasoning.prompt_mode(fmt.reasoning, tail),
                                      checked.reasoning, engine.chat_template, ignored)
        grammar = None
        constrained = reasoning.grammar_item(plan, checked.constraint or checked.tools)
        if constrained is not None:  # (response_format and tools never both: checks.py)
            # On the engine's own grammar thread, under a time limit: a slow
            # schema never holds the default executor's threads.
            grammar = await engine.grammar_for(constrained)
        groups = fit_groups(params, checked, prompt_ids, info.context_window)
        if plan is not None and plan.budget is not None:
            reasoning.check_budget(plan.budget, checked.max_tokens or groups[0].max_tokens)
            if plan.budget > groups[0].max_tokens:  # max_tokens capped to the window's room
                plan = dataclasses.replace(plan, budget=groups[0].max_tokens)
        if activations is not None:
            readout.check_size(activations, len(groups[0].prompt_ids),
                               0 if checked.scoring else groups[0].max_tokens)
        texts: tuple[str, ...] = ()
        if checked.echo:
            texts = tuple([p if isinstance(p, str) else await self.tokenizer_calls.run(
                               None, engine.decode, list(p)) for p in params.prompts])
        return validated(params, checked, groups, request_id, ignored_fields=tuple(ignored),
                         grammar=grammar, prompt_texts=texts, steering=resolved,
                         activations=activations, monitoring=monitoring, reasoning=plan)

    @staticmethod
    def _tokenize(engine: Engine, params: GenerateParams, plan: ToolPlan | None,
                  variables: dict) -> list[list[int]]:
        if params.messages is not None:
            return [InferenceService._encode_chat(engine, turns, plan, variables)
                    for _, turns in params.conversations()]
        add_special = params.add_special_tokens is not False
        return [list(p) if isinstance(p, tuple)
                else engine.encode_text(p, parse_special=params.parse_special_tokens,
                                        add_special=add_special)
                for p in params.prompts]

    @staticmethod
    def _encode_chat(engine: Engine, turns, plan: ToolPlan | None,
                     variables: dict) -> list[int]:
        try:
            return InferenceService._render_chat(engine, turns, plan, variables)
        except EngineError:
            raise
        except Exception as exc:
            if not variables:
                raise
            # A template fed a variable it cannot use (a string where it adds
            # numbers): the caller's chat_template_kwargs, never a 5xx.
            raise invalid_parameter("chat_template_kwargs", "The chat template failed with "
                                    f"these chat_template_kwargs ({type(exc).__name__}).") \
                from None

    @staticmethod
    def _render_chat(engine: Engine, turns, plan: ToolPlan | None,
                     variables: dict) -> list[int]:
        messages, partial = checks.continuation(turns)
        return InferenceService.encode_conversation(engine, messages, partial, plan,
                                                    variables=variables)

    @staticmethod
    def encode_conversation(engine: Engine, messages: list[dict], partial: str | None,
                            plan: ToolPlan | None, *, generation_prompt: bool = True,
                            add_special: bool = False, variables: dict | None = None
                            ) -> list[int]:
        """The one way a conversation becomes ids, for generation and POST
        /tokenize alike; `variables` are the template's extra variables
        (chat_template_kwargs, reasoning_effort: requests/reasoning.py)."""
        if engine.renders_tools:
            return engine.encode_chat(messages, partial,
                                      plan.openai_tools() if plan is not None else None,
                                      variables, generation_prompt=generation_prompt,
                                      add_special=add_special)
        if plan is not None or any(m.get("tool_calls") or m["role"] == "tool"
                                   for m in messages):
            # A template that knows nothing of tools: they are written out as text.
            messages = tools.plain_messages(messages, plan)
        return engine.encode_chat(messages, partial, template_kwargs=variables,
                                  generation_prompt=generation_prompt, add_special=add_special)

    # -- tokenization (requests/tokenization.py) -------------------------------------

    async def tokenize(self, params: tokenization.TokenizeParams) -> tokenization.Tokenized:
        """The ids a generation of the same input would feed the model."""
        tokenization.check_prompt(params)
        lease = await self.lifecycle.acquire(params.model)
        try:
            engine, info = lease.engine, lease.info

            def encode() -> list[int]:
                if params.prompt is not None:
                    return engine.encode_text(
                        params.prompt, parse_special=params.parse_special_tokens,
                        add_special=params.add_special_tokens is not False)
                r = tokenization.chat_rendering(params, engine.special_tokens)
                return self.encode_conversation(
                    engine, r.messages, r.partial, r.plan, generation_prompt=r.generation_prompt,
                    add_special=params.add_special_tokens is True)

            ids = await self.tokenizer_calls.run(None, encode)
            strs = (await self.tokenizer_calls.run(None, engine.token_strings, ids)
                    if params.return_token_strs else None)
            return tokenization.Tokenized(ids, info.context_window, strs, info.id)
        finally:
            lease.release()

    async def detokenize(self, params: tokenization.DetokenizeParams) -> tuple[str, str]:
        """(the text of the ids, special tokens written out; the model id)."""
        lease = await self.lifecycle.acquire(params.model)
        try:
            tokenization.check_detokenize(params, lease.info.vocab_size)
            text = await self.tokenizer_calls.run(None, lease.engine.detokenize,
                                                  list(params.tokens))
            return text, lease.info.id
        finally:
            lease.release()

    # -- embeddings -------------------------------------------------------------------

    async def embed(self, params: EmbedParams) -> embeddings.EmbedResult:
        """Mean-pooled last hidden layer of each input, from an unsteered pass."""
        entry = self.lifecycle.resolve(params.model)
        unused = embeddings.check_fields(params, KIND_CAPABILITIES[entry.engine])
        lease = await self.lifecycle.acquire(params.model)
        try:
            engine, info = lease.engine, lease.info
            embeddings.check_inputs(params, info.vocab_size)
            ids = await self.tokenizer_calls.run(
                None, lambda: [list(p) if isinstance(p, tuple) else engine.encode_text(p)
                               for p in params.inputs])
            embeddings.check_fit(ids, info.context_window, info.embedding_window)
            vectors = await engine.embed(ids)
            return embeddings.EmbedResult(vectors, sum(len(t) for t in ids), info.id,
                                          tuple(unused))
        finally:
            lease.release()
