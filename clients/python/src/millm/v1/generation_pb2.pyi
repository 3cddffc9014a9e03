from millm.v1 import steering_pb2 as _steering_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_SYSTEM: _ClassVar[Role]
    ROLE_DEVELOPER: _ClassVar[Role]
    ROLE_USER: _ClassVar[Role]
    ROLE_ASSISTANT: _ClassVar[Role]
    ROLE_TOOL: _ClassVar[Role]
    ROLE_FUNCTION: _ClassVar[Role]

class OutputConstraint(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTPUT_CONSTRAINT_UNSPECIFIED: _ClassVar[OutputConstraint]
    OUTPUT_CONSTRAINT_JSON_OBJECT: _ClassVar[OutputConstraint]
    OUTPUT_CONSTRAINT_JSON_SCHEMA: _ClassVar[OutputConstraint]
    OUTPUT_CONSTRAINT_REGEX: _ClassVar[OutputConstraint]
    OUTPUT_CONSTRAINT_CHOICE: _ClassVar[OutputConstraint]
    OUTPUT_CONSTRAINT_GRAMMAR: _ClassVar[OutputConstraint]
    OUTPUT_CONSTRAINT_STRUCTURAL_TAG: _ClassVar[OutputConstraint]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_TOOL_CALLS: _ClassVar[FinishReason]
    FINISH_REASON_CONTENT_FILTER: _ClassVar[FinishReason]

class SeedScope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEED_SCOPE_UNSPECIFIED: _ClassVar[SeedScope]
    SEED_SCOPE_REQUEST: _ClassVar[SeedScope]
    SEED_SCOPE_BATCH_SHAPE: _ClassVar[SeedScope]
    SEED_SCOPE_BEST_EFFORT: _ClassVar[SeedScope]

class CustomToolSyntax(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CUSTOM_TOOL_SYNTAX_UNSPECIFIED: _ClassVar[CustomToolSyntax]
    CUSTOM_TOOL_SYNTAX_LARK: _ClassVar[CustomToolSyntax]
    CUSTOM_TOOL_SYNTAX_REGEX: _ClassVar[CustomToolSyntax]

class ToolChoiceMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_CHOICE_MODE_UNSPECIFIED: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_NONE: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_AUTO: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_REQUIRED: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_FUNCTION: _ClassVar[ToolChoiceMode]
ROLE_UNSPECIFIED: Role
ROLE_SYSTEM: Role
ROLE_DEVELOPER: Role
ROLE_USER: Role
ROLE_ASSISTANT: Role
ROLE_TOOL: Role
ROLE_FUNCTION: Role
OUTPUT_CONSTRAINT_UNSPECIFIED: OutputConstraint
OUTPUT_CONSTRAINT_JSON_OBJECT: OutputConstraint
OUTPUT_CONSTRAINT_JSON_SCHEMA: OutputConstraint
OUTPUT_CONSTRAINT_REGEX: OutputConstraint
OUTPUT_CONSTRAINT_CHOICE: OutputConstraint
OUTPUT_CONSTRAINT_GRAMMAR: OutputConstraint
OUTPUT_CONSTRAINT_STRUCTURAL_TAG: OutputConstraint
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_TOOL_CALLS: FinishReason
FINISH_REASON_CONTENT_FILTER: FinishReason
SEED_SCOPE_UNSPECIFIED: SeedScope
SEED_SCOPE_REQUEST: SeedScope
SEED_SCOPE_BATCH_SHAPE: SeedScope
SEED_SCOPE_BEST_EFFORT: SeedScope
CUSTOM_TOOL_SYNTAX_UNSPECIFIED: CustomToolSyntax
CUSTOM_TOOL_SYNTAX_LARK: CustomToolSyntax
CUSTOM_TOOL_SYNTAX_REGEX: CustomToolSyntax
TOOL_CHOICE_MODE_UNSPECIFIED: ToolChoiceMode
TOOL_CHOICE_MODE_NONE: ToolChoiceMode
TOOL_CHOICE_MODE_AUTO: ToolChoiceMode
TOOL_CHOICE_MODE_REQUIRED: ToolChoiceMode
TOOL_CHOICE_MODE_FUNCTION: ToolChoiceMode

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    REASONING_CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: Role
    content: str
    name: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    reasoning_content: str
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., content: _Optional[str] = ..., name: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ..., reasoning_content: _Optional[str] = ...) -> None: ...

class ChatInput(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Prompt(_message.Message):
    __slots__ = ("text", "token_ids")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: TokenIds
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ...) -> None: ...

class PromptInput(_message.Message):
    __slots__ = ("prompts", "parse_special_tokens", "add_special_tokens", "echo")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    PARSE_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ECHO_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[Prompt]
    parse_special_tokens: bool
    add_special_tokens: bool
    echo: bool
    def __init__(self, prompts: _Optional[_Iterable[_Union[Prompt, _Mapping]]] = ..., parse_special_tokens: _Optional[bool] = ..., add_special_tokens: _Optional[bool] = ..., echo: _Optional[bool] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "max_completion_tokens", "stop", "n", "seed", "frequency_penalty", "presence_penalty", "repetition_penalty", "ignore_eos", "logprobs", "allowed_token_ids", "logit_bias")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    max_tokens: int
    max_completion_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    n: int
    seed: int
    frequency_penalty: float
    presence_penalty: float
    repetition_penalty: float
    ignore_eos: bool
    logprobs: int
    allowed_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logit_bias: _containers.ScalarMap[int, float]
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., max_tokens: _Optional[int] = ..., max_completion_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., n: _Optional[int] = ..., seed: _Optional[int] = ..., frequency_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., ignore_eos: _Optional[bool] = ..., logprobs: _Optional[int] = ..., allowed_token_ids: _Optional[_Iterable[int]] = ..., logit_bias: _Optional[_Mapping[int, float]] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "text", "bytes", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    text: str
    bytes: bytes
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., text: _Optional[str] = ..., bytes: _Optional[bytes] = ..., logprob: _Optional[float] = ...) -> None: ...

