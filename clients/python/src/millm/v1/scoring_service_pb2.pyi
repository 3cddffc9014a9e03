from millm.v1 import generation_pb2 as _generation_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreRequest(_message.Message):
    __slots__ = ("model", "chat", "prompt", "allowed_token_ids", "top_logprobs", "temperature", "request_id", "extra_chats")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXTRA_CHATS_FIELD_NUMBER: _ClassVar[int]
    model: str
    chat: _generation_pb2.ChatInput
    prompt: _generation_pb2.PromptInput
    allowed_token_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: int
    temperature: float
    request_id: str
    extra_chats: _containers.RepeatedCompositeFieldContainer[_generation_pb2.ChatInput]
    def __init__(self, model: _Optional[str] = ..., chat: _Optional[_Union[_generation_pb2.ChatInput, _Mapping]] = ..., prompt: _Optional[_Union[_generation_pb2.PromptInput, _Mapping]] = ..., allowed_token_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[int] = ..., temperature: _Optional[float] = ..., request_id: _Optional[str] = ..., extra_chats: _Optional[_Iterable[_Union[_generation_pb2.ChatInput, _Mapping]]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("choices", "prompt_tokens", "model", "system_fingerprint")
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    choices: _containers.RepeatedCompositeFieldContainer[ScoredChoice]
    prompt_tokens: int
    model: str
    system_fingerprint: str
    def __init__(self, choices: _Optional[_Iterable[_Union[ScoredChoice, _Mapping]]] = ..., prompt_tokens: _Optional[int] = ..., model: _Optional[str] = ..., system_fingerprint: _Optional[str] = ...) -> None: ...

class ScoredChoice(_message.Message):
    __slots__ = ("index", "next", "prompt_tokens")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    index: int
    next: _generation_pb2.TokenScore
    prompt_tokens: int
    def __init__(self, index: _Optional[int] = ..., next: _Optional[_Union[_generation_pb2.TokenScore, _Mapping]] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...
