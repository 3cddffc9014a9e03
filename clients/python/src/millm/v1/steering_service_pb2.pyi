from millm.v1 import steering_pb2 as _steering_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProfileKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROFILE_KIND_UNSPECIFIED: _ClassVar[ProfileKind]
    PROFILE_KIND_FEATURES: _ClassVar[ProfileKind]
    PROFILE_KIND_CLUSTER: _ClassVar[ProfileKind]
    PROFILE_KIND_CIRCUIT: _ClassVar[ProfileKind]

class CircuitMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CIRCUIT_MODE_UNSPECIFIED: _ClassVar[CircuitMode]
    CIRCUIT_MODE_FULL: _ClassVar[CircuitMode]
    CIRCUIT_MODE_SLICE_FALLBACK: _ClassVar[CircuitMode]
PROFILE_KIND_UNSPECIFIED: ProfileKind
PROFILE_KIND_FEATURES: ProfileKind
PROFILE_KIND_CLUSTER: ProfileKind
PROFILE_KIND_CIRCUIT: ProfileKind
CIRCUIT_MODE_UNSPECIFIED: CircuitMode
CIRCUIT_MODE_FULL: CircuitMode
CIRCUIT_MODE_SLICE_FALLBACK: CircuitMode

class Sae(_message.Message):
    __slots__ = ("id", "d_in", "d_sae", "architecture", "hook_name", "layer", "model_name", "attached", "layout", "transcoder")
    ID_FIELD_NUMBER: _ClassVar[int]
    D_IN_FIELD_NUMBER: _ClassVar[int]
    D_SAE_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    HOOK_NAME_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    TRANSCODER_FIELD_NUMBER: _ClassVar[int]
    id: str
    d_in: int
    d_sae: int
    architecture: str
    hook_name: str
    layer: int
    model_name: str
    attached: bool
    layout: str
    transcoder: bool
    def __init__(self, id: _Optional[str] = ..., d_in: _Optional[int] = ..., d_sae: _Optional[int] = ..., architecture: _Optional[str] = ..., hook_name: _Optional[str] = ..., layer: _Optional[int] = ..., model_name: _Optional[str] = ..., attached: _Optional[bool] = ..., layout: _Optional[str] = ..., transcoder: _Optional[bool] = ...) -> None: ...

class BrokenSae(_message.Message):
    __slots__ = ("id", "problem")
    ID_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    id: str
    problem: str
    def __init__(self, id: _Optional[str] = ..., problem: _Optional[str] = ...) -> None: ...

class Liveness(_message.Message):
    __slots__ = ("live", "reason", "replicas", "replicas_applied")
    LIVE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_APPLIED_FIELD_NUMBER: _ClassVar[int]
    live: bool
    reason: str
    replicas: int
    replicas_applied: int
    def __init__(self, live: _Optional[bool] = ..., reason: _Optional[str] = ..., replicas: _Optional[int] = ..., replicas_applied: _Optional[int] = ...) -> None: ...

class Profile(_message.Message):
    __slots__ = ("name", "description", "kind", "entries", "target", "active", "created", "updated")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    kind: ProfileKind
    entries: _containers.RepeatedCompositeFieldContainer[_steering_pb2.SteeringEntry]
    target: str
    active: bool
    created: int
    updated: int
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., kind: _Optional[_Union[ProfileKind, str]] = ..., entries: _Optional[_Iterable[_Union[_steering_pb2.SteeringEntry, _Mapping]]] = ..., target: _Optional[str] = ..., active: _Optional[bool] = ..., created: _Optional[int] = ..., updated: _Optional[int] = ...) -> None: ...

class IntensityRange(_message.Message):
    __slots__ = ("min", "max")
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    min: float
    max: float
    def __init__(self, min: _Optional[float] = ..., max: _Optional[float] = ...) -> None: ...

class Cluster(_message.Message):
    __slots__ = ("name", "description", "members", "intensity_range", "intensity", "document_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    INTENSITY_RANGE_FIELD_NUMBER: _ClassVar[int]
    INTENSITY_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    members: _containers.RepeatedCompositeFieldContainer[_steering_pb2.SteeringEntry]
    intensity_range: IntensityRange
    intensity: float
    document_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., members: _Optional[_Iterable[_Union[_steering_pb2.SteeringEntry, _Mapping]]] = ..., intensity_range: _Optional[_Union[IntensityRange, _Mapping]] = ..., intensity: _Optional[float] = ..., document_json: _Optional[str] = ...) -> None: ...

