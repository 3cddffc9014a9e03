"""The engine's one error type, the table of every error code, and the
translation to a rich gRPC status.

Every refusal is an EngineError carrying the OpenAI error `code` (sent as
google.rpc.ErrorInfo.reason), the offending `param` and the OpenAI error
`type` (both in ErrorInfo.metadata), plus the HTTP status the code stands for
(metadata `http_status`). ERROR_CODES is the only place a code's gRPC status,
HTTP status and type are chosen: the REST bridge reads them from ErrorInfo, so
a gRPC caller and an HTTP caller see the same code and message, and a new
feature adds its codes here as rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

ERROR_DOMAIN = "millm.ai"

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"

_S = grpc.StatusCode


@dataclass(frozen=True)
class ErrorCode:
    status: grpc.StatusCode
    http_status: int
    type: str = INVALID_REQUEST


# Every code the engine answers with, including those of features still to be
# built (their rows are here so the mapping is complete from the start).
ERROR_CODES: dict[str, ErrorCode] = {
    # request validation
    "invalid_parameter": ErrorCode(_S.INVALID_ARGUMENT, 400),
    "field_not_honoured": ErrorCode(_S.INVALID_ARGUMENT, 400),
    "unused_fields_refused": ErrorCode(_S.INVALID_ARGUMENT, 400),
    "special_token_in_content": ErrorCode(_S.INVALID_ARGUMENT, 400),
    "context_length_exceeded": ErrorCode(_S.INVALID_ARGUMENT, 400),
    # models
    "model_not_found": ErrorCode(_S.NOT_FOUND, 404),
    # A bare GGUF repository name while it holds several quantizations (the
    # reference spells this code in capitals).
    "AMBIGUOUS_MODEL_NAME": ErrorCode(_S.INVALID_ARGUMENT, 400),
    "model_not_loaded": ErrorCode(_S.UNAVAILABLE, 503, SERVER_ERROR),
    "model_busy": ErrorCode(_S.UNAVAILABLE, 503, SERVER_ERROR),
    "model_load_failed": ErrorCode(_S.INTERNAL, 500, SERVER_ERROR),
    "unsupported_quantization": ErrorCode(_S.INVALID_ARGUMENT, 400),
    # a checkpoint whose architecture the engine cannot run (not a causal LM,
    # or a cache the batch cannot hold): refused at load, never per request
    "unsupported_architecture": ErrorCode(_S.INVALID_ARGUMENT, 400),
    "insufficient_memory": ErrorCode(_S.RESOURCE_EXHAUSTED, 503),
    # backpressure: the server's state, not the caller's rate, hence 503
    "queue_full": ErrorCode(_S.RESOURCE_EXHAUSTED, 503, SERVER_ERROR),
    # scoring and structured output
    "invalid_scoring_request": ErrorCode(_S.INVALID_ARGUMENT, 400),
    "non_finite_logits": ErrorCode(_S.INTERNAL, 500, SERVER_ERROR),
    "no_chat_template": ErrorCode(_S.INVALID_ARGUMENT, 400),
    "response_format_unsupported": ErrorCode(_S.INVALID_ARGUMENT, 400),
    "constrained_output_invalid": ErrorCode(_S.INTERNAL, 500, SERVER_ERROR),
    # steering
    "profile_not_found": ErrorCode(_S.NOT_FOUND, 404),
    "invalid_feature_index": ErrorCode(_S.INVALID_ARGUMENT, 400),
    "invalid_steering_mode": ErrorCode(_S.INVALID_ARGUMENT, 400),
    "invalid_steering_condition": ErrorCode(_S.INVALID_ARGUMENT, 400),
    "cluster_not_found": ErrorCode(_S.NOT_FOUND, 404),
    "circuit_not_found": ErrorCode(_S.NOT_FOUND, 404),
    "sae_not_found": ErrorCode(_S.NOT_FOUND, 404),
    "invalid_sae": ErrorCode(_S.FAILED_PRECONDITION, 400),
    "sae_mismatch": ErrorCode(_S.FAILED_PRECONDITION, 400),
    # llama.cpp control vectors (steering/control_vectors.py)
    "control_vector_not_found": ErrorCode(_S.NOT_FOUND, 404),
    "invalid_control_vector": ErrorCode(_S.FAILED_PRECONDITION, 400),
    "control_vector_mismatch": ErrorCode(_S.FAILED_PRECONDITION, 400),
    "steering_unavailable": ErrorCode(_S.FAILED_PRECONDITION, 400),
    # vectors from examples (steering/vector_builds.py): one build at a time
    # per replica; a build cancelled or out of time saves nothing
    "vector_build_busy": ErrorCode(_S.ABORTED, 409),
    "vector_build_stopped": ErrorCode(_S.ABORTED, 409),
    "invalid_document": ErrorCode(_S.INVALID_ARGUMENT, 400),
    "already_exists": ErrorCode(_S.ALREADY_EXISTS, 409),
    "probe_not_found": ErrorCode(_S.NOT_FOUND, 404),
    # stored responses (ResponseService): unknown, expired, deleted or another key's
    "response_not_found": ErrorCode(_S.NOT_FOUND, 404),
    # files and batches (service/batches)
    "file_not_found": ErrorCode(_S.NOT_FOUND, 404),
    "batch_not_found": ErrorCode(_S.NOT_FOUND, 404),
    "file_too_large": ErrorCode(_S.INVALID_ARGUMENT, 413),
    "batch_not_cancellable": ErrorCode(_S.FAILED_PRECONDITION, 400),
    "duplicate_custom_id": ErrorCode(_S.INVALID_ARGUMENT, 400),
    # access
    "invalid_api_key": ErrorCode(_S.UNAUTHENTICATED, 401),
    "permission_error": ErrorCode(_S.PERMISSION_DENIED, 403, "permission_error"),
    "rate_limit_exceeded": ErrorCode(_S.RESOURCE_EXHAUSTED, 429, "requests"),
    "draining": ErrorCode(_S.UNAVAILABLE, 503, SERVER_ERROR),
    # failures
    "internal_error": ErrorCode(_S.INTERNAL, 500, SERVER_ERROR),
    # the model thread failed in shared batch state (a reset follows) or died
    # (the engine stops serving and exits for its supervisor to restart it)
    "engine_failure": ErrorCode(_S.UNAVAILABLE, 503, SERVER_ERROR),
    # a durable write failed (disk full, I/O error); nothing changed, retry later
    "state_store_unavailable": ErrorCode(_S.UNAVAILABLE, 503, SERVER_ERROR),
}


# In UTF-8 bytes, not characters: gRPC percent-encodes each non-ASCII byte of
# the message (three bytes on the wire) and sends message and param again in
# the base64 ErrorInfo, so 1,024 emoji would outgrow the 8 KiB trailer limit.
MAX_MESSAGE_BYTES = 1024
MAX_PARAM_BYTES = 256
_TRUNCATED = "… (truncated)"


def _bounded(text: str, limit: int) -> str:
    encoded = text.encode("utf-8", "replace")  # no unpaired surrogate survives
    if len(encoded) <= limit:
        return encoded.decode("utf-8")
    room = limit - len(_TRUNCATED.encode())
    return encoded[:room].decode("utf-8", "ignore") + _TRUNCATED


@dataclass
class EngineError(Exception):
    """A refusal or failure that a caller should see as it is."""

    code: str
    message: str
    param: str | None = None
    # More ErrorInfo metadata (a rate limit's retry_after_s, limit, remaining, reset_s).
    details: dict | None = None

    def __post_init__(self) -> None:
        if self.code not in ERROR_CODES:
            raise ValueError(f"error code {self.code!r} is not in ERROR_CODES")
        # Messages and params can quote what a client sent (a model name, a
        # profile, every unused field): bounded, so the status always fits
        # gRPC's trailer and a huge input can never turn a 400 into a 500.
        self.message = _bounded(self.message, MAX_MESSAGE_BYTES)
        if self.param is not None:
            self.param = _bounded(self.param, MAX_PARAM_BYTES)

    def __str__(self) -> str:
        return self.message

    @property
    def status(self) -> grpc.StatusCode:
        return ERROR_CODES[self.code].status

    @property
    def type(self) -> str:
        return ERROR_CODES[self.code].type

    def to_status(self) -> grpc.Status:
        entry = ERROR_CODES[self.code]
        info = error_details_pb2.ErrorInfo(reason=self.code, domain=ERROR_DOMAIN)
        info.metadata["type"] = entry.type
        info.metadata["http_status"] = str(entry.http_status)
        if self.param is not None:
            info.metadata["param"] = self.param
        for key, value in (self.details or {}).items():
            info.metadata[key] = str(value)
        detail = any_pb2.Any()
        detail.Pack(info)
        proto = status_pb2.Status(
            code=getattr(code_pb2, entry.status.name), message=self.message, details=[detail]
        )
        return rpc_status.to_status(proto)


def invalid_parameter(param: str, message: str) -> EngineError:
    return EngineError("invalid_parameter", message, param)


def field_not_honoured(param: str, message: str) -> EngineError:
    return EngineError("field_not_honoured", message, param)


def unused_fields_refused(locations: list[str]) -> EngineError:
    return EngineError(
        "unused_fields_refused",
        "Strict mode: the request has fields that would go unused: "
        + ", ".join(locations) + ".",
        locations[0],
    )


def special_token_in_content(param: str, token: str) -> EngineError:
    return EngineError(
        "special_token_in_content",
        f"'{param}' contains the text of the special token {token!r}; message text may not "
        "spell the model's control tokens.",
        param,
    )


def model_not_found(model: str) -> EngineError:
    return EngineError("model_not_found", f"The model '{model}' does not exist.", "model")


def model_not_loaded(message: str) -> EngineError:
    return EngineError("model_not_loaded", message, "model")


def model_busy(message: str) -> EngineError:
    # Retry-After reaches HTTP clients through the bridge's error mapping.
    return EngineError("model_busy", message, "model", details={"retry_after_s": 1})


def context_length_exceeded(param: str, message: str) -> EngineError:
    return EngineError("context_length_exceeded", message, param)


def queue_full(limit: int) -> EngineError:
    return EngineError(
        "queue_full", f"The engine's request queue is full ({limit} waiting); retry shortly."
    )


def internal_error() -> EngineError:
    # Never echo the exception text: it can carry prompt content or paths.
    return EngineError(
        "internal_error", "The engine failed while processing the request; see the engine log."
    )


def engine_failure(message: str) -> EngineError:
    return EngineError("engine_failure", message)


def batch_reset() -> EngineError:
    """A step of the shared batch failed: its rows' requests fail, the engine goes on."""
    return engine_failure("The engine's running batch failed and was reset; retry the request.")


def thread_died() -> EngineError:
    """The model thread is gone: the engine stops and its supervisor restarts it."""
    return engine_failure("The engine's model thread stopped; it is restarting. Retry shortly.")


def store_unavailable(exc: BaseException) -> EngineError:
    # The class only: SQLite's text can quote paths.
    return EngineError("state_store_unavailable", "The engine could not save this change "
                       f"({type(exc).__name__}); nothing was changed. Retry later.")
