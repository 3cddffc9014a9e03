"""What chat and text completions share: the gRPC call, the non-streaming
aggregate and the SSE stream, both built from the same sequence of deltas.

A subclass says how its request maps to GenerateRequest and how its choices
and chunks look; this class runs the call. The first stream message (the
metadata) is read before any HTTP response is chosen, so every refusal the
engine makes before generating is an ordinary HTTP error, never a 200 stream.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request

from millm.v1 import generation_pb2, generation_service_pb2
from rest_bridge.engine_client import EngineClient
from rest_bridge.errors import OpenAIError, from_rpc_error
from rest_bridge.serving import (
    failover,
    ignored_fields,
    sse,
    steering_fields,
    structured_outputs,
    tool_calls,
)
from rest_bridge.serving.disconnect import unless_disconnected
from rest_bridge.serving.failover import RESTARTED, GenerateCall
from rest_bridge.serving.request_fields import common_fields, strict_mode

log = logging.getLogger(__name__)

FINISH_REASONS = {
    generation_pb2.FINISH_REASON_STOP: "stop",
    generation_pb2.FINISH_REASON_LENGTH: "length",
    generation_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls",
    generation_pb2.FINISH_REASON_CONTENT_FILTER: "content_filter",
}
SEED_SCOPES = {
    generation_pb2.SEED_SCOPE_REQUEST: "request",
    generation_pb2.SEED_SCOPE_BATCH_SHAPE: "batch-shape",
    generation_pb2.SEED_SCOPE_BEST_EFFORT: "best-effort",
}
# max_tokens capped to the context window's room: "<applied>;requested=<asked>"
# (an RFC 8941 integer with a parameter).
MAX_TOKENS_CAPPED = "X-miLLM-Max-Tokens-Capped"


@dataclass
class Accumulated:
    texts: dict[int, list[str]] = field(default_factory=dict)
    finish: dict[int, str] = field(default_factory=dict)
    scores: dict[int, list] = field(default_factory=dict)
    # Tool calls by choice, then by call index (OpenAI's message.tool_calls entries).
    calls: dict[int, dict[int, dict]] = field(default_factory=dict)
    reasoning: dict[int, list[str]] = field(default_factory=dict)
    usage: generation_pb2.Usage | None = None
    activations: object = None  # steering_pb2.SaeActivations, when asked for
    verdicts: object = None  # monitoring_pb2.ProbeVerdicts, when the model is monitored
    # steering_compare: the unsteered choices, and the comparison message.
    unsteered: Accumulated | None = None
    comparison: object = None

    def fold(self, deltas) -> None:
        for delta in deltas:
            self.texts.setdefault(delta.index, []).append(delta.text)
            self.scores.setdefault(delta.index, []).extend(delta.logprobs)
            if delta.reasoning:
                self.reasoning.setdefault(delta.index, []).append(delta.reasoning)
            if delta.tool_calls:
                tool_calls.fold(self.calls.setdefault(delta.index, {}), delta.tool_calls)
            if delta.finish_reason:
                self.finish[delta.index] = FINISH_REASONS[delta.finish_reason]


@dataclass
class Reply:
    """One request's view while its answer is built: the request, the echoed
    prompts (by prompt index) and per-choice state a route keeps."""

    request: object
    echoed: dict[int, generation_pb2.EchoedPrompt] = field(default_factory=dict)
    state: dict = field(default_factory=dict)


class GenerationHandler(abc.ABC):
    id_prefix: str
    object_name: str
    chunk_object_name: str

    def __init__(self, engine: EngineClient):
        self.engine = engine

    # -- what a subclass defines ----------------------------------------------------

    @abc.abstractmethod
    def to_pb(self, request) -> generation_service_pb2.GenerateRequest: ...

    @abc.abstractmethod
    def choice_count(self, request) -> int: ...

    @abc.abstractmethod
    def final_choice(self, reply: Reply, index: int, text: str, finish: str | None,
                     scores: list) -> dict: ...

    @abc.abstractmethod
    def opening_choices(self, reply: Reply, count: int) -> list[dict]:
        """Choices of the first chunk (chat announces the role; an echo sends the
        prompt); may be empty."""

    @abc.abstractmethod
    def delta_choice(self, reply: Reply, index: int, text: str, finish: str | None,
                     scores: list) -> dict: ...

    def tool_call_choice(self, reply: Reply, index: int, fragments) -> dict | None:
        """A streamed chunk choice for tool-call fragments (chat only)."""
        return None

    def reasoning_choice(self, reply: Reply, index: int, reasoning: str) -> dict | None:
        """A streamed chunk choice for reasoning text (chat only)."""
        return None

    def relabel(self, error: OpenAIError) -> OpenAIError:
        """An engine error's param as this route's JSON names it."""
        return error

    # -- shared machinery -------------------------------------------------------------

    def request_pb(self, request, http_request: Request) -> generation_service_pb2.GenerateRequest:
        """The subclass's translation plus what every route sends: strict mode,
        the fields this schema does not map (the engine judges them) and the
        user id (which the engine reports as unused)."""
        strict = strict_mode(http_request)
        pb = common_fields(request, self.to_pb(request), strict)
        if request.stream_options is not None and not request.stream:
            pb.unused_fields.append("stream_options")  # it shapes streams only
        return pb

    async def handle(self, request, http_request: Request):
        pb = self.request_pb(request, http_request)
        call, meta = await failover.start(self.engine, pb, http_request.app.state,
                                          bool(request.stream), self.relabel)
        reply = Reply(request)
        if request.stream:
            call.pin_seed()
            include_usage = bool(request.stream_options and request.stream_options.include_usage)
            body = self.stream(call, meta, reply, self.choice_count(request), include_usage,
                               http_request)
            return StreamingResponse(body, media_type="text/event-stream",
                                     headers={**sse.SSE_HEADERS, **self.response_headers(meta)})
        result = await unless_disconnected(http_request, self.collect(call, reply))
        # A retried request is answered from the call that completed.
        meta = call.metadata
        return JSONResponse(self.response_body(meta, reply, result),
                            headers=self.response_headers(meta))

    @staticmethod
    def response_headers(meta: generation_pb2.ResponseMetadata) -> dict[str, str]:
        headers = {}
        if meta.HasField("seed"):
            scope = SEED_SCOPES.get(meta.seed_scope, "best-effort")
            headers["X-miLLM-Seed"] = f'{meta.seed};scope="{scope}"'
        constrained = structured_outputs.header(meta)
        if constrained is not None:
            headers["X-miLLM-Constrained"] = constrained
        ignored = ignored_fields.header_value(list(meta.ignored_fields))
        if ignored is not None:
            headers[ignored_fields.HEADER] = ignored
        headers.update(steering_fields.headers(meta))
        if meta.HasField("max_tokens_cap"):  # max_tokens past the window's room
            cap = meta.max_tokens_cap
            headers[MAX_TOKENS_CAPPED] = f"{cap.applied};requested={cap.requested}"
        return headers

    def _base(self, meta) -> dict:
        return {
            "id": f"{self.id_prefix}{meta.id}",
            "object": self.object_name,
            "created": meta.created,
            "model": meta.model,
        }

    @staticmethod
    def usage_json(usage: generation_pb2.Usage) -> dict:
        return {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        }

    async def collect(self, call: GenerateCall, reply: Reply) -> Accumulated:
        acc = Accumulated()
        try:
            async for message in call.rest():
                if message is RESTARTED:  # sent again on another engine: start over
                    acc, reply.echoed = Accumulated(), {}
                    continue
                for echoed in message.echoed:
                    reply.echoed[echoed.prompt_index] = echoed
                acc.fold(message.choices)
                if message.unsteered_choices:
                    if acc.unsteered is None:
                        acc.unsteered = Accumulated()
                    acc.unsteered.fold(message.unsteered_choices)
                if message.HasField("comparison"):
                    acc.comparison = message.comparison
                if message.HasField("usage"):
                    acc.usage = message.usage
                if message.HasField("sae_activations"):
                    acc.activations = message.sae_activations
                if message.HasField("probe_verdicts"):
                    acc.verdicts = message.probe_verdicts
        except grpc.aio.AioRpcError as exc:
            raise self.relabel(from_rpc_error(exc)) from None
        finally:
            call.cancel()
        return acc

    def _choices(self, reply: Reply, acc: Accumulated) -> list[dict]:
        choices = []
        for i in sorted(set(acc.texts) | set(acc.finish)):
            extra = {}
            if acc.calls.get(i):
                extra["calls"] = [acc.calls[i][k] for k in sorted(acc.calls[i])]
            if acc.reasoning.get(i):
                extra["reasoning"] = "".join(acc.reasoning[i])
            choices.append(self.final_choice(
                reply, i, "".join(acc.texts.get(i, [])), acc.finish.get(i),
                acc.scores.get(i, []), **extra))
        return choices

    def response_body(self, meta, reply: Reply, acc: Accumulated) -> dict:
        body = self._base(meta)
        body["system_fingerprint"] = meta.system_fingerprint
        body["choices"] = self._choices(reply, acc)
        usage = acc.usage or generation_pb2.Usage(prompt_tokens=meta.prompt_tokens)
        body["usage"] = self.usage_json(usage)
        if acc.comparison is not None:
            # The same shapes as choices and usage, from a view of its own (a
            # route's per-choice state, such as text offsets, is per side).
            twin = Reply(reply.request, reply.echoed)
            body.setdefault("millm", {})["unsteered"] = {
                "choices": self._choices(twin, acc.unsteered or Accumulated()),
                "usage": self.usage_json(acc.comparison.unsteered_usage)}
            body["millm"]["divergence"] = steering_fields.divergence_json(acc.comparison)
        if acc.verdicts is not None:
            body.setdefault("millm", {})["probe_verdicts"] = steering_fields.verdicts_json(
                acc.verdicts)
        if acc.activations is not None:
            body.setdefault("millm", {}).update(steering_fields.millm_object(acc.activations))
        return body

    def _delta_choices(self, reply: Reply, delta) -> list[dict]:
        """One delta's chunk choices, whole (the unsteered side's: finish included)."""
        out = []
        scores = list(delta.logprobs)
        if delta.reasoning:
            thought = self.reasoning_choice(reply, delta.index, delta.reasoning)
            if thought is not None:
                out.append(thought)
        if delta.text or scores:
            out.append(self.delta_choice(reply, delta.index, delta.text, None, scores))
        if delta.tool_calls:
            out.append(self.tool_call_choice(reply, delta.index, delta.tool_calls))
        finish = FINISH_REASONS.get(delta.finish_reason)
        if finish:
            out.append(self.delta_choice(reply, delta.index, "", finish, []))
        return [c for c in out if c is not None]

    async def stream(self, call: GenerateCall, meta, reply: Reply, count: int,
                     include_usage: bool, http_request: Request) -> AsyncIterator[bytes]:
        """The SSE stream. The final chunk carries the last finish_reason and the
        usage, as the miLLM reference has it; with stream_options.include_usage
        the usage comes instead in OpenAI's trailing chunk with no choices, and
        every other chunk says `usage: null`."""
        base = {**self._base(meta), "object": self.chunk_object_name}

        def chunk(choices: list[dict], **extra) -> bytes:
            payload = {**base, "choices": choices, **extra}
            if include_usage and "usage" not in extra:
                payload["usage"] = None
            return sse.event(payload)

        text_event = sse.TextEvents(
            lambda index: chunk([self.delta_choice(reply, index, sse.MARK, None, [])]))
        finished: set[int] = set()
        held = None  # the final finish chunk, waiting for the usage
        twin = Reply(reply.request, reply.echoed)  # steering_compare's unsteered side
        try:
            # The opening goes out at once, unless it carries an echoed prompt
            # that the engine sends first.
            opened = not getattr(reply.request, "echo", False)
            if opened:
                opening = self.opening_choices(reply, count)
                if opening:
                    yield chunk(opening)
            async for message in call.rest():
                if message is RESTARTED:
                    # Nothing but the opening went out; the id stays the first call's.
                    continue
                # One write per engine message, however many events it makes.
                events = []
                for echoed in message.echoed:
                    reply.echoed[echoed.prompt_index] = echoed
                if not opened and not message.echoed:
                    opened = True
                    opening = self.opening_choices(reply, count)
                    if opening:
                        events.append(chunk(opening))
                for delta in message.choices:
                    finish = FINISH_REASONS.get(delta.finish_reason)
                    scores = list(delta.logprobs)
                    if delta.reasoning:
                        thought = self.reasoning_choice(reply, delta.index, delta.reasoning)
                        if thought is not None:
                            events.append(chunk([thought]))
                    if scores:
                        events.append(chunk([self.delta_choice(reply, delta.index, delta.text,
                                                               None, scores)]))
                    elif delta.text:
                        events.append(text_event(delta.index, delta.text))
                    if delta.tool_calls:
                        events.append(chunk([self.tool_call_choice(reply, delta.index,
                                                                   delta.tool_calls)]))
                    if finish:
                        finished.add(delta.index)
                        closing = [self.delta_choice(reply, delta.index, "", finish, [])]
                        if include_usage or len(finished) < count:
                            events.append(chunk(closing))
                        else:
                            held = closing
                if message.unsteered_choices:
                    # The unsteered side: the same chunk choices, under millm.
                    events.append(chunk([], millm={"unsteered": {"choices": [
                        c for delta in message.unsteered_choices
                        for c in self._delta_choices(twin, delta)]}}))
                if message.HasField("comparison"):
                    events.append(chunk([], millm={
                        "unsteered": {"usage": self.usage_json(
                            message.comparison.unsteered_usage)},
                        "divergence": steering_fields.divergence_json(message.comparison)}))
                if message.HasField("usage"):
                    usage = self.usage_json(message.usage)
                    if include_usage:
                        events.append(chunk([], usage=usage))
                    elif held is not None:
                        events.append(chunk(held, usage=usage))
                        held = None
                if message.HasField("probe_verdicts"):
                    # A chunk of its own after usage, before the activations and [DONE].
                    events.append(chunk([], millm={"probe_verdicts": steering_fields.verdicts_json(
                        message.probe_verdicts)}))
                if message.HasField("sae_activations"):
                    # Its own last chunk, after usage and before [DONE].
                    events.append(chunk([], millm=steering_fields.millm_object(
                        message.sae_activations)))
                if events:
                    yield b"".join(events)
            if held is not None:  # no usage came: the finish goes out without it
                yield chunk(held)
        except grpc.aio.AioRpcError as exc:
            # The 200 is already sent: report the failure in-stream, then end;
            # the access log and metrics count it as a failure, not a 200.
            if held is not None:
                yield chunk(held)
            error = self.relabel(from_rpc_error(exc))
            http_request.state.error_code = error.code
            http_request.state.stream_failed = True
            yield sse.event(error.body())
        finally:
            # A client that went away lands here too (Starlette cancels the
            # body iterator): cancelling the call stops the engine's work.
            call.cancel()
        yield sse.DONE