class Circuit(_message.Message):
    __slots__ = ("name", "description", "rung", "rung_language", "members", "intensity_range", "intensity", "mode", "fallback_cluster", "document_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    RUNG_FIELD_NUMBER: _ClassVar[int]
    RUNG_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    INTENSITY_RANGE_FIELD_NUMBER: _ClassVar[int]
    INTENSITY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_CLUSTER_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    rung: int
    rung_language: str
    members: _containers.RepeatedCompositeFieldContainer[_steering_pb2.SteeringEntry]
    intensity_range: IntensityRange
    intensity: float
    mode: CircuitMode
    fallback_cluster: str
    document_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., rung: _Optional[int] = ..., rung_language: _Optional[str] = ..., members: _Optional[_Iterable[_Union[_steering_pb2.SteeringEntry, _Mapping]]] = ..., intensity_range: _Optional[_Union[IntensityRange, _Mapping]] = ..., intensity: _Optional[float] = ..., mode: _Optional[_Union[CircuitMode, str]] = ..., fallback_cluster: _Optional[str] = ..., document_json: _Optional[str] = ...) -> None: ...

class CircuitSteeringState(_message.Message):
    __slots__ = ("steering", "rung", "language", "intensity", "reason")
    STEERING_FIELD_NUMBER: _ClassVar[int]
    RUNG_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    INTENSITY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    steering: bool
    rung: int
    language: str
    intensity: float
    reason: str
    def __init__(self, steering: _Optional[bool] = ..., rung: _Optional[int] = ..., language: _Optional[str] = ..., intensity: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class ListSaesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSaesResponse(_message.Message):
    __slots__ = ("saes", "broken")
    SAES_FIELD_NUMBER: _ClassVar[int]
    BROKEN_FIELD_NUMBER: _ClassVar[int]
    saes: _containers.RepeatedCompositeFieldContainer[Sae]
    broken: _containers.RepeatedCompositeFieldContainer[BrokenSae]
    def __init__(self, saes: _Optional[_Iterable[_Union[Sae, _Mapping]]] = ..., broken: _Optional[_Iterable[_Union[BrokenSae, _Mapping]]] = ...) -> None: ...

class AttachSaeRequest(_message.Message):
    __slots__ = ("sae_id",)
    SAE_ID_FIELD_NUMBER: _ClassVar[int]
    sae_id: str
    def __init__(self, sae_id: _Optional[str] = ...) -> None: ...

class AttachSaeResponse(_message.Message):
    __slots__ = ("sae", "liveness")
    SAE_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    sae: Sae
    liveness: Liveness
    def __init__(self, sae: _Optional[_Union[Sae, _Mapping]] = ..., liveness: _Optional[_Union[Liveness, _Mapping]] = ...) -> None: ...

class DetachSaeRequest(_message.Message):
    __slots__ = ("sae_id",)
    SAE_ID_FIELD_NUMBER: _ClassVar[int]
    sae_id: str
    def __init__(self, sae_id: _Optional[str] = ...) -> None: ...

class DetachSaeResponse(_message.Message):
    __slots__ = ("sae", "liveness")
    SAE_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    sae: Sae
    liveness: Liveness
    def __init__(self, sae: _Optional[_Union[Sae, _Mapping]] = ..., liveness: _Optional[_Union[Liveness, _Mapping]] = ...) -> None: ...

class ListSaeFeaturesRequest(_message.Message):
    __slots__ = ("sae_id", "query", "offset", "limit")
    SAE_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    sae_id: str
    query: str
    offset: int
    limit: int
    def __init__(self, sae_id: _Optional[str] = ..., query: _Optional[str] = ..., offset: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class FeatureToken(_message.Message):
    __slots__ = ("token", "count", "max")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    token: str
    count: int
    max: float
    def __init__(self, token: _Optional[str] = ..., count: _Optional[int] = ..., max: _Optional[float] = ...) -> None: ...

class FeatureExample(_message.Message):
    __slots__ = ("value", "token", "left", "right")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    RIGHT_FIELD_NUMBER: _ClassVar[int]
    value: float
    token: str
    left: str
    right: str
    def __init__(self, value: _Optional[float] = ..., token: _Optional[str] = ..., left: _Optional[str] = ..., right: _Optional[str] = ...) -> None: ...

class SaeFeature(_message.Message):
    __slots__ = ("index", "density", "max_activation", "top_tokens", "examples")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DENSITY_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTIVATION_FIELD_NUMBER: _ClassVar[int]
    TOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    index: int
    density: float
    max_activation: float
    top_tokens: _containers.RepeatedCompositeFieldContainer[FeatureToken]
    examples: _containers.RepeatedCompositeFieldContainer[FeatureExample]
    def __init__(self, index: _Optional[int] = ..., density: _Optional[float] = ..., max_activation: _Optional[float] = ..., top_tokens: _Optional[_Iterable[_Union[FeatureToken, _Mapping]]] = ..., examples: _Optional[_Iterable[_Union[FeatureExample, _Mapping]]] = ...) -> None: ...

class ListSaeFeaturesResponse(_message.Message):
    __slots__ = ("sae", "recorded", "total", "tokens_read", "features")
    SAE_FIELD_NUMBER: _ClassVar[int]
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    TOKENS_READ_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    sae: Sae
    recorded: bool
    total: int
    tokens_read: int
    features: _containers.RepeatedCompositeFieldContainer[SaeFeature]
    def __init__(self, sae: _Optional[_Union[Sae, _Mapping]] = ..., recorded: _Optional[bool] = ..., total: _Optional[int] = ..., tokens_read: _Optional[int] = ..., features: _Optional[_Iterable[_Union[SaeFeature, _Mapping]]] = ...) -> None: ...

class SearchSaeFeaturesRequest(_message.Message):
    __slots__ = ("sae_id", "query", "example", "neighbours_of", "meaning", "offset", "limit", "model")
    SAE_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    EXAMPLE_FIELD_NUMBER: _ClassVar[int]
    NEIGHBOURS_OF_FIELD_NUMBER: _ClassVar[int]
    MEANING_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    sae_id: str
    query: str
    example: str
    neighbours_of: int
    meaning: str
    offset: int
    limit: int
    model: str
    def __init__(self, sae_id: _Optional[str] = ..., query: _Optional[str] = ..., example: _Optional[str] = ..., neighbours_of: _Optional[int] = ..., meaning: _Optional[str] = ..., offset: _Optional[int] = ..., limit: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class FeatureMatch(_message.Message):
    __slots__ = ("index", "score")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    index: int
    score: float
    def __init__(self, index: _Optional[int] = ..., score: _Optional[float] = ...) -> None: ...

class TokenFeatures(_message.Message):
    __slots__ = ("position", "token_id", "token", "features")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    position: int
    token_id: int
    token: str
    features: _containers.RepeatedCompositeFieldContainer[FeatureMatch]
    def __init__(self, position: _Optional[int] = ..., token_id: _Optional[int] = ..., token: _Optional[str] = ..., features: _Optional[_Iterable[_Union[FeatureMatch, _Mapping]]] = ...) -> None: ...

class SearchSaeFeaturesResponse(_message.Message):
    __slots__ = ("sae", "total", "data", "tokens")
    SAE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    sae: Sae
    total: int
    data: _containers.RepeatedCompositeFieldContainer[FeatureMatch]
    tokens: _containers.RepeatedCompositeFieldContainer[TokenFeatures]
    def __init__(self, sae: _Optional[_Union[Sae, _Mapping]] = ..., total: _Optional[int] = ..., data: _Optional[_Iterable[_Union[FeatureMatch, _Mapping]]] = ..., tokens: _Optional[_Iterable[_Union[TokenFeatures, _Mapping]]] = ...) -> None: ...

class GetSaeFeatureRequest(_message.Message):
    __slots__ = ("sae_id", "index", "top_tokens")
    SAE_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    sae_id: str
    index: int
    top_tokens: int
    def __init__(self, sae_id: _Optional[str] = ..., index: _Optional[int] = ..., top_tokens: _Optional[int] = ...) -> None: ...

class TokenLogit(_message.Message):
    __slots__ = ("token_id", "token", "value")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    value: float
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...

class FeatureExplanation(_message.Message):
    __slots__ = ("text", "source", "updated")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    text: str
    source: str
    updated: int
    def __init__(self, text: _Optional[str] = ..., source: _Optional[str] = ..., updated: _Optional[int] = ...) -> None: ...

class GetSaeFeatureResponse(_message.Message):
    __slots__ = ("sae", "index", "recorded", "density", "max_activation", "top_tokens", "top_contexts", "model", "promoted_tokens", "suppressed_tokens", "explanation", "traffic_contexts")
    SAE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    DENSITY_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTIVATION_FIELD_NUMBER: _ClassVar[int]
    TOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOP_CONTEXTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMOTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SUPPRESSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_CONTEXTS_FIELD_NUMBER: _ClassVar[int]
    sae: Sae
    index: int
    recorded: bool
    density: float
    max_activation: float
    top_tokens: _containers.RepeatedCompositeFieldContainer[FeatureToken]
    top_contexts: _containers.RepeatedCompositeFieldContainer[FeatureExample]
    model: str
    promoted_tokens: _containers.RepeatedCompositeFieldContainer[TokenLogit]
    suppressed_tokens: _containers.RepeatedCompositeFieldContainer[TokenLogit]
    explanation: FeatureExplanation
    traffic_contexts: _containers.RepeatedCompositeFieldContainer[FeatureExample]
    def __init__(self, sae: _Optional[_Union[Sae, _Mapping]] = ..., index: _Optional[int] = ..., recorded: _Optional[bool] = ..., density: _Optional[float] = ..., max_activation: _Optional[float] = ..., top_tokens: _Optional[_Iterable[_Union[FeatureToken, _Mapping]]] = ..., top_contexts: _Optional[_Iterable[_Union[FeatureExample, _Mapping]]] = ..., model: _Optional[str] = ..., promoted_tokens: _Optional[_Iterable[_Union[TokenLogit, _Mapping]]] = ..., suppressed_tokens: _Optional[_Iterable[_Union[TokenLogit, _Mapping]]] = ..., explanation: _Optional[_Union[FeatureExplanation, _Mapping]] = ..., traffic_contexts: _Optional[_Iterable[_Union[FeatureExample, _Mapping]]] = ...) -> None: ...

class SetFeatureExplanationRequest(_message.Message):
    __slots__ = ("sae_id", "index", "text")
    SAE_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    sae_id: str
    index: int
    text: str
    def __init__(self, sae_id: _Optional[str] = ..., index: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class SetFeatureExplanationResponse(_message.Message):
    __slots__ = ("explanation",)
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    explanation: FeatureExplanation
    def __init__(self, explanation: _Optional[_Union[FeatureExplanation, _Mapping]] = ...) -> None: ...

class ImportFeatureExplanationsRequest(_message.Message):
    __slots__ = ("sae_id", "document_json")
    SAE_ID_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    sae_id: str
    document_json: str
    def __init__(self, sae_id: _Optional[str] = ..., document_json: _Optional[str] = ...) -> None: ...

class ImportFeatureExplanationsResponse(_message.Message):
    __slots__ = ("imported",)
    IMPORTED_FIELD_NUMBER: _ClassVar[int]
    imported: int
    def __init__(self, imported: _Optional[int] = ...) -> None: ...

class GetSteeringRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SteeringState(_message.Message):
    __slots__ = ("enabled", "values", "active_profile", "attached_sae_ids")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_PROFILE_FIELD_NUMBER: _ClassVar[int]
    ATTACHED_SAE_IDS_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    values: _containers.RepeatedCompositeFieldContainer[_steering_pb2.SteeringEntry]
    active_profile: str
    attached_sae_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, enabled: _Optional[bool] = ..., values: _Optional[_Iterable[_Union[_steering_pb2.SteeringEntry, _Mapping]]] = ..., active_profile: _Optional[str] = ..., attached_sae_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GetSteeringResponse(_message.Message):
    __slots__ = ("steering", "liveness")
    STEERING_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    steering: SteeringState
    liveness: Liveness
    def __init__(self, steering: _Optional[_Union[SteeringState, _Mapping]] = ..., liveness: _Optional[_Union[Liveness, _Mapping]] = ...) -> None: ...

class SetSteeringRequest(_message.Message):
    __slots__ = ("replace_values", "values", "enabled")
    REPLACE_VALUES_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    replace_values: bool
    values: _containers.RepeatedCompositeFieldContainer[_steering_pb2.SteeringEntry]
    enabled: bool
    def __init__(self, replace_values: _Optional[bool] = ..., values: _Optional[_Iterable[_Union[_steering_pb2.SteeringEntry, _Mapping]]] = ..., enabled: _Optional[bool] = ...) -> None: ...

class SetSteeringResponse(_message.Message):
    __slots__ = ("steering", "liveness")
    STEERING_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    steering: SteeringState
    liveness: Liveness
    def __init__(self, steering: _Optional[_Union[SteeringState, _Mapping]] = ..., liveness: _Optional[_Union[Liveness, _Mapping]] = ...) -> None: ...

class ListProfilesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListProfilesResponse(_message.Message):
    __slots__ = ("profiles",)
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    profiles: _containers.RepeatedCompositeFieldContainer[Profile]
    def __init__(self, profiles: _Optional[_Iterable[_Union[Profile, _Mapping]]] = ...) -> None: ...

class GetProfileRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetProfileResponse(_message.Message):
    __slots__ = ("profile",)
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    profile: Profile
    def __init__(self, profile: _Optional[_Union[Profile, _Mapping]] = ...) -> None: ...

class CreateProfileRequest(_message.Message):
    __slots__ = ("name", "description", "entries", "when")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    WHEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    entries: _containers.RepeatedCompositeFieldContainer[_steering_pb2.SteeringEntry]
    when: _steering_pb2.SteeringCondition
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[_steering_pb2.SteeringEntry, _Mapping]]] = ..., when: _Optional[_Union[_steering_pb2.SteeringCondition, _Mapping]] = ...) -> None: ...

class CreateProfileResponse(_message.Message):
    __slots__ = ("profile", "liveness")
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    profile: Profile
    liveness: Liveness
    def __init__(self, profile: _Optional[_Union[Profile, _Mapping]] = ..., liveness: _Optional[_Union[Liveness, _Mapping]] = ...) -> None: ...

class UpdateProfileRequest(_message.Message):
    __slots__ = ("name", "description", "replace_entries", "entries", "when")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    REPLACE_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    WHEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    replace_entries: bool
    entries: _containers.RepeatedCompositeFieldContainer[_steering_pb2.SteeringEntry]
    when: _steering_pb2.SteeringCondition
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., replace_entries: _Optional[bool] = ..., entries: _Optional[_Iterable[_Union[_steering_pb2.SteeringEntry, _Mapping]]] = ..., when: _Optional[_Union[_steering_pb2.SteeringCondition, _Mapping]] = ...) -> None: ...

