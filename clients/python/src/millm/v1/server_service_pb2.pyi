from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ClearPrefixCacheRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClearPrefixCacheResponse(_message.Message):
    __slots__ = ("tokens_freed",)
    TOKENS_FREED_FIELD_NUMBER: _ClassVar[int]
    tokens_freed: int
    def __init__(self, tokens_freed: _Optional[int] = ...) -> None: ...

class GetInferenceStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetInferenceStatusResponse(_message.Message):
    __slots__ = ("backend", "model", "active_generations", "queued_requests", "generated_tokens_total", "completed_generations_total", "cancelled_generations_total", "failed_generations_total", "running_rows", "lanes", "max_batch", "max_queued", "kv_tokens_in_use", "kv_padding_tokens", "prefix_cache_tokens", "prefix_cache_hit_tokens_total")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_GENERATIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_GENERATIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    FAILED_GENERATIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RUNNING_ROWS_FIELD_NUMBER: _ClassVar[int]
    LANES_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUED_FIELD_NUMBER: _ClassVar[int]
    KV_TOKENS_IN_USE_FIELD_NUMBER: _ClassVar[int]
    KV_PADDING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HIT_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    backend: str
    model: str
    active_generations: int
    queued_requests: int
    generated_tokens_total: int
    completed_generations_total: int
    cancelled_generations_total: int
    failed_generations_total: int
    running_rows: int
    lanes: int
    max_batch: int
    max_queued: int
    kv_tokens_in_use: int
    kv_padding_tokens: int
    prefix_cache_tokens: int
    prefix_cache_hit_tokens_total: int
    def __init__(self, backend: _Optional[str] = ..., model: _Optional[str] = ..., active_generations: _Optional[int] = ..., queued_requests: _Optional[int] = ..., generated_tokens_total: _Optional[int] = ..., completed_generations_total: _Optional[int] = ..., cancelled_generations_total: _Optional[int] = ..., failed_generations_total: _Optional[int] = ..., running_rows: _Optional[int] = ..., lanes: _Optional[int] = ..., max_batch: _Optional[int] = ..., max_queued: _Optional[int] = ..., kv_tokens_in_use: _Optional[int] = ..., kv_padding_tokens: _Optional[int] = ..., prefix_cache_tokens: _Optional[int] = ..., prefix_cache_hit_tokens_total: _Optional[int] = ...) -> None: ...
