"""A streamed Responses API answer: typed server-sent events.

Each event is `event: <type>` plus `data: <json>` carrying the same type and
a `sequence_number` that grows by one from 0: response.created and
response.in_progress first, then the output items' events as OutputBuilder
makes them, then exactly one of response.completed, response.incomplete or
response.failed. There is no `[DONE]` line. The stream opens only after the
engine accepted the request (its refusals are ordinary HTTP errors); a
failure after that, the engine's or the store's, is a response.failed
event, never a dropped connection. A stored response is saved before its
last event, so a client that reads it back at once finds it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from millm.v1 import response_service_pb2 as rpb
from rest_bridge.errors import OpenAIError, from_rpc_error
from rest_bridge.serving.responses_json import response_json
from rest_bridge.serving.responses_output import Event, OutputBuilder

log = logging.getLogger(__name__)

TERMINAL = {rpb.RESPONSE_STATUS_COMPLETED: "response.completed",
            rpb.RESPONSE_STATUS_INCOMPLETE: "response.incomplete",
            rpb.RESPONSE_STATUS_FAILED: "response.failed"}


class _Writer:
    def __init__(self):
        self.sequence = 0

    def __call__(self, events: list[Event]) -> bytes:
        out = []
        for kind, payload in events:
            body = {"type": kind, "sequence_number": self.sequence, **payload}
            self.sequence += 1
            out.append(b"event: " + kind.encode() + b"\ndata: "
                       + json.dumps(body, separators=(",", ":")).encode() + b"\n\n")
        return b"".join(out)


async def events(messages: AsyncIterator, builder: OutputBuilder, store: bool,
                 save: Callable[[], Awaitable[None]] | None,
                 relabel: Callable[[OpenAIError], OpenAIError],
                 cancel: Callable[[], None],
                 failed: Callable[[str], None] = lambda code: None) -> AsyncIterator[bytes]:
    """The SSE body: `messages` is the rest of the engine's stream, `save`
    stores the finished response (None: not stored), `cancel` stops the
    engine's call when the client goes away, `failed(code)` is told when the
    stream ends in response.failed (for the access log and metrics)."""
    write, response = _Writer(), builder.response

    def snapshot(status: str | None = None) -> dict:
        return {"response": response_json(response, store=store, status=status)}

    try:
        yield write([("response.created", snapshot("in_progress")),
                     ("response.in_progress", snapshot("in_progress"))])
        try:
            async for message in messages:
                if out := builder.feed(message):
                    yield write(out)  # one write per engine message
            closing = builder.finish()
        except grpc.aio.AioRpcError as exc:
            error = relabel(from_rpc_error(exc))
            closing = builder.fail(error.code, error.message)
        if save is not None:
            try:
                await save()
            except OpenAIError as exc:
                # Generated but not stored: the client must not think it can chain on it.
                log.warning("a streamed response was not stored: %s", exc.message)
                closing += builder.fail(exc.code, f"The response was not stored: {exc.message}")
        if response.status == rpb.RESPONSE_STATUS_FAILED:
            failed(response.error.code)
        yield write([*closing, (TERMINAL[response.status], snapshot())])
    finally:
        # A client that went away lands here too (Starlette cancels the body
        # iterator): cancelling the call stops the engine's work.
        cancel()
