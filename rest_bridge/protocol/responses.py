"""POST /v1/responses request schema (OpenAI's Responses API).

Only the JSON shape is declared here. Item and tool types stay free strings
so that an unserved one is refused by name (`input[2].type`) by the
translation, not lost in a union error. The fields it shares with chat
(sampling, stop, steering) are declared once, in base.SharedFields, so they
are typed by the same rules on both routes. Fields the Responses API has and
this schema does not declare (`background`, `truncation`, `include`,
`reasoning`, ...) travel to the engine as extra fields, where the field
table refuses or reports them like any other; so does
`return_sae_activations`, once its shape is checked (UNMAPPED).

Tools come in the shapes Codex and the other agents send (function,
namespace, custom and the hosted types); serving/responses_tools.py says
what becomes of each.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from rest_bridge.protocol.base import Int64, OpenAIBaseModel, SharedFields


class ContentPart(OpenAIBaseModel):
    type: str
    text: str | None = None


class InputItem(OpenAIBaseModel):
    """Any input item: a message (type "message", or no type with a role), a
    function_call or a function_call_output; which fields apply depends on
    the type."""

    type: str | None = None
    id: str | None = None
    status: str | None = None
    # message
    role: str | None = None
    content: str | list[ContentPart] | None = None
    # function_call and function_call_output (and the custom_tool_call pair)
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[ContentPart] | None = None
    # function_call: the namespace tool the function is in
    namespace: str | None = None
    # custom_tool_call: the text the model wrote
    input: str | None = None
    # reasoning: its text as reasoning_text content parts (summary parts are
    # read when it has none; encrypted content is never produced here)
    summary: list[ContentPart] | None = None
    encrypted_content: str | None = None


class CustomFormat(OpenAIBaseModel):
    """A custom tool's input: {"type": "text"}, or a grammar in "lark" or
    "regex" syntax."""

    type: str
    syntax: str | None = None
    definition: str | None = None


class FunctionToolSpec(OpenAIBaseModel):
    """A tool, flat as the Responses API has it: a function, a custom tool
    (`format`), a namespace of them (`tools`), or a hosted type whose own
    fields stay undeclared (they are reported with the tool)."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    format: CustomFormat | None = None
    tools: list[FunctionToolSpec] | None = None


class ToolChoiceSpec(OpenAIBaseModel):
    type: str
    name: str | None = None
    namespace: str | None = None


class TextFormat(OpenAIBaseModel):
    type: str
    name: str | None = None
    # "schema" would shadow a BaseModel attribute, hence the alias.
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(OpenAIBaseModel):
    format: TextFormat | None = None


class ReasoningConfig(OpenAIBaseModel):
    # The engine checks the value (OpenAI's set).
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesRequest(SharedFields):
    """Its own fields; those it shares with chat (sampling, stop, steering)
    are protocol/base.py's SharedFields."""

    # A response has no place for SAE activations: checked like chat's, then
    # refused by the engine as a field this request cannot map.
    UNMAPPED: ClassVar[frozenset[str]] = frozenset({"return_sae_activations",
                                                     "steering_compare"})

    input: str | list[InputItem] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    max_output_tokens: Int64 | None = None
    tools: list[FunctionToolSpec] | None = None
    tool_choice: str | ToolChoiceSpec | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    # reasoning.encrypted_content is the bridge's (responses_tools.py); the
    # rest travel to the engine's field table.
    include: list[str] | None = None
    # A prefix-affinity hint for the bridge's router (routing/prefix.py).
    prompt_cache_key: str | None = None
    # As on chat completions (the engine judges them).
    thinking_token_budget: Int64 | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # A stored prompt template (OpenAI's dashboard prompts): nothing to load here.
    prompt: Any = None

    def nested_unused(self) -> list[str]:
        """As the base's, less the fields inside hosted tools: such a tool is
        reported whole (`tools[i]`)."""
        hosted = tuple(f"tools[{i}]." for i, tool in enumerate(self.tools or ())
                       if tool.type not in SERVED_TOOL_TYPES)
        return [loc for loc in super().nested_unused() if not loc.startswith(hosted)]


# The tool types whose calls this server can return (any other is hosted).
SERVED_TOOL_TYPES = frozenset({"function", "custom", "namespace"})
