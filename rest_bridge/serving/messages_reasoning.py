"""A Messages body's `thinking` and `output_config` in the contract's
reasoning fields.

Anthropic splits what chat completions calls reasoning in two: `thinking`
says whether the model thinks (`enabled` with a token budget, `adaptive`,
`disabled`) and how the answer shows it (`display`), while
`output_config.effort` says how hard it tries. The contract has one budget
(`thinking_token_budget`) and one effort (`reasoning_effort`), which the
engine checks and passes to the chat template; this module only renames:
`disabled` is the effort "none", Anthropic's top effort `max` is the
contract's `xhigh`. `display` is presentation, so the bridge honours it on
the way out (`omitted`: thinking blocks with their text left empty, as
Anthropic returns them); the model reasons the same either way.

Which body field a contract field came from is kept in `Spelling`, so the
engine's errors and ignored-field reports name what the client sent
("output_config.effort", not reasoning_effort).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from millm.v1 import generation_service_pb2
from rest_bridge.errors import OpenAIError
from rest_bridge.protocol.messages import MessagesInput

# Anthropic's effort names that the contract spells otherwise.
_EFFORTS = {"max": "xhigh"}
# Display modes that show the reasoning (summarized is Anthropic's default;
# miLLM has no summarizer, so the whole reasoning is the faithful reading).
SHOWN, OMITTED = ("summarized", "display"), "omitted"


@dataclass
class Spelling:
    """Contract field -> the body's name for it, for this request."""

    names: dict[str, str] = field(default_factory=lambda: {
        "thinking_token_budget": "thinking.budget_tokens", "reasoning_effort": "thinking"})
    # The body's thinking.display asked for the reasoning's text to be left out.
    omit_thinking: bool = False

    def reported(self, name: str) -> str:
        """A reported contract field as the field table names the body's
        ("thinking" for the budget, "output_config" for its effort: the
        whole setting changed nothing)."""
        if name == "thinking_token_budget":
            return "thinking"
        if name in self.names:
            return self.names[name].removesuffix(".effort")
        return name


def _invalid(param: str, message: str, code: str = "invalid_parameter") -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def add_reasoning(request: MessagesInput, pb: generation_service_pb2.GenerateRequest,
                  unused: list[str]) -> Spelling:
    """`thinking` and `output_config.effort` into `pb`; what changes nothing
    is added to `unused`."""
    spelling = Spelling()
    thinking = request.thinking
    if thinking is not None:
        if thinking.type == "enabled":
            if thinking.budget_tokens is None:
                raise _invalid("thinking.budget_tokens", "Missing required parameter: "
                               "'thinking.budget_tokens'.", "missing_required_parameter")
            pb.thinking_token_budget = thinking.budget_tokens
        elif thinking.type == "disabled":
            pb.reasoning_effort = "none"
        elif thinking.type != "adaptive":
            raise _invalid("thinking.type", "'thinking.type' must be enabled, adaptive or "
                           f"disabled; got '{thinking.type[:64]}'.")
        if thinking.display == OMITTED:
            spelling.omit_thinking = thinking.type != "disabled"
        elif thinking.display is not None and thinking.display not in SHOWN:
            # A newer display mode: the reasoning is shown whole, and the client told.
            unused.append("thinking.display")
    config = request.output_config
    if config is not None and config.effort is not None:
        if pb.HasField("reasoning_effort"):
            # Thinking switched off wins: there is no reasoning to spend effort on.
            unused.append("output_config.effort")
        else:
            pb.reasoning_effort = _EFFORTS.get(config.effort, config.effort)
            spelling.names["reasoning_effort"] = "output_config.effort"
    return spelling


def output_format(request: MessagesInput) -> dict | None:
    """`output_config.format` (structured output), for the engine to judge
    under Anthropic's older top-level name `output_format`."""
    config = request.output_config
    return config.format if config is not None else None
