"""Who may call what: the engine's one server interceptor, and the rules it
applies (`Access`), which GenerateMany applies again to each call it starts.

For every RPC except health checks, reflection, load reports and the
GenerateMany carrier stream it (1) refuses new work
while the engine drains, (2) checks the API key in `authorization: Bearer`
metadata when keys are configured, and its scope (`admin` for the mutating
RPCs), (3) applies the key's rate limit, and (4) counts the call in flight,
records it in the metrics and writes one JSON access-log line carrying the
request id (`x-request-id` metadata) and the key's fingerprint, never the key.
Streaming RPCs are wrapped the same way as unary ones.
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import time

import grpc

from common import api_keys
from common.log_text import clipped
from service.errors import EngineError
from service.rate_limit import RateLimiter
from service.servicers import monitoring, steering

log = logging.getLogger("millm.access")

# Health checks, reflection and load reports need no key, are served while
# draining (they report it) and are not calls the drain waits for.
EXEMPT_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.",
                   "/millm.v1.ServerService/WatchLoad",
                   # The stream is a carrier: each call it starts is checked.
                   "/millm.v1.GenerationService/GenerateMany")
# RPCs that change the server's state need an admin key.
ADMIN_METHODS = frozenset({"/millm.v1.ServerService/ClearPrefixCache",
                           "/millm.v1.ModelService/LoadModel",
                           "/millm.v1.ModelService/UnloadModel"}) | steering.ADMIN_METHODS \
    | monitoring.ADMIN_METHODS | frozenset({
        # A batch runner's calls hand out and record every owner's lines.
        "/millm.v1.BatchService/ClaimBatchLines", "/millm.v1.BatchService/RenewBatchClaims",
        "/millm.v1.BatchService/CompleteBatchLines"})


# The key of the call being served (None when no keys are configured), for the
# services whose data belongs to a key (ResponseService).
caller: contextvars.ContextVar[api_keys.ApiKey | None] = contextvars.ContextVar(
    "caller", default=None)


class DrainState:
    def __init__(self):
        self.draining = False
        self.in_flight = 0


def _refuse(error: EngineError):
    status = error.to_status()

    async def abort(context):
        await context.abort(status.code, status.details, status.trailing_metadata)

    return abort


class Access:
    """The per-call rules, in one place: the interceptor applies them to every
    call, and GenerateMany (servicers/generation_mux.py) to each call it
    starts, with the metadata that call would carry."""

    def __init__(self, keys: api_keys.KeyRing | None, drain: DrainState, metrics=None,
                 limiter: RateLimiter | None = None):
        self.keys, self.drain, self.metrics = keys, drain, metrics
        self.limiter = limiter or RateLimiter()

    def check(self, method: str,
              metadata: dict) -> tuple[EngineError | None, api_keys.ApiKey | None]:
        """(refusal or None, the caller's key or None)."""
        if self.drain.draining:
            return EngineError("draining", "The engine is shutting down; retry against another "
                               "instance.", details={"retry_after_s": 1}), None
        if self.keys is None:
            return None, None
        key = self.keys.identify(api_keys.bearer(metadata.get("authorization")))
        if key is None:
            return EngineError("invalid_api_key", "Missing or invalid API key: send "
                               "'authorization: Bearer <key>' metadata."), None
        if method in ADMIN_METHODS and not key.allows(api_keys.ADMIN):
            return EngineError("permission_error", "This call needs a key with the admin "
                               "scope."), key
        decision = self.limiter.check(key.name, key.requests_per_minute)
        if decision is not None and not decision.allowed:
            return EngineError(
                "rate_limit_exceeded",
                f"Rate limit of {decision.limit} requests per minute reached for this key.",
                details={"retry_after_s": max(1, math.ceil(decision.retry_after_s)),
                         "limit": decision.limit, "remaining": decision.remaining,
                         "reset_s": round(decision.reset_s, 3)}), key
        return None, key

    def begin(self, key: api_keys.ApiKey | None) -> float:
        """A call starts: counted in flight (the drain waits for it), its key
        set for the task that serves it. Returns its start time."""
        self.drain.in_flight += 1
        caller.set(key)
        return time.perf_counter()

    def end(self, method: str, started: float, code: str, request_id: str,
            key: api_keys.ApiKey | None) -> None:
        """A call ended with `code`: metrics and one access-log line."""
        self.drain.in_flight -= 1
        seconds = time.perf_counter() - started
        if self.metrics is not None:
            self.metrics.rpc_done(method, code, seconds)
        log.info(json.dumps({"message": "rpc", "method": method, "code": code,
                             "duration_us": int(seconds * 1e6),
                             "request_id": clipped(request_id),
                             "client": key.fingerprint if key is not None else "-"}))


class AccessInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, access: Access):
        self.access = access

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        method = details.method
        if handler is None or method.startswith(EXEMPT_PREFIXES):
            return handler
        metadata = {k: v for k, v in (details.invocation_metadata or ())}
        refusal, key = self.access.check(method, metadata)
        request_id = metadata.get("x-request-id", "-")
        access = self.access

        def begin():
            return access.begin(key)  # the handler runs in this task, so it reads this key

        def end(started: float, context) -> None:
            access.end(method, started, _code_name(context, refusal), request_id, key)

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request, context):
                started = begin()
                try:
                    if refusal is not None:
                        await _refuse(refusal)(context)
                    return await inner(request, context)
                finally:
                    end(started, context)

            return grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(request, context):
                # A coroutine that writes, not a generator that re-yields: grpc
                # then iterates the servicer's generator once, without an extra
                # async-generator hop per streamed message.
                started = begin()
                try:
                    if refusal is not None:
                        await _refuse(refusal)(context)
                    async for response in inner_stream(request, context):
                        await context.write(response)
                finally:
                    end(started, context)

            return grpc.unary_stream_rpc_method_handler(
                stream, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        return handler  # the one client-streaming RPC, GenerateMany, is exempt


def _code_name(context, refusal: EngineError | None) -> str:
    if refusal is not None:
        return refusal.status.name
    try:
        if context.cancelled():
            return "CANCELLED"
        code = context.code()
    except Exception:  # noqa: BLE001 - older grpc.aio contexts have no code()
        code = None
    if code is None or code == 0:
        return "OK"
    return code.name if isinstance(code, grpc.StatusCode) else str(code)
