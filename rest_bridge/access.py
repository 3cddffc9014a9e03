"""Every HTTP request passes here first: request id, draining, API key and
scope, in-flight count, metrics and one JSON access-log line.

A pure ASGI middleware, so it sees streamed responses to their end. The key
the client presented and the request id are handed to the engine in gRPC
metadata (`call_metadata`), where the same key rules apply again; the key
itself is never logged, only its fingerprint.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import time
import uuid

from common import api_keys
from common.log_text import clipped
from rest_bridge.errors import SERVER_ERROR, OpenAIError, anthropic_dialect
from rest_bridge.metrics import BridgeMetrics, method_label, route_label

log = logging.getLogger("millm.access")

REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# What a key can be: the engine gets it as gRPC metadata, which must be
# printable ASCII and fit gRPC's metadata limit.
FORWARDABLE_KEY = re.compile(r"[\x21-\x7e]{1,1024}")
MESSAGES_PATH = "/v1/messages"  # Anthropic's Messages API and its sub-routes
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/health"})
QUIET_WHEN_OK = frozenset({"/healthz", "/readyz", "/health", "/metrics"})
# The console's static files carry no secret; its API calls carry the key.
CONSOLE_PREFIX = "/ui"


def is_open(path: str) -> bool:
    return path in OPEN_PATHS or path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/")


# Management routes need an admin key, except what a client reads to decide
# what to send.
INFERENCE_API = frozenset({"/api/capabilities"})


def needs_admin(path: str) -> bool:
    return (path.startswith("/api/") and path not in INFERENCE_API) or path == "/metrics"


# (("authorization", "Bearer …"), ("x-request-id", …)) for this request's engine calls.
call_metadata: contextvars.ContextVar[tuple] = contextvars.ContextVar("call_metadata",
                                                                      default=())
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")


class BridgeState:
    def __init__(self):
        self.draining = False
        self.in_flight = 0


def _header(headers: list, name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class AccessMiddleware:
    def __init__(self, app, keys: api_keys.KeyRing | None, state: BridgeState,
                 metrics: BridgeMetrics, max_header_bytes: int):
        self.app, self.keys, self.state, self.metrics = app, keys, state, metrics
        self.max_header_bytes = max_header_bytes

    def _refusal(self, method: str, path: str, presented: str | None,
                 header_bytes: int, url_bytes: int) -> tuple[OpenAIError | None, str]:
        if url_bytes > self.max_header_bytes:
            # (HTTP's parser refuses request lines past about 64 KiB itself.)
            return OpenAIError(414, f"The URL is longer than {self.max_header_bytes} bytes.",
                               code="url_too_long"), "-"
        if header_bytes > self.max_header_bytes:
            return OpenAIError(431, f"The request headers are larger than "
                               f"{self.max_header_bytes} bytes.",
                               code="request_headers_too_large"), "-"
        if is_open(path) or method == "OPTIONS":
            # (browser_guard.py answers every OPTIONS itself; no route runs.)
            return None, "-"
        if self.state.draining:
            return OpenAIError(503, "The server is shutting down; retry against another "
                               "instance.", type=SERVER_ERROR, code="draining",
                               headers={"Retry-After": "1"}), "-"
        if presented is not None and not FORWARDABLE_KEY.fullmatch(presented):
            return OpenAIError(401, "Invalid API key: a key is 1 to 1,024 printable ASCII "
                               "characters.", code="invalid_api_key"), "-"
        if self.keys is None:
            return None, "-"
        key = self.keys.identify(presented)
        if key is None:
            return OpenAIError(401, "Missing or invalid API key: send 'Authorization: Bearer "
                               "<key>' or 'X-API-Key: <key>'.", code="invalid_api_key"), "-"
        if needs_admin(path) and not key.allows(api_keys.ADMIN):
            return OpenAIError(403, f"{path} needs a key with the admin scope.",
                               type="permission_error", code="permission_error"), key.fingerprint
        return None, key.fingerprint

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers") or []
        sent_id = _header(headers, b"x-request-id")
        rid = sent_id if sent_id and REQUEST_ID.fullmatch(sent_id) else uuid.uuid4().hex
        path, method = scope["path"], scope["method"]
        # Anthropic's clients get Anthropic's error envelope, from here on.
        dialect = anthropic_dialect.set(
            path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")
            or _header(headers, b"anthropic-version") is not None)
        presented = (api_keys.bearer(_header(headers, b"authorization"))
                     or _header(headers, b"x-api-key"))
        started = time.perf_counter()
        seen = {"status": 500, "streaming": False, "first": None}

        async def tracked_send(message):
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                message["headers"] = [*message.get("headers", []),
                                      (b"x-request-id", rid.encode())]
                seen["streaming"] = any(k == b"content-type" and v.startswith(
                    b"text/event-stream") for k, v in message["headers"])
            elif (message["type"] == "http.response.body" and seen["first"] is None
                  and message.get("body")):
                seen["first"] = time.perf_counter()
            await send(message)

        header_bytes = sum(len(k) + len(v) for k, v in headers)
        url_bytes = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
        refusal, who = self._refusal(method, path, presented, header_bytes, url_bytes)
        code = None
        state = scope.setdefault("state", {})  # shared with the app's Request.state
        if refusal is not None:
            code = refusal.code
            await refusal.response()(scope, receive, tracked_send)
        else:
            metadata = (("x-request-id", rid),)
            if presented:
                metadata = (("authorization", f"Bearer {presented}"), *metadata)
            tokens = call_metadata.set(metadata), request_id.set(rid)
            self.state.in_flight += 1
            self.metrics.in_flight.inc()
            try:
                await self.app(scope, receive, tracked_send)
            finally:
                self.state.in_flight -= 1
                self.metrics.in_flight.dec()
                call_metadata.reset(tokens[0])
                request_id.reset(tokens[1])
            code = state.get("error_code")
        seen["failed"] = state.get("stream_failed", False)
        anthropic_dialect.reset(dialect)
        self._record(scope, path, method, seen, started, code, rid, who)

    def _record(self, scope, path, method, seen, started, code, rid, who) -> None:
        seconds = time.perf_counter() - started
        route, status = route_label(path), seen["status"]
        self.metrics.requests.labels(route, method_label(method), str(status), code or "").inc()
        self.metrics.seconds.labels(route).observe(seconds)
        if seen["streaming"] and seen["first"] is not None:
            self.metrics.first_token.labels(route).observe(seen["first"] - started)
        if seen["failed"]:
            # A stream that ended with an error event: its status was 200, its
            # outcome a failure.
            self.metrics.stream_failures.labels(route, code or "").inc()
        if status == 200 and path in QUIET_WHEN_OK:
            return
        client = scope.get("client")
        line = {
            "message": "request", "method": clipped(method, 16), "path": clipped(path),
            "status": status, "code": code, "duration_us": int(seconds * 1e6),
            "request_id": rid, "client": who, "remote_addr": client[0] if client else None,
            "timestamp": int(time.time() * 1000),
        }
        if seen["failed"]:
            line["outcome"] = "stream_failed"
        log.log(logging.WARNING if seen["failed"] else logging.INFO, json.dumps(line))
