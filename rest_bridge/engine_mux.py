"""Generations over one GenerateMany stream per engine (proto GenerationService).

A Generate call per request costs a gRPC message per token per stream on both
sides; over one long-lived stream the engine sends a frame a decode step
holding every running request's replies, and this side reads one message a
step and hands each request its own. `MuxCall` behaves as the grpc.aio call
it replaces (read() until EOF, AioRpcError with the same code, details and
ErrorInfo trailer, cancel, add_done_callback), so serving/failover.py and the
router treat both alike.

- The request's key and id go in its start, as the call's metadata would;
  its deadline is kept here (the call fails DEADLINE_EXCEEDED and the engine
  is told to stop) and in the engine.
- A stream that breaks fails the calls in flight on it with the stream's own
  error (UNAVAILABLE when the engine is lost: what a lost call gives, so
  failover sends an uncommitted request on); the next request opens a new one.
- An engine without GenerateMany (UNIMPLEMENTED: an older version during a
  rolling upgrade) gets per-request calls from then on; the requests the
  failed stream carried are sent again as calls.
- The engine sees no reader stop on a stream that carries many, so this side
  applies its rule (MILLM_STREAM_STALL_S, or 4,096 replies unread): the call
  ends CANCELLED and the engine stops its rows.
- Behind an L7 proxy that balances per call, MILLM_ENGINE_MUX=off keeps one
  call a request (a stream would pin every request to one engine).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

import grpc

from common import grpc_limits
from millm.v1 import generation_service_pb2 as gen_pb

log = logging.getLogger("millm.bridge")

METHOD = "/millm.v1.GenerationService/GenerateMany"
MAX_UNREAD = grpc_limits.MAX_UNREAD_REPLIES  # the engine's own bound
STALLED = "The client took nothing of this generation for too long; it was cancelled."


def _copy(error: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(error.code(), error.initial_metadata(),
                                error.trailing_metadata(), error.details(),
                                error.debug_error_string())


def _error(code: grpc.StatusCode, details: str,
           status_details: bytes = b"") -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata()
    if status_details:
        trailing.add("grpc-status-details-bin", status_details)
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details, None)


_CODES = {code.value[0]: code for code in grpc.StatusCode}


class MuxCall:
    """One request on a Mux: what a Generate call's grpc.aio object offers."""

    def __init__(self, mux: Mux, link: _Link, call_id: int, fallback):
        self.mux, self._link, self.id = mux, link, call_id
        self._fallback = fallback  # () -> a Generate call, should the stream be unimplemented
        self._replies: collections.deque = collections.deque()
        self._waiter: asyncio.Future | None = None
        self._error: grpc.aio.AioRpcError | None = None
        self._code: grpc.StatusCode | None = None
        self._callbacks: list = []
        self._timer: asyncio.TimerHandle | None = None
        self._delegate = None  # the Generate call carrying on after a fallback
        self._started = False  # a reply arrived
        self._since = 0.0  # the last read, or the first reply since it

    # -- what grpc.aio's call offers ---------------------------------------------

    async def read(self):
        while not self._replies:
            if self._delegate is not None:
                return await self._delegate.read()
            if self._code is not None:
                if self._code == grpc.StatusCode.CANCELLED and self._error is None:
                    raise asyncio.CancelledError()
                if self._error is not None:
                    raise self._error
                return grpc.aio.EOF
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        self._since = time.monotonic()
        return self._replies.popleft()

    def cancel(self) -> bool:
        if self._delegate is not None:
            return self._delegate.cancel()
        if self._code is not None:
            return False
        self.mux._cancel(self._link, self.id)
        self._finish(grpc.StatusCode.CANCELLED, None)
        return True

    def done(self) -> bool:
        return self._delegate.done() if self._delegate is not None else self._code is not None

    def cancelled(self) -> bool:
        return self._code == grpc.StatusCode.CANCELLED and self._error is None

    def add_done_callback(self, callback) -> None:
        if self._delegate is not None:
            self._delegate.add_done_callback(lambda _call: callback(self))
        elif self._code is not None:
            callback(self)
        else:
            self._callbacks.append(callback)

    async def code(self) -> grpc.StatusCode:
        while not self.done():
            await asyncio.sleep(0.01)
        if self._delegate is not None:
            return await self._delegate.code()
        return self._code

    # -- what the Mux tells it ---------------------------------------------------------

    def _reply(self, response: gen_pb.GenerateResponse) -> None:
        """A reply for the reader; a reader that stopped reading (its client
        stopped taking the stream) ends the call, as the engine ends a stalled
        Generate call: the row stops and its lease is freed."""
        self._started = True
        replies = self._replies
        if not replies:
            self._since = time.monotonic()
        elif (len(replies) >= MAX_UNREAD
              or time.monotonic() - self._since > self.mux.stall_s):
            log.warning("stream_stalled call %d: its reader took nothing for too long; "
                        "cancelled", self.id)
            self.mux._cancel(self._link, self.id)
            self._finish(grpc.StatusCode.CANCELLED, _error(grpc.StatusCode.CANCELLED, STALLED))
            return
        replies.append(response)
        self._wake()

    def _end(self, end: gen_pb.GenerateEnd) -> None:
        code = _CODES.get(end.code, grpc.StatusCode.UNKNOWN)
        error = None if code == grpc.StatusCode.OK else _error(code, end.message,
                                                               end.status_details)
        self._finish(code, error)

    def _fail(self, error: grpc.aio.AioRpcError) -> None:
        """The stream broke: end with its error, or go on as a Generate call."""
        if (error.code() == grpc.StatusCode.UNIMPLEMENTED and not self._started
                and self._fallback is not None):
            self._delegate = self._fallback()
            for callback in self._callbacks:
                self._delegate.add_done_callback(lambda _call, cb=callback: cb(self))
            self._callbacks.clear()
            self._cancel_timer()
            self._wake()
            return
        self._finish(error.code(), _copy(error))

    def _expire(self) -> None:
        self._timer = None
        if self._code is None:
            self.mux._cancel(self._link, self.id)
            self._finish(grpc.StatusCode.DEADLINE_EXCEEDED,
                         _error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))

    def _finish(self, code: grpc.StatusCode, error: grpc.aio.AioRpcError | None) -> None:
        if self._code is not None:
            return
        self._code, self._error = code, error
        self.mux._forget(self._link, self.id)
        self._cancel_timer()
        self._wake()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class _Link:
    """One opened GenerateMany stream: the calls it carries and what waits to
    be sent on it. A call belongs to the stream it started on: a broken
    stream fails its own calls, never those of the one opened after it."""

    def __init__(self):
        self.calls: dict[int, MuxCall] = {}
        self.starts: list[gen_pb.GenerateStart] = []
        self.cancels: list[int] = []
        self.outbox = asyncio.Event()
        self.stream = None
        self.reader: asyncio.Task | None = None
        self.broken = False

    async def requests(self):
        """What the stream sends: the starts and cancels gathered since the last message."""
        while True:
            await self.outbox.wait()
            self.outbox.clear()
            if self.starts or self.cancels:
                starts, self.starts = self.starts, []
                cancels, self.cancels = self.cancels, []
                yield gen_pb.GenerateManyRequest(starts=starts, cancels=cancels)


