from millm.v1 import generation_pb2 as _generation_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResponseStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESPONSE_STATUS_UNSPECIFIED: _ClassVar[ResponseStatus]
    RESPONSE_STATUS_COMPLETED: _ClassVar[ResponseStatus]
    RESPONSE_STATUS_INCOMPLETE: _ClassVar[ResponseStatus]
    RESPONSE_STATUS_FAILED: _ClassVar[ResponseStatus]

class IncompleteReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INCOMPLETE_REASON_UNSPECIFIED: _ClassVar[IncompleteReason]
    INCOMPLETE_REASON_MAX_OUTPUT_TOKENS: _ClassVar[IncompleteReason]
    INCOMPLETE_REASON_CONTENT_FILTER: _ClassVar[IncompleteReason]

class ItemStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ITEM_STATUS_UNSPECIFIED: _ClassVar[ItemStatus]
    ITEM_STATUS_COMPLETED: _ClassVar[ItemStatus]
    ITEM_STATUS_INCOMPLETE: _ClassVar[ItemStatus]

class ContentPartType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTENT_PART_TYPE_UNSPECIFIED: _ClassVar[ContentPartType]
    CONTENT_PART_TYPE_INPUT_TEXT: _ClassVar[ContentPartType]
    CONTENT_PART_TYPE_OUTPUT_TEXT: _ClassVar[ContentPartType]

class ListOrder(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LIST_ORDER_UNSPECIFIED: _ClassVar[ListOrder]
    LIST_ORDER_ASC: _ClassVar[ListOrder]
    LIST_ORDER_DESC: _ClassVar[ListOrder]
RESPONSE_STATUS_UNSPECIFIED: ResponseStatus
RESPONSE_STATUS_COMPLETED: ResponseStatus
RESPONSE_STATUS_INCOMPLETE: ResponseStatus
RESPONSE_STATUS_FAILED: ResponseStatus
INCOMPLETE_REASON_UNSPECIFIED: IncompleteReason
INCOMPLETE_REASON_MAX_OUTPUT_TOKENS: IncompleteReason
INCOMPLETE_REASON_CONTENT_FILTER: IncompleteReason
ITEM_STATUS_UNSPECIFIED: ItemStatus
ITEM_STATUS_COMPLETED: ItemStatus
ITEM_STATUS_INCOMPLETE: ItemStatus
CONTENT_PART_TYPE_UNSPECIFIED: ContentPartType
CONTENT_PART_TYPE_INPUT_TEXT: ContentPartType
CONTENT_PART_TYPE_OUTPUT_TEXT: ContentPartType
LIST_ORDER_UNSPECIFIED: ListOrder
LIST_ORDER_ASC: ListOrder
LIST_ORDER_DESC: ListOrder

class ContentPart(_message.Message):
    __slots__ = ("type", "text")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    type: ContentPartType
    text: str
    def __init__(self, type: _Optional[_Union[ContentPartType, str]] = ..., text: _Optional[str] = ...) -> None: ...

class MessageItem(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: _generation_pb2.Role
    content: _containers.RepeatedCompositeFieldContainer[ContentPart]
    def __init__(self, role: _Optional[_Union[_generation_pb2.Role, str]] = ..., content: _Optional[_Iterable[_Union[ContentPart, _Mapping]]] = ...) -> None: ...

class FunctionCallItem(_message.Message):
    __slots__ = ("call_id", "name", "arguments_json", "namespace")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    name: str
    arguments_json: str
    namespace: str
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_json: _Optional[str] = ..., namespace: _Optional[str] = ...) -> None: ...

class CustomToolCallItem(_message.Message):
    __slots__ = ("call_id", "name", "input")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    name: str
    input: str
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., input: _Optional[str] = ...) -> None: ...

class CustomToolCallOutputItem(_message.Message):
    __slots__ = ("call_id", "output")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    output: str
    def __init__(self, call_id: _Optional[str] = ..., output: _Optional[str] = ...) -> None: ...

class FunctionCallOutputItem(_message.Message):
    __slots__ = ("call_id", "output")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    output: str
    def __init__(self, call_id: _Optional[str] = ..., output: _Optional[str] = ...) -> None: ...

