"""Generation that survives losing an engine before it produced anything.

gRPC's retry policy (rest_bridge/engine_client.py) tries a call again only
until the first reply message arrives, and a Generate stream's first message is
its metadata, sent before the first token. From there on the bridge carries the
request itself: when the engine is lost (UNAVAILABLE without ErrorInfo) and
nothing the client could see came from it yet, the same request is sent again
and the balancer gives it to another engine: round-robin on the balanced
channel, or the router (rest_bridge/routing/) told to leave out the replicas
already tried. With the router, a call refused UNAVAILABLE before its first
message (the replica drains, or switches models) is also sent to another:
the router's own channels have no gRPC retry policy to do it.

- A non-streamed request has sent the client nothing until it is complete, so
  it is retried whole: `GenerateCall.rest()` yields RESTARTED and the caller
  drops what it gathered.
- A stream is retried until its first token: the 200 and the opening chunk
  (the role) are already out, so the retry keeps the first call's id and, when
  the engine chose the seed, asks the next engine for that same seed, so the
  X-miLLM-Seed header sent stays true.

Every call also gets a deadline from the request (`deadline_s`), so a call to
an engine that hangs without dropping the connection ends instead of waiting
for ever.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

import grpc

from millm.v1 import generation_service_pb2
from rest_bridge.access import call_metadata, request_id
from rest_bridge.config import BridgeConfig
from rest_bridge.errors import OpenAIError, engine_lost, from_rpc_error

log = logging.getLogger("millm.bridge")

MAX_ATTEMPTS = 3
BACKOFF_S = 0.05  # times the attempt number: time for the balancer to see the loss
RESTARTED = object()  # rest() yields this when a lost call was sent again


def deadline_s(config: BridgeConfig, request: generation_service_pb2.GenerateRequest) -> float:
    """How long one generation may take: a base (queueing and prefill) plus a
    bound per requested token, capped; without max_tokens, the cap."""
    sampling = request.sampling
    tokens = None
    for name in ("max_completion_tokens", "max_tokens"):
        if sampling.HasField(name) and getattr(sampling, name) > 0:
            tokens = getattr(sampling, name)
            break
    if tokens is None:
        return config.engine_deadline_max_s
    return min(config.engine_deadline_max_s,
               config.engine_deadline_base_s + tokens * config.engine_deadline_per_token_s)


def count_retry(metrics, rpc: str, attempt: int, attempt_started: float) -> None:
    """An engine call sent again: counted and logged as an engine_retry line."""
    metrics.engine_retries.labels(rpc).inc()
    log.warning(json.dumps({
        "message": "engine_retry", "rpc": rpc, "request_id": request_id.get(),
        "attempt": attempt, "attempt_started_ms": int(attempt_started * 1000),
        "timestamp": int(time.time() * 1000)}))


class GenerateCall:
    """One Generate request across engines: the current call, its messages, and
    a new call on another engine while the request is still retryable."""

    def __init__(self, engine, request: generation_service_pb2.GenerateRequest,
                 timeout_s: float, metrics, *, streamed: bool):
        self.engine, self.request, self.metrics = engine, request, metrics
        self.streamed = streamed
        self.deadline = time.monotonic() + timeout_s
        self.attempts = 0
        self.committed = False  # a token went to the client: no more retries
        self.call = None
        self.tried: frozenset[str] = frozenset()  # replicas the router gave earlier attempts
        self.routed = False  # the current attempt went to a replica the router picked
        self.metadata = None  # the current call's ResponseMetadata
        self._attempt_started = 0.0

    async def open(self) -> generation_service_pb2.GenerateResponse:
        """Start a call and return its first message (the metadata)."""
        while True:
            self.attempts += 1
            self._attempt_started = time.time()
            self.call, target = self.engine.generate(
                self.request, self.tried, metadata=call_metadata.get(),
                timeout=max(0.001, self.deadline - time.monotonic()))
            self.routed = target is not None
            if target is not None:
                self.tried |= {target}
            try:
                first = await self.call.read()
            except grpc.aio.AioRpcError as exc:
                if not self._may_retry(exc, opening=True):
                    raise
                await asyncio.sleep(BACKOFF_S * self.attempts)
                continue
            if first is not grpc.aio.EOF and first.HasField("metadata"):
                self.metadata = first.metadata
            return first

    async def rest(self) -> AsyncIterator:
        """The messages after the metadata; RESTARTED when the request was sent
        again (then the new call's messages follow, its metadata skipped)."""
        while True:
            try:
                message = await self.call.read()
            except grpc.aio.AioRpcError as exc:
                if not self._may_retry(exc):
                    raise
                self.call.cancel()
                await asyncio.sleep(BACKOFF_S * self.attempts)
                first = await self.open()
                if first is grpc.aio.EOF or not first.HasField("metadata"):
                    raise exc
                yield RESTARTED
                continue
            if message is grpc.aio.EOF:
                return
            if self.streamed and message.choices:
                self.committed = True
            yield message

    def pin_seed(self) -> None:
        """A stream's seed header is out: a retry must use that seed."""
        meta = self.metadata
        if meta is not None and meta.HasField("seed") and not self.request.sampling.HasField(
                "seed"):
            self.request.sampling.seed = meta.seed

    def _may_retry(self, exc: grpc.aio.AioRpcError, opening: bool = False) -> bool:
        refused = (opening and self.routed and exc.code() == grpc.StatusCode.UNAVAILABLE)
        if (self.committed or self.attempts >= MAX_ATTEMPTS
                or not (engine_lost(exc) or refused) or time.monotonic() >= self.deadline):
            return False
        count_retry(self.metrics, "Generate", self.attempts, self._attempt_started)
        return True

    def cancel(self) -> None:
        if self.call is not None:
            self.call.cancel()



async def start(engine, request: generation_service_pb2.GenerateRequest, app_state,
                streamed: bool, relabel) -> tuple[GenerateCall, object]:
    """Open a generation for a route: (the call, its ResponseMetadata). An engine
    refusal is raised as the route's OpenAIError (`relabel` names its params)."""
    call = GenerateCall(engine, request, deadline_s(app_state.config, request), app_state.metrics,
                        streamed=streamed)
    try:
        first = await call.open()
    except grpc.aio.AioRpcError as exc:
        raise relabel(from_rpc_error(exc)) from None
    if first is grpc.aio.EOF or not first.HasField("metadata"):
        call.cancel()
        raise OpenAIError(500, "The engine ended the stream without metadata.",
                          type="server_error", code="internal_error")
    return call, first.metadata
