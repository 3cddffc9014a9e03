"""Anthropic's Messages API request schemas: POST /v1/messages and
/v1/messages/count_tokens.

Only the JSON shape is checked here (types, the required fields), with the
same strict base as the OpenAI routes: keys the schema does not declare are
kept, so the engine's field table judges the top-level ones by name (say
`output_format`) and nested ones are reported as unused (say a block's
`cache_control`: the prefix cache needs no marker). What coding agents send
(Claude Code: `system` turns inside `messages`, adaptive thinking with its
`display`, `output_config.effort`, `context_management`, tools with
`defer_loading` and the `tool_reference` blocks that load them) is declared
here, so the translation maps it rather than the engine refusing it by name.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rest_bridge.protocol.base import Int64, OpenAIBaseModel


class ContentBlock(OpenAIBaseModel):
    """One block of a message's content. Which keys a type needs is the
    translation's to check (serving/messages_input.py): `text` for text,
    `id`, `name`, `input` for tool_use, `tool_use_id` and `content` for
    tool_result, `thinking` for thinking."""

    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[ContentBlock] | None = None
    is_error: bool | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None  # redacted_thinking
    tool_name: str | None = None  # tool_reference (inside a tool_result's content)


class Message(OpenAIBaseModel):
    # Any string: the translation names a role other than user, assistant or system.
    role: str
    content: str | list[ContentBlock]


class Tool(OpenAIBaseModel):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    # Absent or "custom" for a client tool; Anthropic's server tools
    # (web_search_..., bash_..., text_editor_...) are refused by type.
    type: str | None = None
    # Left out of the prompt until a tool_reference block loads it.
    defer_loading: bool | None = None


class ToolChoice(OpenAIBaseModel):
    type: str  # auto, any, tool, none
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(OpenAIBaseModel):
    type: str  # enabled (with budget_tokens), adaptive, disabled
    budget_tokens: Int64 | None = None
    display: str | None = None  # summarized (the default here) or omitted


class OutputConfig(OpenAIBaseModel):
    effort: str | None = None  # low, medium, high, xhigh, max
    format: dict[str, Any] | None = None  # structured output: refused by the engine


class ContextEdit(OpenAIBaseModel):
    type: str  # clear_thinking_20251015 (done), clear_tool_uses_20250919 (reported)
    # clear_thinking: "all", {"type": "all"} or {"type": "thinking_turns", "value": N}.
    keep: str | dict[str, Any] | None = None


class ContextManagement(OpenAIBaseModel):
    edits: list[ContextEdit] | None = None


class Metadata(OpenAIBaseModel):
    user_id: str | None = None


class MessagesInput(OpenAIBaseModel):
    """What a generation and a token count share: the prompt as rendered."""

    model: str
    messages: list[Message]
    system: str | list[ContentBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    # A reasoning model's thinking (what the prompt renders can depend on it).
    thinking: Thinking | None = None
    # effort is the model's reasoning effort (what a template renders can depend on it).
    output_config: OutputConfig | None = None
    # clear_thinking changes which thinking blocks the prompt holds.
    context_management: ContextManagement | None = None
    # miLLM's steering extensions (extra fields to the Anthropic SDKs): a
    # steered prompt renders the same, so a count takes them too.
    profile: str | None = None
    steering_intensity: float | str | None = None
    # Declares no activations field, so none goes unmapped
    # (serving/steering_fields.py reads this).
    UNMAPPED: ClassVar[frozenset[str]] = frozenset()


class MessagesRequest(MessagesInput):
    # vLLM's scheduling class, as on the other generation routes (batch lines).
    priority: Int64 | None = None
    max_tokens: Int64
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int64 | None = None
    metadata: Metadata | None = None
    # miLLM's extension (an extra field to the Anthropic SDKs).
    seed: Int64 | None = None


class CountTokensRequest(MessagesInput):
    pass
