from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class GetInferenceStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetInferenceStatusResponse(_message.Message):
    __slots__ = ("backend", "model", "active_generations", "queued_requests", "generated_tokens_total", "completed_generations_total", "cancelled_generations_total")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_GENERATIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_GENERATIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    backend: str
    model: str
    active_generations: int
    queued_requests: int
    generated_tokens_total: int
    completed_generations_total: int
    cancelled_generations_total: int
    def __init__(self, backend: _Optional[str] = ..., model: _Optional[str] = ..., active_generations: _Optional[int] = ..., queued_requests: _Optional[int] = ..., generated_tokens_total: _Optional[int] = ..., completed_generations_total: _Optional[int] = ..., cancelled_generations_total: _Optional[int] = ...) -> None: ...
