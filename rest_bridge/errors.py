"""OpenAI error envelopes, and the one table from engine statuses to HTTP.

The engine sends a gRPC status whose google.rpc.ErrorInfo carries the OpenAI
code as `reason` and `param`, `type` and `http_status` as metadata: the
engine's table of error codes (service/errors.py ERROR_CODES) decides a code's
HTTP status, and `from_rpc_error` reads it back. STATUS_TO_HTTP maps the gRPC
status only when an ErrorInfo lacks `http_status`. A status with no ErrorInfo
at all (the engine unreachable, a deadline passed, gRPC's own size limits, a
failure below the engine's handlers) becomes engine_unavailable (503),
engine_timeout (504), request_too_large (413) or internal_error (500).

The same errors take Anthropic's envelope on the Messages API (and on any
request that carries `anthropic-version`): `anthropic_dialect` is set per
request by the access middleware, and `OpenAIError.response()` reads it, so
every refusal (a key, a body, the engine) reaches an Anthropic client in
the shape its SDK parses, with Anthropic's error type for the status.
"""

from __future__ import annotations

import contextvars

import grpc
from fastapi.responses import JSONResponse
from google.rpc import error_details_pb2, status_pb2

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"

STATUS_TO_HTTP: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}

# The bounds docs/operations.md gives error messages and params, the engine's too.
MAX_MESSAGE_BYTES = 1024
MAX_PARAM_BYTES = 256
_TRUNCATED = "… (truncated)"


def bounded(text: str, limit: int) -> str:
    """`text` in at most `limit` UTF-8 bytes, cut with "… (truncated)"."""
    encoded = text.encode("utf-8", "replace")  # no unpaired surrogate survives
    if len(encoded) <= limit:
        return encoded.decode("utf-8")
    room = limit - len(_TRUNCATED.encode())
    return encoded[:room].decode("utf-8", "ignore") + _TRUNCATED


# Whether this request's errors take Anthropic's envelope (rest_bridge/access.py).
anthropic_dialect: contextvars.ContextVar[bool] = contextvars.ContextVar("anthropic_dialect",
                                                                        default=False)
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                   403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                   429: "rate_limit_error", 504: "timeout_error", 529: "overloaded_error"}
# Anthropic's status for an engine whose queue is full (its SDKs retry it).
OVERLOADED_STATUS = 529
OVERLOADED_CODES = frozenset({"queue_full"})


# A 503 is temporary by definition: tell clients (the OpenAI SDKs honour it) when to retry.
RETRY_SOON = {"Retry-After": "1"}


class OpenAIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers or {}
        super().__init__(self.message)

    # Messages and params can quote what a client sent (a field's value, a
    # name): bounded as the engine bounds its own, however they are set.
    @property
    def message(self) -> str:
        return self._message

    @message.setter
    def message(self, value: str) -> None:
        self._message = bounded(value, MAX_MESSAGE_BYTES)

    @property
    def param(self) -> str | None:
        return self._param

    @param.setter
    def param(self, value: str | None) -> None:
        self._param = None if value is None else bounded(value, MAX_PARAM_BYTES)

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def anthropic_status(self) -> int:
        return OVERLOADED_STATUS if self.code in OVERLOADED_CODES else self.status

    def anthropic_body(self) -> dict:
        """Anthropic's envelope: its error type for the status; the message
        names the field, as in the OpenAI one."""
        status = self.anthropic_status()
        kind = ANTHROPIC_TYPES.get(status)
        if kind is None:
            kind = "api_error" if status >= 500 else "invalid_request_error"
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def response(self) -> JSONResponse:
        if anthropic_dialect.get():
            return JSONResponse(self.anthropic_body(), status_code=self.anthropic_status(),
                                headers=self.headers)
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _error_info(error: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo | None:
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    return info
    return None


def engine_lost(error: grpc.aio.AioRpcError) -> bool:
    """UNAVAILABLE without ErrorInfo: the engine vanished (killed, connection
    dropped) rather than refused; the call may be tried on another engine."""
    return error.code() == grpc.StatusCode.UNAVAILABLE and _error_info(error) is None


def from_rpc_error(error: grpc.aio.AioRpcError) -> OpenAIError:
    code = error.code()
    info = _error_info(error)
    if info is None:
        # No ErrorInfo: the engine is unreachable or failed below our handlers.
        if code == grpc.StatusCode.UNAVAILABLE:
            return OpenAIError(
                503, "The inference engine is unavailable; retry shortly.",
                type=SERVER_ERROR, code="engine_unavailable", headers=RETRY_SOON,
            )
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return OpenAIError(504, "The inference engine did not answer in time.",
                               type=SERVER_ERROR, code="engine_timeout")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            # gRPC's own size limits (common/grpc_limits.py): the request, or
            # the answer it asked for, is larger than a message may be.
            return OpenAIError(413, "The request or its answer is larger than the engine's "
                               "message limit.", code="request_too_large")
        return OpenAIError(500, "The inference engine failed; see the engine log.",
                           type=SERVER_ERROR, code="internal_error")
    declared = info.metadata.get("http_status", "")
    status = int(declared) if declared.isdigit() else STATUS_TO_HTTP.get(code, 500)
    headers = dict(RETRY_SOON) if status == 503 else {}
    if "retry_after_s" in info.metadata:
        headers["Retry-After"] = info.metadata["retry_after_s"]
    if "limit" in info.metadata:  # a rate limit: OpenAI's x-ratelimit-* headers
        headers["x-ratelimit-limit-requests"] = info.metadata["limit"]
        headers["x-ratelimit-remaining-requests"] = info.metadata.get("remaining", "0")
        headers["x-ratelimit-reset-requests"] = f"{info.metadata.get('reset_s', '0')}s"
    return OpenAIError(
        status,
        error.details() or info.reason,
        type=info.metadata.get("type", INVALID_REQUEST if status < 500 else SERVER_ERROR),
        param=info.metadata.get("param") or None,
        code=info.reason,
        headers=headers,
    )