class UpdateProfileResponse(_message.Message):
    __slots__ = ("profile", "liveness")
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    profile: Profile
    liveness: Liveness
    def __init__(self, profile: _Optional[_Union[Profile, _Mapping]] = ..., liveness: _Optional[_Union[Liveness, _Mapping]] = ...) -> None: ...

class DeleteProfileRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteProfileResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ActivateProfileRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ActivateProfileResponse(_message.Message):
    __slots__ = ("steering", "liveness")
    STEERING_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    steering: SteeringState
    liveness: Liveness
    def __init__(self, steering: _Optional[_Union[SteeringState, _Mapping]] = ..., liveness: _Optional[_Union[Liveness, _Mapping]] = ...) -> None: ...

class ImportClusterRequest(_message.Message):
    __slots__ = ("document_json",)
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    document_json: str
    def __init__(self, document_json: _Optional[str] = ...) -> None: ...

class ImportClusterResponse(_message.Message):
    __slots__ = ("cluster", "liveness")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    cluster: Cluster
    liveness: Liveness
    def __init__(self, cluster: _Optional[_Union[Cluster, _Mapping]] = ..., liveness: _Optional[_Union[Liveness, _Mapping]] = ...) -> None: ...

class ListClustersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListClustersResponse(_message.Message):
    __slots__ = ("clusters",)
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    clusters: _containers.RepeatedCompositeFieldContainer[Cluster]
    def __init__(self, clusters: _Optional[_Iterable[_Union[Cluster, _Mapping]]] = ...) -> None: ...

class GetClusterRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetClusterResponse(_message.Message):
    __slots__ = ("cluster",)
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    cluster: Cluster
    def __init__(self, cluster: _Optional[_Union[Cluster, _Mapping]] = ...) -> None: ...

class SetClusterIntensityRequest(_message.Message):
    __slots__ = ("name", "intensity")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INTENSITY_FIELD_NUMBER: _ClassVar[int]
    name: str
    intensity: float
    def __init__(self, name: _Optional[str] = ..., intensity: _Optional[float] = ...) -> None: ...

class SetClusterIntensityResponse(_message.Message):
    __slots__ = ("cluster", "liveness")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    cluster: Cluster
    liveness: Liveness
    def __init__(self, cluster: _Optional[_Union[Cluster, _Mapping]] = ..., liveness: _Optional[_Union[Liveness, _Mapping]] = ...) -> None: ...

class DeleteClusterRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteClusterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ImportCircuitRequest(_message.Message):
    __slots__ = ("document_json",)
    DOCUMENT_JSON_FIELD_NUMBER: _ClassVar[int]
    document_json: str
    def __init__(self, document_json: _Optional[str] = ...) -> None: ...

class ImportCircuitResponse(_message.Message):
    __slots__ = ("circuit", "liveness")
    CIRCUIT_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    circuit: Circuit
    liveness: Liveness
    def __init__(self, circuit: _Optional[_Union[Circuit, _Mapping]] = ..., liveness: _Optional[_Union[Liveness, _Mapping]] = ...) -> None: ...

class ListCircuitsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCircuitsResponse(_message.Message):
    __slots__ = ("circuits",)
    CIRCUITS_FIELD_NUMBER: _ClassVar[int]
    circuits: _containers.RepeatedCompositeFieldContainer[Circuit]
    def __init__(self, circuits: _Optional[_Iterable[_Union[Circuit, _Mapping]]] = ...) -> None: ...

class GetCircuitRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetCircuitResponse(_message.Message):
    __slots__ = ("circuit",)
    CIRCUIT_FIELD_NUMBER: _ClassVar[int]
    circuit: Circuit
    def __init__(self, circuit: _Optional[_Union[Circuit, _Mapping]] = ...) -> None: ...

class SetCircuitIntensityRequest(_message.Message):
    __slots__ = ("name", "intensity")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INTENSITY_FIELD_NUMBER: _ClassVar[int]
    name: str
    intensity: float
    def __init__(self, name: _Optional[str] = ..., intensity: _Optional[float] = ...) -> None: ...

class SetCircuitIntensityResponse(_message.Message):
    __slots__ = ("circuit", "liveness")
    CIRCUIT_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    circuit: Circuit
    liveness: Liveness
    def __init__(self, circuit: _Optional[_Union[Circuit, _Mapping]] = ..., liveness: _Optional[_Union[Liveness, _Mapping]] = ...) -> None: ...

class DeleteCircuitRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteCircuitResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ActivateCircuitRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ActivateCircuitResponse(_message.Message):
    __slots__ = ("steering", "liveness")
    STEERING_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    steering: SteeringState
    liveness: Liveness
    def __init__(self, steering: _Optional[_Union[SteeringState, _Mapping]] = ..., liveness: _Optional[_Union[Liveness, _Mapping]] = ...) -> None: ...

class GetActiveCircuitRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetActiveCircuitResponse(_message.Message):
    __slots__ = ("circuit", "steering")
    CIRCUIT_FIELD_NUMBER: _ClassVar[int]
    STEERING_FIELD_NUMBER: _ClassVar[int]
    circuit: Circuit
    steering: CircuitSteeringState
    def __init__(self, circuit: _Optional[_Union[Circuit, _Mapping]] = ..., steering: _Optional[_Union[CircuitSteeringState, _Mapping]] = ...) -> None: ...

class ControlVector(_message.Message):
    __slots__ = ("id", "file", "n_embd", "layers", "model_hint", "layer_count", "size_bytes", "mismatch")
    ID_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    N_EMBD_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    MODEL_HINT_FIELD_NUMBER: _ClassVar[int]
    LAYER_COUNT_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MISMATCH_FIELD_NUMBER: _ClassVar[int]
    id: str
    file: str
    n_embd: int
    layers: _containers.RepeatedScalarFieldContainer[int]
    model_hint: str
    layer_count: int
    size_bytes: int
    mismatch: str
    def __init__(self, id: _Optional[str] = ..., file: _Optional[str] = ..., n_embd: _Optional[int] = ..., layers: _Optional[_Iterable[int]] = ..., model_hint: _Optional[str] = ..., layer_count: _Optional[int] = ..., size_bytes: _Optional[int] = ..., mismatch: _Optional[str] = ...) -> None: ...

class BrokenControlVector(_message.Message):
    __slots__ = ("id", "problem")
    ID_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    id: str
    problem: str
    def __init__(self, id: _Optional[str] = ..., problem: _Optional[str] = ...) -> None: ...

class ListControlVectorsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListControlVectorsResponse(_message.Message):
    __slots__ = ("control_vectors", "broken")
    CONTROL_VECTORS_FIELD_NUMBER: _ClassVar[int]
    BROKEN_FIELD_NUMBER: _ClassVar[int]
    control_vectors: _containers.RepeatedCompositeFieldContainer[ControlVector]
    broken: _containers.RepeatedCompositeFieldContainer[BrokenControlVector]
    def __init__(self, control_vectors: _Optional[_Iterable[_Union[ControlVector, _Mapping]]] = ..., broken: _Optional[_Iterable[_Union[BrokenControlVector, _Mapping]]] = ...) -> None: ...

class ContrastPair(_message.Message):
    __slots__ = ("positive", "negative")
    POSITIVE_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_FIELD_NUMBER: _ClassVar[int]
    positive: str
    negative: str
    def __init__(self, positive: _Optional[str] = ..., negative: _Optional[str] = ...) -> None: ...

class CreateControlVectorRequest(_message.Message):
    __slots__ = ("name", "model", "layer", "method", "pairs", "positives", "negatives", "timeout_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    POSITIVES_FIELD_NUMBER: _ClassVar[int]
    NEGATIVES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    layer: int
    method: str
    pairs: _containers.RepeatedCompositeFieldContainer[ContrastPair]
    positives: _containers.RepeatedScalarFieldContainer[str]
    negatives: _containers.RepeatedScalarFieldContainer[str]
    timeout_s: float
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., layer: _Optional[int] = ..., method: _Optional[str] = ..., pairs: _Optional[_Iterable[_Union[ContrastPair, _Mapping]]] = ..., positives: _Optional[_Iterable[str]] = ..., negatives: _Optional[_Iterable[str]] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class NearFeature(_message.Message):
    __slots__ = ("sae_id", "index", "cosine")
    SAE_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    COSINE_FIELD_NUMBER: _ClassVar[int]
    sae_id: str
    index: int
    cosine: float
    def __init__(self, sae_id: _Optional[str] = ..., index: _Optional[int] = ..., cosine: _Optional[float] = ...) -> None: ...

class CreateControlVectorResponse(_message.Message):
    __slots__ = ("control_vector", "model", "method", "layer", "prompts", "tokens", "norm", "separation", "agreement", "nearest_features")
    CONTROL_VECTOR_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    NORM_FIELD_NUMBER: _ClassVar[int]
    SEPARATION_FIELD_NUMBER: _ClassVar[int]
    AGREEMENT_FIELD_NUMBER: _ClassVar[int]
    NEAREST_FEATURES_FIELD_NUMBER: _ClassVar[int]
    control_vector: ControlVector
    model: str
    method: str
    layer: int
    prompts: int
    tokens: int
    norm: float
    separation: float
    agreement: float
    nearest_features: _containers.RepeatedCompositeFieldContainer[NearFeature]
    def __init__(self, control_vector: _Optional[_Union[ControlVector, _Mapping]] = ..., model: _Optional[str] = ..., method: _Optional[str] = ..., layer: _Optional[int] = ..., prompts: _Optional[int] = ..., tokens: _Optional[int] = ..., norm: _Optional[float] = ..., separation: _Optional[float] = ..., agreement: _Optional[float] = ..., nearest_features: _Optional[_Iterable[_Union[NearFeature, _Mapping]]] = ...) -> None: ...

class ControlVectorBuild(_message.Message):
    __slots__ = ("name", "model", "layer", "method", "prompts_done", "prompts_total", "elapsed_s", "timeout_s", "cancelling")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_DONE_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    CANCELLING_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    layer: int
    method: str
    prompts_done: int
    prompts_total: int
    elapsed_s: float
    timeout_s: float
    cancelling: bool
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., layer: _Optional[int] = ..., method: _Optional[str] = ..., prompts_done: _Optional[int] = ..., prompts_total: _Optional[int] = ..., elapsed_s: _Optional[float] = ..., timeout_s: _Optional[float] = ..., cancelling: _Optional[bool] = ...) -> None: ...

class GetControlVectorBuildRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetControlVectorBuildResponse(_message.Message):
    __slots__ = ("build",)
    BUILD_FIELD_NUMBER: _ClassVar[int]
    build: ControlVectorBuild
    def __init__(self, build: _Optional[_Union[ControlVectorBuild, _Mapping]] = ...) -> None: ...

class CancelControlVectorBuildRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CancelControlVectorBuildResponse(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: bool
    def __init__(self, cancelled: _Optional[bool] = ...) -> None: ...

class DeleteControlVectorRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class DeleteControlVectorResponse(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...
