from millm.v1 import generation_pb2 as _generation_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplicaState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLICA_STATE_UNSPECIFIED: _ClassVar[ReplicaState]
    REPLICA_STATE_STARTING: _ClassVar[ReplicaState]
    REPLICA_STATE_SERVING: _ClassVar[ReplicaState]
    REPLICA_STATE_SWITCHING: _ClassVar[ReplicaState]
    REPLICA_STATE_DRAINING: _ClassVar[ReplicaState]
REPLICA_STATE_UNSPECIFIED: ReplicaState
REPLICA_STATE_STARTING: ReplicaState
REPLICA_STATE_SERVING: ReplicaState
REPLICA_STATE_SWITCHING: ReplicaState
REPLICA_STATE_DRAINING: ReplicaState

class GetCapabilitiesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetCapabilitiesResponse(_message.Message):
    __slots__ = ("model", "engine", "context_window", "vocab_size", "system_fingerprint", "versions", "features", "fields")
    class VersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_WINDOW_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    engine: str
    context_window: int
    vocab_size: int
    system_fingerprint: str
    versions: _containers.ScalarMap[str, str]
    features: Features
    fields: _containers.RepeatedCompositeFieldContainer[FieldSupport]
    def __init__(self, model: _Optional[str] = ..., engine: _Optional[str] = ..., context_window: _Optional[int] = ..., vocab_size: _Optional[int] = ..., system_fingerprint: _Optional[str] = ..., versions: _Optional[_Mapping[str, str]] = ..., features: _Optional[_Union[Features, _Mapping]] = ..., fields: _Optional[_Iterable[_Union[FieldSupport, _Mapping]]] = ...) -> None: ...

class Features(_message.Message):
    __slots__ = ("scoring", "logprobs", "max_logprobs", "structured_output", "embeddings", "steering", "attached_saes", "seed_scope", "max_batch", "tokenization")
    SCORING_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    MAX_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    STEERING_FIELD_NUMBER: _ClassVar[int]
    ATTACHED_SAES_FIELD_NUMBER: _ClassVar[int]
    SEED_SCOPE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    TOKENIZATION_FIELD_NUMBER: _ClassVar[int]
    scoring: bool
    logprobs: bool
    max_logprobs: int
    structured_output: bool
    embeddings: bool
    steering: bool
    attached_saes: _containers.RepeatedScalarFieldContainer[str]
    seed_scope: _generation_pb2.SeedScope
    max_batch: int
    tokenization: bool
    def __init__(self, scoring: _Optional[bool] = ..., logprobs: _Optional[bool] = ..., max_logprobs: _Optional[int] = ..., structured_output: _Optional[bool] = ..., embeddings: _Optional[bool] = ..., steering: _Optional[bool] = ..., attached_saes: _Optional[_Iterable[str]] = ..., seed_scope: _Optional[_Union[_generation_pb2.SeedScope, str]] = ..., max_batch: _Optional[int] = ..., tokenization: _Optional[bool] = ...) -> None: ...

class FieldSupport(_message.Message):
    __slots__ = ("field", "route", "honoured", "refusal_code", "reason", "reported")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    HONOURED_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REPORTED_FIELD_NUMBER: _ClassVar[int]
    field: str
    route: str
    honoured: bool
    refusal_code: str
    reason: str
    reported: bool
    def __init__(self, field: _Optional[str] = ..., route: _Optional[str] = ..., honoured: _Optional[bool] = ..., refusal_code: _Optional[str] = ..., reason: _Optional[str] = ..., reported: _Optional[bool] = ...) -> None: ...

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

class WatchLoadRequest(_message.Message):
    __slots__ = ("interval_ms",)
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    interval_ms: int
    def __init__(self, interval_ms: _Optional[int] = ...) -> None: ...

class WatchLoadResponse(_message.Message):
    __slots__ = ("replica_id", "state", "model", "model_names", "running_requests", "waiting_requests", "running_rows", "max_batch", "kv_cache_utilization")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAMES_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_ROWS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    state: ReplicaState
    model: str
    model_names: _containers.RepeatedScalarFieldContainer[str]
    running_requests: int
    waiting_requests: int
    running_rows: int
    max_batch: int
    kv_cache_utilization: float
    def __init__(self, replica_id: _Optional[str] = ..., state: _Optional[_Union[ReplicaState, str]] = ..., model: _Optional[str] = ..., model_names: _Optional[_Iterable[str]] = ..., running_requests: _Optional[int] = ..., waiting_requests: _Optional[int] = ..., running_rows: _Optional[int] = ..., max_batch: _Optional[int] = ..., kv_cache_utilization: _Optional[float] = ...) -> None: ...
