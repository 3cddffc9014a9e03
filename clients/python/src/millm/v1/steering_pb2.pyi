from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReadPoint(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    READ_POINT_UNSPECIFIED: _ClassVar[ReadPoint]
    READ_POINT_POST_STEERING: _ClassVar[ReadPoint]
    READ_POINT_PRE_STEERING: _ClassVar[ReadPoint]
    READ_POINT_UNSTEERED: _ClassVar[ReadPoint]

class PositionSelector(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POSITION_SELECTOR_UNSPECIFIED: _ClassVar[PositionSelector]
    POSITION_SELECTOR_LAST: _ClassVar[PositionSelector]
    POSITION_SELECTOR_PROMPT: _ClassVar[PositionSelector]
    POSITION_SELECTOR_COMPLETION: _ClassVar[PositionSelector]
    POSITION_SELECTOR_ALL: _ClassVar[PositionSelector]
READ_POINT_UNSPECIFIED: ReadPoint
READ_POINT_POST_STEERING: ReadPoint
READ_POINT_PRE_STEERING: ReadPoint
READ_POINT_UNSTEERED: ReadPoint
POSITION_SELECTOR_UNSPECIFIED: PositionSelector
POSITION_SELECTOR_LAST: PositionSelector
POSITION_SELECTOR_PROMPT: PositionSelector
POSITION_SELECTOR_COMPLETION: PositionSelector
POSITION_SELECTOR_ALL: PositionSelector

class SteeringIntensity(_message.Message):
    __slots__ = ("level", "symbol")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    SYMBOL_FIELD_NUMBER: _ClassVar[int]
    level: float
    symbol: str
    def __init__(self, level: _Optional[float] = ..., symbol: _Optional[str] = ...) -> None: ...

class PositionRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class SaeActivationsRequest(_message.Message):
    __slots__ = ("sae_id", "features", "top_k", "selector", "range", "read_point", "feature_selection")
    SAE_ID_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    RANGE_FIELD_NUMBER: _ClassVar[int]
    READ_POINT_FIELD_NUMBER: _ClassVar[int]
    FEATURE_SELECTION_FIELD_NUMBER: _ClassVar[int]
    sae_id: str
    features: _containers.RepeatedScalarFieldContainer[int]
    top_k: int
    selector: PositionSelector
    range: PositionRange
    read_point: ReadPoint
    feature_selection: FeatureSelection
    def __init__(self, sae_id: _Optional[str] = ..., features: _Optional[_Iterable[int]] = ..., top_k: _Optional[int] = ..., selector: _Optional[_Union[PositionSelector, str]] = ..., range: _Optional[_Union[PositionRange, _Mapping]] = ..., read_point: _Optional[_Union[ReadPoint, str]] = ..., feature_selection: _Optional[_Union[FeatureSelection, _Mapping]] = ...) -> None: ...

class FeatureSelection(_message.Message):
    __slots__ = ("indices",)
    INDICES_FIELD_NUMBER: _ClassVar[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, indices: _Optional[_Iterable[int]] = ...) -> None: ...

class FeatureActivation(_message.Message):
    __slots__ = ("index", "value")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    index: int
    value: float
    def __init__(self, index: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...

class PositionActivations(_message.Message):
    __slots__ = ("position", "token_id", "features")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    position: int
    token_id: int
    features: _containers.RepeatedCompositeFieldContainer[FeatureActivation]
    def __init__(self, position: _Optional[int] = ..., token_id: _Optional[int] = ..., features: _Optional[_Iterable[_Union[FeatureActivation, _Mapping]]] = ...) -> None: ...

class SaeActivations(_message.Message):
    __slots__ = ("sae_id", "layer", "read_point", "positions", "note")
    SAE_ID_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    READ_POINT_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    sae_id: str
    layer: int
    read_point: ReadPoint
    positions: _containers.RepeatedCompositeFieldContainer[PositionActivations]
    note: str
    def __init__(self, sae_id: _Optional[str] = ..., layer: _Optional[int] = ..., read_point: _Optional[_Union[ReadPoint, str]] = ..., positions: _Optional[_Iterable[_Union[PositionActivations, _Mapping]]] = ..., note: _Optional[str] = ...) -> None: ...

class CircuitRung(_message.Message):
    __slots__ = ("rung", "language")
    RUNG_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    rung: int
    language: str
    def __init__(self, rung: _Optional[int] = ..., language: _Optional[str] = ...) -> None: ...

class SteeringEntry(_message.Message):
    __slots__ = ("layer", "feature", "strength", "sae_id", "control_vector", "scale", "mode", "value", "when", "abort_when")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    FEATURE_FIELD_NUMBER: _ClassVar[int]
    STRENGTH_FIELD_NUMBER: _ClassVar[int]
    SAE_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROL_VECTOR_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    WHEN_FIELD_NUMBER: _ClassVar[int]
    ABORT_WHEN_FIELD_NUMBER: _ClassVar[int]
    layer: int
    feature: int
    strength: float
    sae_id: str
    control_vector: str
    scale: float
    mode: str
    value: float
    when: SteeringCondition
    abort_when: SteeringCondition
    def __init__(self, layer: _Optional[int] = ..., feature: _Optional[int] = ..., strength: _Optional[float] = ..., sae_id: _Optional[str] = ..., control_vector: _Optional[str] = ..., scale: _Optional[float] = ..., mode: _Optional[str] = ..., value: _Optional[float] = ..., when: _Optional[_Union[SteeringCondition, _Mapping]] = ..., abort_when: _Optional[_Union[SteeringCondition, _Mapping]] = ...) -> None: ...

class SteeringCondition(_message.Message):
    __slots__ = ("after_text", "from_position", "probe", "feature", "above", "layer")
    AFTER_TEXT_FIELD_NUMBER: _ClassVar[int]
    FROM_POSITION_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    FEATURE_FIELD_NUMBER: _ClassVar[int]
    ABOVE_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    after_text: str
    from_position: int
    probe: str
    feature: int
    above: float
    layer: int
    def __init__(self, after_text: _Optional[str] = ..., from_position: _Optional[int] = ..., probe: _Optional[str] = ..., feature: _Optional[int] = ..., above: _Optional[float] = ..., layer: _Optional[int] = ...) -> None: ...
