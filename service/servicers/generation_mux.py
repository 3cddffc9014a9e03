"""GenerateMany: many Generate calls over one stream, their replies in frames.

The REST bridge sends every generation to an engine over one long-lived
stream instead of a call each, so a decode step that advances 64 rows costs
one message each way, not 64 (the peers do the same: vLLM's engine core sends
one output batch per step to its API process, TGI's router gets every row's
tokens from one Decode call).

Each start is a Generate call in everything but transport: the rules of
servicers/access.py (drain, key, scope, rate limit, in-flight count, metrics
and the access-log line, under Generate's method name), its own timeout, and
the same code (`GenerationServicer.replies`). Its replies and its end go
into a shared list; one writer turns what piled up into a frame. Tasks woken
by one step of the model thread all run before the writer does (post_all
wakes the loop once a step), so a frame holds about one step. The list is
bounded: a reader that stops reading blocks the calls' tasks, their jobs'
queues fill, and the model thread abandons them as it would a stalled call.
"""

from __future__ import annotations

import asyncio
import logging
import math

import grpc

from common import grpc_limits
from millm.v1 import generation_service_pb2 as gen_pb
from service.errors import EngineError, invalid_parameter
from service.servicers.error_handling import as_engine_error

log = logging.getLogger(__name__)

GENERATE = "/millm.v1.GenerationService/Generate"
# Events waiting for the writer before a call's task waits for room.
MAX_PENDING_EVENTS = grpc_limits.MAX_UNREAD_REPLIES
# Calls running at once on one stream (the engine's queue bounds them first).
MAX_CALLS = 4096
# A frame stops growing past this (a reply may be large: readouts, logprobs).
FRAME_BYTES = 16 * 1024 * 1024


def end_event(call_id: int, code: grpc.StatusCode, message: str,
              details: bytes = b"") -> gen_pb.GenerateEvent:
    return gen_pb.GenerateEvent(id=call_id, end=gen_pb.GenerateEnd(
        code=code.value[0], message=message, status_details=details))


def error_event(call_id: int, error: EngineError) -> gen_pb.GenerateEvent:
    status = error.to_status()
    details = dict(status.trailing_metadata).get("grpc-status-details-bin", b"")
    return end_event(call_id, status.code, status.details, details)


class MuxStream:
    """One GenerateMany stream: its calls' tasks and the frames they fill."""

    def __init__(self, servicer, access):
        self.servicer, self.access = servicer, access
        self.calls: dict[int, asyncio.Task] = {}
        self.pending: list[gen_pb.GenerateEvent] = []
        self.wake = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()
        self.reading = True

    async def frames(self, requests):
        """The stream's frames until the caller closed its side and every call
        ended; leaving (the stream broke) cancels the calls still running."""
        reader = asyncio.create_task(self._read(requests))
        try:
            while True:
                await self.wake.wait()
                self.wake.clear()
                if self.pending:
                    events, self.pending = self.pending, []
                    self.room.set()
                    for frame in _frames(events):
                        yield frame
                if reader.done():
                    reader.result()  # a broken request side ends the stream with its error
                    if not self.calls and not self.pending:
                        return
        finally:
            reader.cancel()
            for task in list(self.calls.values()):
                task.cancel()

    def _emit(self, event: gen_pb.GenerateEvent) -> None:
        self.pending.append(event)
        self.wake.set()

    async def _read(self, requests) -> None:
        try:
            async for request in requests:
                if len(self.pending) >= MAX_PENDING_EVENTS:
                    # A caller that sends but does not read: take nothing more
                    # from it (gRPC's flow control then holds it back).
                    self.room.clear()
                    await self.room.wait()
                for start in request.starts:
                    self._start(start)
                for call_id in request.cancels:
                    task = self.calls.pop(call_id, None)
                    if task is not None:
                        task.cancel()
        finally:
            self.wake.set()

    def _start(self, start: gen_pb.GenerateStart) -> None:
        if start.id in self.calls or len(self.calls) >= MAX_CALLS:
            why = ("is already running on this stream" if start.id in self.calls
                   else f"would be more than {MAX_CALLS} calls running on one stream")
            self._emit(error_event(start.id, invalid_parameter(
                "id", f"Call id {start.id} {why}.")))
            return
        self.calls[start.id] = asyncio.create_task(self._serve(start))

    async def _serve(self, start: gen_pb.GenerateStart) -> None:
        metadata = {"authorization": start.authorization} if start.authorization else {}
        refusal, key = self.access.check(GENERATE, metadata)
        began = self.access.begin(key)  # sets the key for this task only
        code = "OK"
        try:
            if refusal is not None:
                code = refusal.status.name
                self._emit(error_event(start.id, refusal))
                return
            try:
                timeout = start.timeout_s if 0 < start.timeout_s < math.inf else None
                async with asyncio.timeout(timeout):
                    async for response in self.servicer.replies(start.request):
                        self._emit(gen_pb.GenerateEvent(id=start.id, response=response))
                        if len(self.pending) >= MAX_PENDING_EVENTS:
                            self.room.clear()
                            await self.room.wait()
            except TimeoutError:
                code = "DEADLINE_EXCEEDED"
                self._emit(end_event(start.id, grpc.StatusCode.DEADLINE_EXCEEDED,
                                     "Deadline Exceeded"))
                return
            except asyncio.CancelledError:
                code = "CANCELLED"
                raise
            except Exception as exc:  # noqa: BLE001 - every error must become a status
                error = as_engine_error(exc, "GenerationServicer.GenerateMany")
                code = error.status.name
                self._emit(error_event(start.id, error))
                return
            self._emit(end_event(start.id, grpc.StatusCode.OK, ""))
        finally:
            if self.calls.get(start.id) is asyncio.current_task():
                del self.calls[start.id]
            self.wake.set()
            self.access.end(GENERATE, began, code, start.request_id or "-", key)


def _frames(events: list[gen_pb.GenerateEvent]):
    """The events as frames of at most FRAME_BYTES (one event alone may be more)."""
    if len(events) == 1:
        yield gen_pb.GenerateManyResponse(events=events)
        return
    frame, size = [], 0
    for event in events:
        grows = event.ByteSize()
        if frame and size + grows > FRAME_BYTES:
            yield gen_pb.GenerateManyResponse(events=frame)
            frame, size = [], 0
        frame.append(event)
        size += grows
    if frame:
        yield gen_pb.GenerateManyResponse(events=frame)
