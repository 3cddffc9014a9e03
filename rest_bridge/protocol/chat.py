"""POST /v1/chat/completions request schema."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rest_bridge.protocol.base import GenerationFields, OpenAIBaseModel


class TextContentPart(OpenAIBaseModel):
    type: str
    text: str | None = None


class ChatMessage(OpenAIBaseModel):
    # Any string: the engine decides which roles exist and names the bad one.
    role: str
    content: str | list[TextContentPart] | None = None
    name: str | None = None


class JsonSchemaSpec(OpenAIBaseModel):
    name: str
    strict: bool | None = None
    # "schema" would shadow a BaseModel attribute, hence the alias.
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None


class ResponseFormat(OpenAIBaseModel):
    type: str
    json_schema: JsonSchemaSpec | None = None


class ChatCompletionRequest(GenerationFields):
    messages: list[ChatMessage]
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    # miLLM extension: more conversations, each answered as its own choices.
    extra_messages: list[list[ChatMessage]] | None = None
