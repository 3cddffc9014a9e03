"""POST /v1/chat/completions request schema."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rest_bridge.protocol.base import GenerationFields, Int64, OpenAIBaseModel


class TextContentPart(OpenAIBaseModel):
    type: str
    text: str | None = None


class FunctionCall(OpenAIBaseModel):
    name: str
    # A JSON object as a string (the engine checks that it parses).
    arguments: str


class MessageToolCall(OpenAIBaseModel):
    id: str
    type: str = "function"
    function: FunctionCall


class ChatMessage(OpenAIBaseModel):
    # Any string: the engine decides which roles exist and names the bad one.
    role: str
    content: str | list[TextContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    # An assistant turn's reasoning, as this server returned it (vLLM's newer
    # name `reasoning` too); the chat template keeps or drops it.
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionSpec(OpenAIBaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(OpenAIBaseModel):
    type: str
    function: FunctionSpec | None = None


class NamedFunction(OpenAIBaseModel):
    name: str


class NamedToolChoice(OpenAIBaseModel):
    type: str
    function: NamedFunction | None = None


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
    top_logprobs: Int64 | None = None
    # miLLM extension: more conversations, each answered as its own choices.
    extra_messages: list[list[ChatMessage]] | None = None
    tools: list[ChatTool] | None = None
    tool_choice: str | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # Reasoning models (the engine checks the values: requests/reasoning.py).
    reasoning_effort: str | None = None
    thinking_token_budget: Int64 | None = None
    chat_template_kwargs: dict[str, Any] | None = None
