from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RerankRequest(_message.Message):
    __slots__ = ("model", "query", "documents", "top_n", "request_id")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    TOP_N_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    model: str
    query: str
    documents: _containers.RepeatedScalarFieldContainer[str]
    top_n: int
    request_id: str
    def __init__(self, model: _Optional[str] = ..., query: _Optional[str] = ..., documents: _Optional[_Iterable[str]] = ..., top_n: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class RerankResponse(_message.Message):
    __slots__ = ("results", "prompt_tokens", "model")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[RerankResult]
    prompt_tokens: int
    model: str
    def __init__(self, results: _Optional[_Iterable[_Union[RerankResult, _Mapping]]] = ..., prompt_tokens: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class RerankResult(_message.Message):
    __slots__ = ("index", "relevance_score")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    RELEVANCE_SCORE_FIELD_NUMBER: _ClassVar[int]
    index: int
    relevance_score: float
    def __init__(self, index: _Optional[int] = ..., relevance_score: _Optional[float] = ...) -> None: ...

class ClassifyRequest(_message.Message):
    __slots__ = ("model", "inputs", "probe", "labels", "request_id")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    model: str
    inputs: _containers.RepeatedScalarFieldContainer[str]
    probe: str
    labels: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    def __init__(self, model: _Optional[str] = ..., inputs: _Optional[_Iterable[str]] = ..., probe: _Optional[str] = ..., labels: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ClassifyResponse(_message.Message):
    __slots__ = ("data", "prompt_tokens", "model")
    DATA_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    data: _containers.RepeatedCompositeFieldContainer[Classification]
    prompt_tokens: int
    model: str
    def __init__(self, data: _Optional[_Iterable[_Union[Classification, _Mapping]]] = ..., prompt_tokens: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class Classification(_message.Message):
    __slots__ = ("index", "label", "probs", "score", "threshold")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    index: int
    label: str
    probs: _containers.RepeatedScalarFieldContainer[float]
    score: float
    threshold: float
    def __init__(self, index: _Optional[int] = ..., label: _Optional[str] = ..., probs: _Optional[_Iterable[float]] = ..., score: _Optional[float] = ..., threshold: _Optional[float] = ...) -> None: ...
