from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_STATE_UNSPECIFIED: _ClassVar[ModelState]
    MODEL_STATE_READY: _ClassVar[ModelState]
    MODEL_STATE_LOADING: _ClassVar[ModelState]
    MODEL_STATE_LOADED: _ClassVar[ModelState]
    MODEL_STATE_UNLOADING: _ClassVar[ModelState]
    MODEL_STATE_FAILED: _ClassVar[ModelState]
MODEL_STATE_UNSPECIFIED: ModelState
MODEL_STATE_READY: ModelState
MODEL_STATE_LOADING: ModelState
MODEL_STATE_LOADED: ModelState
MODEL_STATE_UNLOADING: ModelState
MODEL_STATE_FAILED: ModelState

class Model(_message.Message):
    __slots__ = ("id", "created", "owned_by", "state", "engine", "context_window", "system_fingerprint", "repo", "quantization", "size_bytes", "error", "locked_out")
    ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    OWNED_BY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    REPO_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LOCKED_OUT_FIELD_NUMBER: _ClassVar[int]
    id: str
    created: int
    owned_by: str
    state: ModelState
    engine: str
    context_window: int
    system_fingerprint: str
    repo: str
    quantization: str
    size_bytes: int
    error: str
    locked_out: bool
    def __init__(self, id: _Optional[str] = ..., created: _Optional[int] = ..., owned_by: _Optional[str] = ..., state: _Optional[_Union[ModelState, str]] = ..., engine: _Optional[str] = ..., context_window: _Optional[int] = ..., system_fingerprint: _Optional[str] = ..., repo: _Optional[str] = ..., quantization: _Optional[str] = ..., size_bytes: _Optional[int] = ..., error: _Optional[str] = ..., locked_out: _Optional[bool] = ...) -> None: ...