class TokenScore(_message.Message):
    __slots__ = ("token", "top")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token: TokenLogprob
    top: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, token: _Optional[_Union[TokenLogprob, _Mapping]] = ..., top: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class EchoedPrompt(_message.Message):
    __slots__ = ("prompt_index", "text", "tokens")
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_index: int
    text: str
    tokens: _containers.RepeatedCompositeFieldContainer[TokenScore]
    def __init__(self, prompt_index: _Optional[int] = ..., text: _Optional[str] = ..., tokens: _Optional[_Iterable[_Union[TokenScore, _Mapping]]] = ...) -> None: ...

class ResponseFormat(_message.Message):
    __slots__ = ("text", "json_object", "json_schema")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    text: TextFormat
    json_object: JsonObjectFormat
    json_schema: JsonSchemaFormat
    def __init__(self, text: _Optional[_Union[TextFormat, _Mapping]] = ..., json_object: _Optional[_Union[JsonObjectFormat, _Mapping]] = ..., json_schema: _Optional[_Union[JsonSchemaFormat, _Mapping]] = ...) -> None: ...

class TextFormat(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class JsonObjectFormat(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class JsonSchemaFormat(_message.Message):
    __slots__ = ("name", "strict", "description", "schema_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    strict: bool
    description: str
    schema_json: str
    def __init__(self, name: _Optional[str] = ..., strict: _Optional[bool] = ..., description: _Optional[str] = ..., schema_json: _Optional[str] = ...) -> None: ...

class StructuredOutputs(_message.Message):
    __slots__ = ("json", "regex", "choice", "grammar", "structural_tag", "json_object")
    JSON_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    STRUCTURAL_TAG_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    json: str
    regex: str
    choice: ChoiceList
    grammar: str
    structural_tag: str
    json_object: bool
    def __init__(self, json: _Optional[str] = ..., regex: _Optional[str] = ..., choice: _Optional[_Union[ChoiceList, _Mapping]] = ..., grammar: _Optional[str] = ..., structural_tag: _Optional[str] = ..., json_object: _Optional[bool] = ...) -> None: ...

class ChoiceList(_message.Message):
    __slots__ = ("choices",)
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    choices: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, choices: _Optional[_Iterable[str]] = ...) -> None: ...

class ResponseMetadata(_message.Message):
    __slots__ = ("id", "created", "model", "system_fingerprint", "seed", "seed_scope", "prompt_tokens", "ignored_fields", "constraint", "constraint_name", "steering_intensity", "circuit_rung", "unsteered", "max_tokens_cap")
    ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SEED_SCOPE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IGNORED_FIELDS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_NAME_FIELD_NUMBER: _ClassVar[int]
    STEERING_INTENSITY_FIELD_NUMBER: _ClassVar[int]
    CIRCUIT_RUNG_FIELD_NUMBER: _ClassVar[int]
    UNSTEERED_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_CAP_FIELD_NUMBER: _ClassVar[int]
    id: str
    created: int
    model: str
    system_fingerprint: str
    seed: int
    seed_scope: SeedScope
    prompt_tokens: int
    ignored_fields: _containers.RepeatedScalarFieldContainer[str]
    constraint: OutputConstraint
    constraint_name: str
    steering_intensity: float
    circuit_rung: _steering_pb2.CircuitRung
    unsteered: bool
    max_tokens_cap: MaxTokensCap
    def __init__(self, id: _Optional[str] = ..., created: _Optional[int] = ..., model: _Optional[str] = ..., system_fingerprint: _Optional[str] = ..., seed: _Optional[int] = ..., seed_scope: _Optional[_Union[SeedScope, str]] = ..., prompt_tokens: _Optional[int] = ..., ignored_fields: _Optional[_Iterable[str]] = ..., constraint: _Optional[_Union[OutputConstraint, str]] = ..., constraint_name: _Optional[str] = ..., steering_intensity: _Optional[float] = ..., circuit_rung: _Optional[_Union[_steering_pb2.CircuitRung, _Mapping]] = ..., unsteered: _Optional[bool] = ..., max_tokens_cap: _Optional[_Union[MaxTokensCap, _Mapping]] = ...) -> None: ...

class MaxTokensCap(_message.Message):
    __slots__ = ("requested", "applied")
    REQUESTED_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    requested: int
    applied: int
    def __init__(self, requested: _Optional[int] = ..., applied: _Optional[int] = ...) -> None: ...

class ChoiceDelta(_message.Message):
    __slots__ = ("index", "text", "token_ids", "finish_reason", "logprobs", "tool_calls", "stop_sequence", "reasoning")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    STOP_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    index: int
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenScore]
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCallDelta]
    stop_sequence: str
    reasoning: str
    def __init__(self, index: _Optional[int] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., logprobs: _Optional[_Iterable[_Union[TokenScore, _Mapping]]] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCallDelta, _Mapping]]] = ..., stop_sequence: _Optional[str] = ..., reasoning: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens", "reasoning_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASONING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., reasoning_tokens: _Optional[int] = ...) -> None: ...

