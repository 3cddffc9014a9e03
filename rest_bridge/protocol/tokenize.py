"""POST /tokenize and /detokenize request schemas (vLLM's shapes)."""

from __future__ import annotations

from rest_bridge.protocol.base import Int64, OpenAIBaseModel
from rest_bridge.protocol.chat import ChatMessage, ChatTool


class TokenizeRequest(OpenAIBaseModel):
    model: str
    # Exactly one of the two: raw text, or a conversation for the chat template.
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    add_special_tokens: bool | None = None
    # miLLM extension, as on /v1/completions.
    parse_special_tokens: bool | None = None
    tools: list[ChatTool] | None = None
    return_token_strs: bool | None = None


class DetokenizeRequest(OpenAIBaseModel):
    model: str
    tokens: list[Int64]