class ReasoningItem(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class ResponseItem(_message.Message):
    __slots__ = ("id", "status", "message", "function_call", "function_call_output", "reasoning", "custom_tool_call", "custom_tool_call_output")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_CALL_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_CALL_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_TOOL_CALL_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    id: str
    status: ItemStatus
    message: MessageItem
    function_call: FunctionCallItem
    function_call_output: FunctionCallOutputItem
    reasoning: ReasoningItem
    custom_tool_call: CustomToolCallItem
    custom_tool_call_output: CustomToolCallOutputItem
    def __init__(self, id: _Optional[str] = ..., status: _Optional[_Union[ItemStatus, str]] = ..., message: _Optional[_Union[MessageItem, _Mapping]] = ..., function_call: _Optional[_Union[FunctionCallItem, _Mapping]] = ..., function_call_output: _Optional[_Union[FunctionCallOutputItem, _Mapping]] = ..., reasoning: _Optional[_Union[ReasoningItem, _Mapping]] = ..., custom_tool_call: _Optional[_Union[CustomToolCallItem, _Mapping]] = ..., custom_tool_call_output: _Optional[_Union[CustomToolCallOutputItem, _Mapping]] = ...) -> None: ...

class ResponseError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ResponseSettings(_message.Message):
    __slots__ = ("sampling", "tools", "tool_choice", "parallel_tool_calls", "text_format", "user", "reasoning_effort", "reasoning_summary", "reasoning_encrypted_content")
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    REASONING_EFFORT_FIELD_NUMBER: _ClassVar[int]
    REASONING_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    REASONING_ENCRYPTED_CONTENT_FIELD_NUMBER: _ClassVar[int]
    sampling: _generation_pb2.SamplingParams
    tools: _containers.RepeatedCompositeFieldContainer[_generation_pb2.FunctionTool]
    tool_choice: _generation_pb2.ToolChoice
    parallel_tool_calls: bool
    text_format: _generation_pb2.ResponseFormat
    user: str
    reasoning_effort: str
    reasoning_summary: str
    reasoning_encrypted_content: bool
    def __init__(self, sampling: _Optional[_Union[_generation_pb2.SamplingParams, _Mapping]] = ..., tools: _Optional[_Iterable[_Union[_generation_pb2.FunctionTool, _Mapping]]] = ..., tool_choice: _Optional[_Union[_generation_pb2.ToolChoice, _Mapping]] = ..., parallel_tool_calls: _Optional[bool] = ..., text_format: _Optional[_Union[_generation_pb2.ResponseFormat, _Mapping]] = ..., user: _Optional[str] = ..., reasoning_effort: _Optional[str] = ..., reasoning_summary: _Optional[str] = ..., reasoning_encrypted_content: _Optional[bool] = ...) -> None: ...

class StoredResponse(_message.Message):
    __slots__ = ("id", "created_at", "model", "status", "output", "usage", "metadata", "previous_response_id", "instructions", "error", "incomplete_reason", "settings", "owner")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTIONS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    INCOMPLETE_REASON_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    id: str
    created_at: int
    model: str
    status: ResponseStatus
    output: _containers.RepeatedCompositeFieldContainer[ResponseItem]
    usage: _generation_pb2.Usage
    metadata: _containers.ScalarMap[str, str]
    previous_response_id: str
    instructions: str
    error: ResponseError
    incomplete_reason: IncompleteReason
    settings: ResponseSettings
    owner: str
    def __init__(self, id: _Optional[str] = ..., created_at: _Optional[int] = ..., model: _Optional[str] = ..., status: _Optional[_Union[ResponseStatus, str]] = ..., output: _Optional[_Iterable[_Union[ResponseItem, _Mapping]]] = ..., usage: _Optional[_Union[_generation_pb2.Usage, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., previous_response_id: _Optional[str] = ..., instructions: _Optional[str] = ..., error: _Optional[_Union[ResponseError, _Mapping]] = ..., incomplete_reason: _Optional[_Union[IncompleteReason, str]] = ..., settings: _Optional[_Union[ResponseSettings, _Mapping]] = ..., owner: _Optional[str] = ...) -> None: ...

class SaveResponseRequest(_message.Message):
    __slots__ = ("response", "input_items")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    INPUT_ITEMS_FIELD_NUMBER: _ClassVar[int]
    response: StoredResponse
    input_items: _containers.RepeatedCompositeFieldContainer[ResponseItem]
    def __init__(self, response: _Optional[_Union[StoredResponse, _Mapping]] = ..., input_items: _Optional[_Iterable[_Union[ResponseItem, _Mapping]]] = ...) -> None: ...

class SaveResponseResponse(_message.Message):
    __slots__ = ("pruned",)
    PRUNED_FIELD_NUMBER: _ClassVar[int]
    pruned: int
    def __init__(self, pruned: _Optional[int] = ...) -> None: ...

class GetResponseRequest(_message.Message):
    __slots__ = ("id", "include_input_items")
    ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_INPUT_ITEMS_FIELD_NUMBER: _ClassVar[int]
    id: str
    include_input_items: bool
    def __init__(self, id: _Optional[str] = ..., include_input_items: _Optional[bool] = ...) -> None: ...

class GetResponseResponse(_message.Message):
    __slots__ = ("response", "input_items")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    INPUT_ITEMS_FIELD_NUMBER: _ClassVar[int]
    response: StoredResponse
    input_items: _containers.RepeatedCompositeFieldContainer[ResponseItem]
    def __init__(self, response: _Optional[_Union[StoredResponse, _Mapping]] = ..., input_items: _Optional[_Iterable[_Union[ResponseItem, _Mapping]]] = ...) -> None: ...

class DeleteResponseRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class DeleteResponseResponse(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ListInputItemsRequest(_message.Message):
    __slots__ = ("response_id", "limit", "order", "after", "before")
    RESPONSE_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    response_id: str
    limit: int
    order: ListOrder
    after: str
    before: str
    def __init__(self, response_id: _Optional[str] = ..., limit: _Optional[int] = ..., order: _Optional[_Union[ListOrder, str]] = ..., after: _Optional[str] = ..., before: _Optional[str] = ...) -> None: ...

class ListInputItemsResponse(_message.Message):
    __slots__ = ("items", "first_id", "last_id", "has_more")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    FIRST_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ID_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ResponseItem]
    first_id: str
    last_id: str
    has_more: bool
    def __init__(self, items: _Optional[_Iterable[_Union[ResponseItem, _Mapping]]] = ..., first_id: _Optional[str] = ..., last_id: _Optional[str] = ..., has_more: _Optional[bool] = ...) -> None: ...