class FunctionTool(_message.Message):
    __slots__ = ("name", "description", "parameters_json", "strict", "custom")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json: str
    strict: bool
    custom: CustomToolFormat
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json: _Optional[str] = ..., strict: _Optional[bool] = ..., custom: _Optional[_Union[CustomToolFormat, _Mapping]] = ...) -> None: ...

class CustomToolFormat(_message.Message):
    __slots__ = ("syntax", "definition")
    SYNTAX_FIELD_NUMBER: _ClassVar[int]
    DEFINITION_FIELD_NUMBER: _ClassVar[int]
    syntax: CustomToolSyntax
    definition: str
    def __init__(self, syntax: _Optional[_Union[CustomToolSyntax, str]] = ..., definition: _Optional[str] = ...) -> None: ...

class ToolChoice(_message.Message):
    __slots__ = ("mode", "function_name")
    MODE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_NAME_FIELD_NUMBER: _ClassVar[int]
    mode: ToolChoiceMode
    function_name: str
    def __init__(self, mode: _Optional[_Union[ToolChoiceMode, str]] = ..., function_name: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments_json: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class ToolCallDelta(_message.Message):
    __slots__ = ("index", "id", "name", "arguments")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    id: str
    name: str
    arguments: str
    def __init__(self, index: _Optional[int] = ..., id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class TokenDivergence(_message.Message):
    __slots__ = ("token_id", "token", "logprob", "unsteered_logprob", "kl")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    UNSTEERED_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    KL_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    logprob: float
    unsteered_logprob: float
    kl: float
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., logprob: _Optional[float] = ..., unsteered_logprob: _Optional[float] = ..., kl: _Optional[float] = ...) -> None: ...

class ChoiceDivergence(_message.Message):
    __slots__ = ("index", "tokens")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    index: int
    tokens: _containers.RepeatedCompositeFieldContainer[TokenDivergence]
    def __init__(self, index: _Optional[int] = ..., tokens: _Optional[_Iterable[_Union[TokenDivergence, _Mapping]]] = ...) -> None: ...

class SteeringComparison(_message.Message):
    __slots__ = ("choices", "unsteered_usage")
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    UNSTEERED_USAGE_FIELD_NUMBER: _ClassVar[int]
    choices: _containers.RepeatedCompositeFieldContainer[ChoiceDivergence]
    unsteered_usage: Usage
    def __init__(self, choices: _Optional[_Iterable[_Union[ChoiceDivergence, _Mapping]]] = ..., unsteered_usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...
