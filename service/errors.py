"""The engine's one error type and its translation to a rich gRPC status.

Every refusal is an EngineError carrying the OpenAI error `code` (sent as
google.rpc.ErrorInfo.reason), the offending `param` and the OpenAI error
`type` (both in ErrorInfo.metadata). The REST bridge turns these back into the
OpenAI envelope through a single table, so a gRPC caller and an HTTP caller see
the same code and message.
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


@dataclass
class EngineError(Exception):
    """A refusal or failure that a caller should see as it is."""

    status: grpc.StatusCode
    code: str
    message: str
    param: str | None = None
    type: str = INVALID_REQUEST

    def __str__(self) -> str:
        return self.message

    def to_status(self) -> grpc.Status:
        info = error_details_pb2.ErrorInfo(reason=self.code, domain=ERROR_DOMAIN)
        info.metadata["type"] = self.type
        if self.param is not None:
            info.metadata["param"] = self.param
        detail = any_pb2.Any()
        detail.Pack(info)
        proto = status_pb2.Status(
            code=getattr(code_pb2, self.status.name), message=self.message, details=[detail]
        )
        return rpc_status.to_status(proto)


def invalid_parameter(param: str, message: str) -> EngineError:
    return EngineError(grpc.StatusCode.INVALID_ARGUMENT, "invalid_parameter", message, param)


def model_not_found(model: str) -> EngineError:
    return EngineError(
        grpc.StatusCode.NOT_FOUND,
        "model_not_found",
        f"The model '{model}' does not exist.",
        "model",
    )


def model_not_loaded(message: str) -> EngineError:
    return EngineError(
        grpc.StatusCode.UNAVAILABLE, "model_not_loaded", message, "model", SERVER_ERROR
    )


def context_length_exceeded(param: str, message: str) -> EngineError:
    return EngineError(grpc.StatusCode.INVALID_ARGUMENT, "context_length_exceeded", message, param)


def queue_full(limit: int) -> EngineError:
    return EngineError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "queue_full",
        f"The engine's request queue is full ({limit} waiting); retry shortly.",
        None,
        SERVER_ERROR,
    )


def internal_error() -> EngineError:
    # Never echo the exception text: it can carry prompt content or paths.
    return EngineError(
        grpc.StatusCode.INTERNAL,
        "internal_error",
        "The engine failed while processing the request; see the engine log.",
        None,
        SERVER_ERROR,
    )
