from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProbeFeature(_message.Message):
    __slots__ = ("index", "weight")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    index: int
    weight: float
    def __init__(self, index: _Optional[int] = ..., weight: _Optional[float] = ...) -> None: ...

class ProbeVerdict(_message.Message):
    __slots__ = ("probe", "sae_id", "layer", "fired", "peak", "first_position", "positions_read", "threshold")
    PROBE_FIELD_NUMBER: _ClassVar[int]
    SAE_ID_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    FIRED_FIELD_NUMBER: _ClassVar[int]
    PEAK_FIELD_NUMBER: _ClassVar[int]
    FIRST_POSITION_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_READ_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    probe: str
    sae_id: str
    layer: int
    fired: bool
    peak: float
    first_position: int
    positions_read: int
    threshold: float
    def __init__(self, probe: _Optional[str] = ..., sae_id: _Optional[str] = ..., layer: _Optional[int] = ..., fired: _Optional[bool] = ..., peak: _Optional[float] = ..., first_position: _Optional[int] = ..., positions_read: _Optional[int] = ..., threshold: _Optional[float] = ...) -> None: ...

class ProbeVerdicts(_message.Message):
    __slots__ = ("verdicts",)
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    verdicts: _containers.RepeatedCompositeFieldContainer[ProbeVerdict]
    def __init__(self, verdicts: _Optional[_Iterable[_Union[ProbeVerdict, _Mapping]]] = ...) -> None: ...