class Mux:
    """The GenerateMany stream to one engine (one channel), opened on first use."""

    def __init__(self, channel: grpc.aio.Channel,
                 stall_s: float = grpc_limits.STREAM_STALL_S):
        self.stall_s = stall_s
        self._open = channel.stream_stream(
            METHOD, request_serializer=gen_pb.GenerateManyRequest.SerializeToString,
            response_deserializer=gen_pb.GenerateManyResponse.FromString)
        self._link: _Link | None = None
        self._next_id = 0
        self.unsupported = False  # the engine answered UNIMPLEMENTED
        self._idle: asyncio.Event | None = None
        self.frames = self.events = 0  # read so far: events / frames is the coalescing

    def start(self, request: gen_pb.GenerateRequest, metadata, timeout: float | None,
              fallback) -> MuxCall:
        """A call for `request` with the call metadata a Generate call would
        carry (authorization, x-request-id) and its timeout in seconds."""
        link = self._link
        if link is None or link.broken:
            link = self._link = self._connect()
        self._next_id += 1
        call = MuxCall(self, link, self._next_id, fallback)
        link.calls[call.id] = call
        start = gen_pb.GenerateStart(id=call.id, request=request,
                                     timeout_s=timeout if timeout else 0.0)
        for key, value in metadata or ():
            if key == "authorization":
                start.authorization = value
            elif key == "x-request-id":
                start.request_id = value
        if timeout:
            call._timer = asyncio.get_running_loop().call_later(timeout, call._expire)
        link.starts.append(start)
        link.outbox.set()
        return call

    @property
    def in_flight(self) -> int:
        return len(self._link.calls) if self._link is not None else 0

    async def close(self, grace: float | None = None) -> None:
        """Let the running calls end (up to `grace` seconds), then end the stream."""
        link = self._link
        if link is None:
            return
        if grace and link.calls:
            self._idle = asyncio.Event()
            try:
                await asyncio.wait_for(self._idle.wait(), grace)
            except TimeoutError:
                pass
        link.broken = True
        link.stream.cancel()
        link.reader.cancel()

    # -- the stream --------------------------------------------------------------------

    def _connect(self) -> _Link:
        link = _Link()
        link.stream = self._open(link.requests())
        link.reader = asyncio.get_running_loop().create_task(self._read(link))
        return link

    async def _read(self, link: _Link) -> None:
        error = None
        try:
            async for frame in link.stream:
                calls = link.calls
                self.frames += 1
                self.events += len(frame.events)
                for event in frame.events:
                    call = calls.get(event.id)
                    if call is None:
                        continue  # cancelled or expired here
                    if event.WhichOneof("kind") == "response":
                        call._reply(event.response)
                    else:
                        call._end(event.end)
            error = _error(grpc.StatusCode.UNAVAILABLE, "The engine ended the stream.")
        except grpc.aio.AioRpcError as exc:
            error = exc
        except asyncio.CancelledError:
            error = _error(grpc.StatusCode.CANCELLED, "The bridge closed the stream.")
        finally:
            link.broken = True  # the next call opens a new stream
            if error is not None and error.code() == grpc.StatusCode.UNIMPLEMENTED:
                self.unsupported = True
                log.warning("engine has no GenerateMany: one Generate call a request from now on")
            for call in list(link.calls.values()):
                call._fail(error)
            link.calls.clear()

    def _cancel(self, link: _Link, call_id: int) -> None:
        if link.calls.pop(call_id, None) is not None and not link.broken:
            link.cancels.append(call_id)
            link.outbox.set()

    def _forget(self, link: _Link, call_id: int) -> None:
        link.calls.pop(call_id, None)
        if self._idle is not None and link is self._link and not link.calls:
            self._idle.set()
