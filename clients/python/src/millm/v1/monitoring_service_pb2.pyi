from millm.v1 import monitoring_pb2 as _monitoring_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Probe(_message.Message):
    __slots__ = ("name", "description", "sae_id", "layer", "features", "threshold", "reading", "reason", "created")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SAE_ID_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    READING_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    sae_id: str
    layer: int
    features: _containers.RepeatedCompositeFieldContainer[_monitoring_pb2.ProbeFeature]
    threshold: float
    reading: bool
    reason: str
    created: int
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., sae_id: _Optional[str] = ..., layer: _Optional[int] = ..., features: _Optional[_Iterable[_Union[_monitoring_pb2.ProbeFeature, _Mapping]]] = ..., threshold: _Optional[float] = ..., reading: _Optional[bool] = ..., reason: _Optional[str] = ..., created: _Optional[int] = ...) -> None: ...

class ListProbesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListProbesResponse(_message.Message):
    __slots__ = ("probes",)
    PROBES_FIELD_NUMBER: _ClassVar[int]
    probes: _containers.RepeatedCompositeFieldContainer[Probe]
    def __init__(self, probes: _Optional[_Iterable[_Union[Probe, _Mapping]]] = ...) -> None: ...

class CreateProbeRequest(_message.Message):
    __slots__ = ("name", "description", "sae_id", "layer", "features", "feature", "threshold")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SAE_ID_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    FEATURE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    sae_id: str
    layer: int
    features: _containers.RepeatedCompositeFieldContainer[_monitoring_pb2.ProbeFeature]
    feature: int
    threshold: float
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., sae_id: _Optional[str] = ..., layer: _Optional[int] = ..., features: _Optional[_Iterable[_Union[_monitoring_pb2.ProbeFeature, _Mapping]]] = ..., feature: _Optional[int] = ..., threshold: _Optional[float] = ...) -> None: ...

class CreateProbeResponse(_message.Message):
    __slots__ = ("probe",)
    PROBE_FIELD_NUMBER: _ClassVar[int]
    probe: Probe
    def __init__(self, probe: _Optional[_Union[Probe, _Mapping]] = ...) -> None: ...

class DeleteProbeRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteProbeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetMonitoringRequest(_message.Message):
    __slots__ = ("model", "enabled", "keep_contexts")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    KEEP_CONTEXTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    enabled: bool
    keep_contexts: bool
    def __init__(self, model: _Optional[str] = ..., enabled: _Optional[bool] = ..., keep_contexts: _Optional[bool] = ...) -> None: ...

class SetMonitoringResponse(_message.Message):
    __slots__ = ("monitoring",)
    MONITORING_FIELD_NUMBER: _ClassVar[int]
    monitoring: MonitoringState
    def __init__(self, monitoring: _Optional[_Union[MonitoringState, _Mapping]] = ...) -> None: ...

class GetMonitoringRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class GetMonitoringResponse(_message.Message):
    __slots__ = ("monitoring",)
    MONITORING_FIELD_NUMBER: _ClassVar[int]
    monitoring: MonitoringState
    def __init__(self, monitoring: _Optional[_Union[MonitoringState, _Mapping]] = ...) -> None: ...

class ProbeStats(_message.Message):
    __slots__ = ("probe", "requests", "fired", "hit_rate", "total_requests", "total_fired")
    PROBE_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    FIRED_FIELD_NUMBER: _ClassVar[int]
    HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIRED_FIELD_NUMBER: _ClassVar[int]
    probe: str
    requests: int
    fired: int
    hit_rate: float
    total_requests: int
    total_fired: int
    def __init__(self, probe: _Optional[str] = ..., requests: _Optional[int] = ..., fired: _Optional[int] = ..., hit_rate: _Optional[float] = ..., total_requests: _Optional[int] = ..., total_fired: _Optional[int] = ...) -> None: ...

class FeatureFrequency(_message.Message):
    __slots__ = ("sae_id", "layer", "index", "tokens", "frequency")
    SAE_ID_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_FIELD_NUMBER: _ClassVar[int]
    sae_id: str
    layer: int
    index: int
    tokens: int
    frequency: float
    def __init__(self, sae_id: _Optional[str] = ..., layer: _Optional[int] = ..., index: _Optional[int] = ..., tokens: _Optional[int] = ..., frequency: _Optional[float] = ...) -> None: ...

class MonitoringState(_message.Message):
    __slots__ = ("model", "enabled", "active", "reason", "probes", "window_requests", "total_requests", "probe_stats", "feature_frequencies", "keep_contexts")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PROBES_FIELD_NUMBER: _ClassVar[int]
    WINDOW_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PROBE_STATS_FIELD_NUMBER: _ClassVar[int]
    FEATURE_FREQUENCIES_FIELD_NUMBER: _ClassVar[int]
    KEEP_CONTEXTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    enabled: bool
    active: bool
    reason: str
    probes: _containers.RepeatedCompositeFieldContainer[Probe]
    window_requests: int
    total_requests: int
    probe_stats: _containers.RepeatedCompositeFieldContainer[ProbeStats]
    feature_frequencies: _containers.RepeatedCompositeFieldContainer[FeatureFrequency]
    keep_contexts: bool
    def __init__(self, model: _Optional[str] = ..., enabled: _Optional[bool] = ..., active: _Optional[bool] = ..., reason: _Optional[str] = ..., probes: _Optional[_Iterable[_Union[Probe, _Mapping]]] = ..., window_requests: _Optional[int] = ..., total_requests: _Optional[int] = ..., probe_stats: _Optional[_Iterable[_Union[ProbeStats, _Mapping]]] = ..., feature_frequencies: _Optional[_Iterable[_Union[FeatureFrequency, _Mapping]]] = ..., keep_contexts: _Optional[bool] = ...) -> None: ...
