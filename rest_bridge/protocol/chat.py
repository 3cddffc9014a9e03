"""POST /v1/chat/completions request schema."""

from __future__ import annotations

from rest_bridge.protocol.base import GenerationFields, OpenAIBaseModel


class TextContentPart(OpenAIBaseModel):
    type: str
    text: str | None = None


class ChatMessage(OpenAIBaseModel):
    # Any string: the engine decides which roles exist and names the bad one.
    role: str
    content: str | list[TextContentPart] | None = None
    name: str | None = None


class ChatCompletionRequest(GenerationFields):
    messages: list[ChatMessage]
