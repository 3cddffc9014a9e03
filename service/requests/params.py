"""A request as its caller sent it, before any rule is checked.

The servicers translate protobuf into these values (None means "not sent");
requests/checks.py and requests/generation.py turn them into the typed value
the engine runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from service.requests.fields import CHAT, COMPLETIONS
from service.requests.tools import FunctionTool, ToolCallRecord, ToolChoice
from service.steering.readout import ActivationRequest

# OpenAI's message roles; the contract's Role enum maps onto them one to one.
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")



@dataclass(frozen=True)
class ChatTurn:
    role: str  # one of CHAT_ROLES, or "" when the caller left it unset
    content: str
    name: str = ""
    tool_calls: tuple[ToolCallRecord, ...] = ()  # an assistant turn's calls
    tool_call_id: str = ""  # a tool turn: the call it answers
    reasoning_content: str = ""  # an assistant turn's reasoning, for the template


@dataclass(frozen=True)
class ResponseFormat:
    """response_format json_object or json_schema (free text is None)."""

    kind: str  # JSON_OBJECT or JSON_SCHEMA
    name: str = ""
    schema_json: str = ""  # the schema as sent, parsed by the checks


@dataclass(frozen=True)
class StructuredOutputs:
    """vLLM's structured_outputs as sent: its one kind and that kind's value
    (JSON or structural-tag text, a pattern, a grammar, the choices)."""

    kind: str  # json, regex, choice, grammar, structural_tag or json_object
    value: str | tuple[str, ...] | bool


# What text_chars counts for each turn, call, tool and prompt beyond its text.
MARKUP_CHARS = 64


@dataclass(frozen=True)
class GenerateParams:
    """A generation request as the caller sent it: None means "not sent"."""

    model: str
    messages: tuple[ChatTurn, ...] | None = None
    # Each prompt is text or a tuple of token ids.
    prompts: tuple[str | tuple[int, ...], ...] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: tuple[str, ...] = ()
    n: int | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    request_id: str = ""
    # Read special-token text in raw prompts as special tokens (opt-in).
    parse_special_tokens: bool = False
    # OpenAI fields with no place in the contract, with their JSON values.
    extra_fields: dict = field(default_factory=dict)
    # Nested locations the caller found unused while translating its format.
    unused_fields: tuple[str, ...] = ()
    user: str | None = None
    strict: bool = False
    # The caller relays pieces as they come (REST stream: true).
    stream: bool = False
    response_format: ResponseFormat | None = None
    # Log-probabilities: alternatives per token (None = not asked for).
    logprobs: int | None = None
    allowed_token_ids: tuple[int, ...] = ()
    # OpenAI's logit_bias: token id -> value added to its logit.
    logit_bias: dict[int, float] | None = None
    echo: bool = False
    add_special_tokens: bool | None = None
    # More conversations (extra_messages), each answered as its own choices.
    extra_chats: tuple[tuple[ChatTurn, ...], ...] = ()
    # Steering for this request only: a profile name, and the dial as sent
    # (a number or "off"/"min"/"max").
    profile: str | None = None
    steering_intensity: float | str | None = None
    sae_activations: ActivationRequest | None = None
    # The unsteered completion beside the steered one (generation/compare.py).
    steering_compare: bool = False
    # Streamed: tokens per message after the first (servicers/generation_replies.py).
    stream_interval: int | None = None
    # Scheduling class: lower starts first; above 0 is background (admission.py).
    priority: int | None = None
    # The caller reads the answer whole (GenerateRequest.coalesce, not streamed).
    whole: bool = False
    # Chat only: functions the model may call, and how.
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # Chat only: reasoning (requests/reasoning.py).
    reasoning_effort: str | None = None
    thinking_token_budget: int | None = None
    chat_template_kwargs: dict | None = None
    # Constraints besides response_format (requests/constraints.py): vLLM's
    # structured_outputs, and llama.cpp's top-level grammar as sent (any JSON
    # value: it arrives among the extra fields).
    structured_outputs: StructuredOutputs | None = None
    grammar: object = None

    @property
    def input_param(self) -> str:
        return "messages" if self.messages is not None else "prompt"

    @property
    def route(self) -> str:
        return CHAT if self.messages is not None else COMPLETIONS

    @property
    def text_chars(self) -> int:
        """About how many characters rendering and tokenizing this request
        reads, what that work grows with: its turns, the calls and tools
        written into them and its prompts, each counted at least
        MARKUP_CHARS for the template's markup around it (so ten thousand
        empty turns are not free)."""
        turns = sum(MARKUP_CHARS + len(t.content) + len(t.reasoning_content) + len(t.name)
                    + sum(MARKUP_CHARS + len(c.name) + len(c.arguments_json)
                          for c in t.tool_calls)
                    for _, conversation in self.conversations() for t in conversation)
        tools = sum(MARKUP_CHARS + len(t.name) + len(t.description) + len(t.parameters_json)
                    for t in self.tools)
        prompts = sum(MARKUP_CHARS + len(p) for p in self.prompts or ())
        return turns + tools + prompts

    def conversations(self) -> list[tuple[str, tuple[ChatTurn, ...]]]:
        """(JSON location, turns) of every conversation of a chat request."""
        if self.messages is None:
            return []
        return [("messages", self.messages),
                *((f"extra_messages[{k}]", turns) for k, turns in enumerate(self.extra_chats))]

    def sent_fields(self) -> dict:
        """Every field the field table rules on (requests/fields.py), by its
        OpenAI name: the contract's own fields that were sent, then the extra
        fields with their JSON values."""
        contract = {
            "n": self.n, "seed": self.seed, "max_completion_tokens": self.max_completion_tokens,
            "response_format": self.response_format, "logprobs": self.logprobs,
            "allowed_token_ids": self.allowed_token_ids or None,
            "logit_bias": self.logit_bias or None, "echo": self.echo or None,
            "extra_messages": self.extra_chats or None, "profile": self.profile,
            "steering_intensity": self.steering_intensity,
            "return_sae_activations": self.sae_activations,
            "steering_compare": self.steering_compare or None,
            "stream_interval": self.stream_interval,
            "priority": self.priority,
            "add_special_tokens": self.add_special_tokens,
            "tools": self.tools or None, "tool_choice": self.tool_choice,
            "parallel_tool_calls": self.parallel_tool_calls,
            "reasoning_effort": self.reasoning_effort,
            "thinking_token_budget": self.thinking_token_budget,
            "chat_template_kwargs": self.chat_template_kwargs,
            "structured_outputs": self.structured_outputs, "grammar": self.grammar,
        }
        sent = {name: value for name, value in contract.items() if value is not None}
        sent.update(self.extra_fields)
        return sent


@dataclass(frozen=True)
class EmbedParams:
    model: str
    inputs: tuple[str | tuple[int, ...], ...]
    request_id: str = ""
    extra_fields: dict = field(default_factory=dict)
    unused_fields: tuple[str, ...] = ()
    user: str | None = None
    strict: bool = False
