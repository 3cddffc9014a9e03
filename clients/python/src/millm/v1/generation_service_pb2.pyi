from google.protobuf import struct_pb2 as _struct_pb2
from millm.v1 import generation_pb2 as _generation_pb2
from millm.v1 import monitoring_pb2 as _monitoring_pb2
from millm.v1 import steering_pb2 as _steering_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateManyRequest(_message.Message):
    __slots__ = ("starts", "cancels")
    STARTS_FIELD_NUMBER: _ClassVar[int]
    CANCELS_FIELD_NUMBER: _ClassVar[int]
    starts: _containers.RepeatedCompositeFieldContainer[GenerateStart]
    cancels: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, starts: _Optional[_Iterable[_Union[GenerateStart, _Mapping]]] = ..., cancels: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateStart(_message.Message):
    __slots__ = ("id", "request", "authorization", "request_id", "timeout_s")
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    AUTHORIZATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    id: int
    request: GenerateRequest
    authorization: str
    request_id: str
    timeout_s: float
    def __init__(self, id: _Optional[int] = ..., request: _Optional[_Union[GenerateRequest, _Mapping]] = ..., authorization: _Optional[str] = ..., request_id: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class GenerateManyResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[GenerateEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[GenerateEvent, _Mapping]]] = ...) -> None: ...

class GenerateEvent(_message.Message):
    __slots__ = ("id", "response", "end")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    id: int
    response: GenerateResponse
    end: GenerateEnd
    def __init__(self, id: _Optional[int] = ..., response: _Optional[_Union[GenerateResponse, _Mapping]] = ..., end: _Optional[_Union[GenerateEnd, _Mapping]] = ...) -> None: ...

class GenerateEnd(_message.Message):
    __slots__ = ("code", "message", "status_details")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STATUS_DETAILS_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    status_details: bytes
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., status_details: _Optional[bytes] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("model", "chat", "prompt", "sampling", "request_id", "strict", "extra_fields", "unused_fields", "user", "response_format", "extra_chats", "profile", "steering_intensity", "return_sae_activations", "tools", "tool_choice", "parallel_tool_calls", "stream", "coalesce", "reasoning_effort", "thinking_token_budget", "chat_template_kwargs", "structured_outputs", "steering_compare", "stream_interval", "priority")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELDS_FIELD_NUMBER: _ClassVar[int]
    UNUSED_FIELDS_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    EXTRA_CHATS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    STEERING_INTENSITY_FIELD_NUMBER: _ClassVar[int]
    RETURN_SAE_ACTIVATIONS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    COALESCE_FIELD_NUMBER: _ClassVar[int]
    REASONING_EFFORT_FIELD_NUMBER: _ClassVar[int]
    THINKING_TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_KWARGS_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    STEERING_COMPARE_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    model: str
    chat: _generation_pb2.ChatInput
    prompt: _generation_pb2.PromptInput
    sampling: _generation_pb2.SamplingParams
    request_id: str
    strict: bool
    extra_fields: _struct_pb2.Struct
    unused_fields: _containers.RepeatedScalarFieldContainer[str]
    user: str
    response_format: _generation_pb2.ResponseFormat
    extra_chats: _containers.RepeatedCompositeFieldContainer[_generation_pb2.ChatInput]
    profile: str
    steering_intensity: _steering_pb2.SteeringIntensity
    return_sae_activations: _steering_pb2.SaeActivationsRequest
    tools: _containers.RepeatedCompositeFieldContainer[_generation_pb2.FunctionTool]
    tool_choice: _generation_pb2.ToolChoice
    parallel_tool_calls: bool
    stream: bool
    coalesce: bool
    reasoning_effort: str
    thinking_token_budget: int
    chat_template_kwargs: _struct_pb2.Struct
    structured_outputs: _generation_pb2.StructuredOutputs
    steering_compare: bool
    stream_interval: int
    priority: int
    def __init__(self, model: _Optional[str] = ..., chat: _Optional[_Union[_generation_pb2.ChatInput, _Mapping]] = ..., prompt: _Optional[_Union[_generation_pb2.PromptInput, _Mapping]] = ..., sampling: _Optional[_Union[_generation_pb2.SamplingParams, _Mapping]] = ..., request_id: _Optional[str] = ..., strict: _Optional[bool] = ..., extra_fields: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., unused_fields: _Optional[_Iterable[str]] = ..., user: _Optional[str] = ..., response_format: _Optional[_Union[_generation_pb2.ResponseFormat, _Mapping]] = ..., extra_chats: _Optional[_Iterable[_Union[_generation_pb2.ChatInput, _Mapping]]] = ..., profile: _Optional[str] = ..., steering_intensity: _Optional[_Union[_steering_pb2.SteeringIntensity, _Mapping]] = ..., return_sae_activations: _Optional[_Union[_steering_pb2.SaeActivationsRequest, _Mapping]] = ..., tools: _Optional[_Iterable[_Union[_generation_pb2.FunctionTool, _Mapping]]] = ..., tool_choice: _Optional[_Union[_generation_pb2.ToolChoice, _Mapping]] = ..., parallel_tool_calls: _Optional[bool] = ..., stream: _Optional[bool] = ..., coalesce: _Optional[bool] = ..., reasoning_effort: _Optional[str] = ..., thinking_token_budget: _Optional[int] = ..., chat_template_kwargs: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., structured_outputs: _Optional[_Union[_generation_pb2.StructuredOutputs, _Mapping]] = ..., steering_compare: _Optional[bool] = ..., stream_interval: _Optional[int] = ..., priority: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("metadata", "choices", "usage", "echoed", "sae_activations", "probe_verdicts", "unsteered_choices", "comparison")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ECHOED_FIELD_NUMBER: _ClassVar[int]
    SAE_ACTIVATIONS_FIELD_NUMBER: _ClassVar[int]
    PROBE_VERDICTS_FIELD_NUMBER: _ClassVar[int]
    UNSTEERED_CHOICES_FIELD_NUMBER: _ClassVar[int]
    COMPARISON_FIELD_NUMBER: _ClassVar[int]
    metadata: _generation_pb2.ResponseMetadata
    choices: _containers.RepeatedCompositeFieldContainer[_generation_pb2.ChoiceDelta]
    usage: _generation_pb2.Usage
    echoed: _containers.RepeatedCompositeFieldContainer[_generation_pb2.EchoedPrompt]
    sae_activations: _steering_pb2.SaeActivations
    probe_verdicts: _monitoring_pb2.ProbeVerdicts
    unsteered_choices: _containers.RepeatedCompositeFieldContainer[_generation_pb2.ChoiceDelta]
    comparison: _generation_pb2.SteeringComparison
    def __init__(self, metadata: _Optional[_Union[_generation_pb2.ResponseMetadata, _Mapping]] = ..., choices: _Optional[_Iterable[_Union[_generation_pb2.ChoiceDelta, _Mapping]]] = ..., usage: _Optional[_Union[_generation_pb2.Usage, _Mapping]] = ..., echoed: _Optional[_Iterable[_Union[_generation_pb2.EchoedPrompt, _Mapping]]] = ..., sae_activations: _Optional[_Union[_steering_pb2.SaeActivations, _Mapping]] = ..., probe_verdicts: _Optional[_Union[_monitoring_pb2.ProbeVerdicts, _Mapping]] = ..., unsteered_choices: _Optional[_Iterable[_Union[_generation_pb2.ChoiceDelta, _Mapping]]] = ..., comparison: _Optional[_Union[_generation_pb2.SteeringComparison, _Mapping]] = ...) -> None: ...
