"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API
over the engine's one generation path.

The body becomes a GenerateRequest (messages_input.py), the same call chat
completions make, with the same failover, refusals and headers; the engine
never learns which API asked. The answer is folded into a Message
(messages_output.py), returned whole or as Anthropic's events: message_start,
the content blocks' start/delta/stop, message_delta, message_stop, a `ping`
whenever the engine has said nothing for PING_INTERVAL_S (a long queue or
prefill), and an `error` event for a failure after the 200 went out.

A token count is the prompt a generation would render: the same request
with max_tokens 1 is opened, its metadata (the engine's count of the
rendered prompt) read, and the call cancelled before it generates.

`anthropic-beta` flags change nothing here (each feature miLLM serves is
served whether or not its beta is named): they are accepted whatever they
say, and a flag this bridge has not met before is logged once, so an
operator can see what new clients ask for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator

import grpc
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request

from rest_bridge.access import request_id
from rest_bridge.engine_client import EngineClient
from rest_bridge.errors import OpenAIError, from_rpc_error
from rest_bridge.protocol.messages import CountTokensRequest, MessagesRequest
from rest_bridge.serving import failover, messages_input, sse
from rest_bridge.serving.disconnect import unless_disconnected
from rest_bridge.serving.failover import RESTARTED, GenerateCall
from rest_bridge.serving.generation import GenerationHandler
from rest_bridge.serving.messages_output import Event, MessageFold
from rest_bridge.serving.request_fields import common_fields, strict_mode

PING_INTERVAL_S = 5.0
log = logging.getLogger(__name__)
# Betas whose features this route serves or reports (docs/anthropic-compatibility.md).
KNOWN_BETAS = frozenset({
    "claude-code-20250219", "interleaved-thinking-2025-05-14",
    "context-management-2025-06-27", "advanced-tool-use-2025-11-20", "effort-2025-11-24",
    "prompt-caching-2024-07-31", "token-counting-2024-11-01", "fine-grained-tool-streaming-"
    "2025-05-14", "tool-search-tool-2025-10-19"})
_SEEN_BETAS: set[str] = set()
_MAX_SEEN = 256  # a client cannot grow the set without bound


def note_betas(http_request: Request) -> None:
    """Log each anthropic-beta flag not met before (once per process)."""
    for flag in http_request.headers.get("anthropic-beta", "").split(","):
        flag = flag.strip()[:80]
        if not flag or flag in KNOWN_BETAS or flag in _SEEN_BETAS:
            continue
        if len(_SEEN_BETAS) < _MAX_SEEN:
            _SEEN_BETAS.add(flag)
            log.info("anthropic_beta_unknown flag=%r (accepted; nothing depends on it)", flag)


def event(name: str, payload: dict) -> bytes:
    return (f"event: {name}\ndata: ".encode()
            + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n")


def _frame(events: list[Event]) -> bytes:
    return b"".join(event(name, payload) for name, payload in events)


def _headers(meta, origins: messages_input.Origins) -> dict[str, str]:
    """Chat's headers, the ignored fields named as the Messages body names
    them ("thinking" or "output_config.effort", not the contract's
    reasoning_effort)."""
    spelled = origins.spelling.reported
    if any(spelled(n) != n for n in meta.ignored_fields):
        renamed = [n if n in origins.extras else spelled(n) for n in meta.ignored_fields]
        original, meta = meta, type(meta)()
        meta.CopyFrom(original)
        del meta.ignored_fields[:]
        meta.ignored_fields.extend(renamed)
    # Anthropic's SDKs read `request-id` (Message._request_id).
    return {**GenerationHandler.response_headers(meta), "request-id": request_id.get()}


async def _with_pings(call: GenerateCall) -> AsyncIterator:
    """The call's messages, with None whenever PING_INTERVAL_S pass without one."""
    messages = call.rest()
    pending = asyncio.ensure_future(anext(messages))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=PING_INTERVAL_S)
            if not done:
                yield None
                continue
            try:
                message = pending.result()
            except StopAsyncIteration:
                return
            yield message
            pending = asyncio.ensure_future(anext(messages))
    finally:
        if not pending.done():
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await pending
        await messages.aclose()


class MessagesHandler:
    def __init__(self, engine: EngineClient):
        self.engine = engine

    async def create(self, request: MessagesRequest, http_request: Request):
        strict = strict_mode(http_request)
        note_betas(http_request)
        pb, origins = messages_input.generate_request(request)
        pb = common_fields(request, pb, strict)
        call, meta = await failover.start(self.engine, pb, http_request.app.state,
                                          bool(request.stream), origins.relabel)

        def new_fold(m) -> MessageFold:
            return MessageFold(f"msg_{m.id}", m.model, m.prompt_tokens,
                               window_capped=m.HasField("max_tokens_cap"),
                               omit_thinking=origins.spelling.omit_thinking,
                               context_management=origins.context.response_field())

        fold = new_fold(meta)
        if request.stream:
            call.pin_seed()
            body = self._stream(call, fold, origins.relabel, http_request)
            return StreamingResponse(body, media_type="text/event-stream",
                                     headers={**sse.SSE_HEADERS, **_headers(meta, origins)})

        async def collect() -> MessageFold:
            folded = fold
            try:
                async for message in call.rest():
                    if message is RESTARTED:  # sent again on another engine: start over
                        folded = new_fold(call.metadata)
                        continue
                    folded.feed(message)
            except grpc.aio.AioRpcError as exc:
                raise origins.relabel(from_rpc_error(exc)) from None
            finally:
                call.cancel()
            folded.finish()
            return folded

        done = await unless_disconnected(http_request, collect())
        return JSONResponse(done.message(), headers=_headers(call.metadata, origins))

    async def _stream(self, call: GenerateCall, fold: MessageFold, relabel,
                      http_request: Request) -> AsyncIterator[bytes]:
        try:
            yield _frame([fold.start_event(), ("ping", {"type": "ping"})])
            async for message in _with_pings(call):
                if message is None:
                    yield event("ping", {"type": "ping"})
                elif message is not RESTARTED:  # a retry comes before any token
                    events = fold.feed(message)
                    if events:
                        yield _frame(events)
            yield _frame(fold.finish())
        except (grpc.aio.AioRpcError, OpenAIError) as exc:
            # The 200 is out: the failure is an error event, and the access
            # log and metrics count the stream as failed.
            error = relabel(from_rpc_error(exc)) if isinstance(exc, grpc.aio.AioRpcError) \
                else exc
            http_request.state.error_code = error.code
            http_request.state.stream_failed = True
            yield event("error", error.anthropic_body())
        finally:
            call.cancel()

    async def count_tokens(self, request: CountTokensRequest, http_request: Request):
        strict = strict_mode(http_request)
        note_betas(http_request)
        pb, origins = messages_input.generate_request(request)
        # As short as the request allows: a thinking budget needs room for itself.
        pb.sampling.max_tokens = max(1, pb.thinking_token_budget)
        pb = common_fields(request, pb, strict)
        call, meta = await failover.start(self.engine, pb, http_request.app.state, False,
                                          origins.relabel)
        call.cancel()
        return JSONResponse({"input_tokens": meta.prompt_tokens}, headers=_headers(meta, origins))
