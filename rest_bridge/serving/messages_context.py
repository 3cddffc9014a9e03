"""What a Messages conversation decides about its own prompt: context edits
(`context_management`) and deferred tools (`defer_loading`).

Both are Anthropic betas that coding agents send on every request (Claude
Code: `context-management-2025-06-27`, `advanced-tool-use-2025-11-20`). Both
change only which parts of the body reach the prompt, so the translation
does them before the engine sees the conversation; a gRPC caller gets the
same by sending the conversation it wants rendered.

- `clear_thinking_20251015` leaves the thinking blocks of older assistant
  messages out of the prompt: `keep` is `"all"` (nothing cleared, Claude
  Code's setting), `{"type": "all"}`, or `{"type": "thinking_turns",
  "value": N}` (the last N assistant messages that think keep theirs; N
  defaults to 1). The response's `context_management.applied_edits` says
  what was cleared, in Anthropic's shape. Without the edit the chat
  template decides, as it does for chat completions.
- Other edits (`clear_tool_uses_20250919` and later ones) are thresholds on
  Anthropic's context sizes; a local window is checked whole instead
  (`context_length_exceeded`), so they are reported as ignored, never refused.
- A tool with `defer_loading: true` stays out of the prompt (and the call
  grammar) until the conversation loads it: a `tool_reference` block naming
  it in a tool_result's content (what a tool search answers), an earlier
  call of it, or a `tool_choice` that names it. A tool_reference is
  rendered in the tool result as the definition it loads, one JSON line,
  so the model reads the schema where its search found it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from rest_bridge.errors import OpenAIError
from rest_bridge.protocol.messages import ContentBlock, MessagesInput, Tool

CLEAR_THINKING = "clear_thinking_20251015"


def _invalid(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="invalid_parameter")


@dataclass
class ContextPlan:
    """Which assistant messages keep their thinking (None: all of them), the
    response's applied edits, and the locations of edits that do nothing here."""

    thinking_kept: frozenset[int] | None = None
    edits_sent: bool = False
    cleared_turns: int = 0
    clears_thinking: bool = False
    unused: list[str] = field(default_factory=list)

    def keeps_thinking(self, message_index: int) -> bool:
        return self.thinking_kept is None or message_index in self.thinking_kept

    def response_field(self) -> dict | None:
        """The Message's `context_management`, present when the request sent one.
        miLLM clears before rendering and does not render the prompt twice, so
        it does not know how many tokens the cleared blocks would have taken:
        `cleared_input_tokens` is 0 (docs/anthropic-compatibility.md)."""
        if not self.edits_sent:
            return None
        applied = []
        if self.clears_thinking and self.cleared_turns:
            applied.append({"type": CLEAR_THINKING, "cleared_thinking_turns":
                            self.cleared_turns, "cleared_input_tokens": 0})
        return {"applied_edits": applied}


def _keep_count(keep, where: str) -> int | None:
    """clear_thinking's `keep` as a number of assistant messages (None: all)."""
    if keep is None:
        return 1
    if keep == "all" or (isinstance(keep, dict) and keep.get("type") == "all"):
        return None
    if isinstance(keep, dict) and keep.get("type") == "thinking_turns":
        value = keep.get("value")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        raise _invalid(f"{where}.value", f"'{where}.value' must be a whole number of "
                       "assistant turns (0 or more).")
    raise _invalid(where, f"'{where}' must be \"all\", {{\"type\": \"all\"}} or "
                   "{\"type\": \"thinking_turns\", \"value\": N}.")


def context_plan(request: MessagesInput) -> ContextPlan:
    plan = ContextPlan()
    management = request.context_management
    if management is None:
        return plan
    plan.edits_sent = True
    for i, edit in enumerate(management.edits or ()):
        where = f"context_management.edits[{i}]"
        if edit.type != CLEAR_THINKING:
            plan.unused.append(where)
            continue
        count = _keep_count(edit.keep, f"{where}.keep")
        plan.clears_thinking = True
        if count is None:
            continue
        thinking = [k for k, m in enumerate(request.messages) if m.role == "assistant"
                    and not isinstance(m.content, str)
                    and any(b.type in ("thinking", "redacted_thinking") for b in m.content)]
        kept = thinking[len(thinking) - count:] if count else []
        plan.thinking_kept = frozenset(kept) if plan.thinking_kept is None \
            else plan.thinking_kept & frozenset(kept)
        plan.cleared_turns = len(thinking) - len(plan.thinking_kept)
    return plan


def loaded_tools(request: MessagesInput) -> set[str]:
    """Names the conversation has loaded: tool_reference blocks in tool
    results, calls already made, and a tool_choice that names one."""
    names: set[str] = set()
    for message in request.messages:
        if isinstance(message.content, str):
            continue
        for block in message.content:
            if block.type == "tool_use" and block.name is not None:
                names.add(block.name)
            elif block.type == "tool_result" and isinstance(block.content, list):
                names.update(b.tool_name for b in block.content
                             if b.type == "tool_reference" and b.tool_name is not None)
    choice = request.tool_choice
    if choice is not None and choice.type == "tool" and choice.name is not None:
        names.add(choice.name)
    return names


def offered(request: MessagesInput) -> list[tuple[int, Tool]]:
    """(body index, tool) for each tool the prompt offers now."""
    tools = request.tools or []
    if not any(t.defer_loading for t in tools):
        return list(enumerate(tools))
    loaded = loaded_tools(request)
    return [(i, t) for i, t in enumerate(tools) if not t.defer_loading or t.name in loaded]


def tool_reference_text(block: ContentBlock, where: str, request: MessagesInput) -> str:
    """A tool_reference block as the tool definition it loads (one JSON line)."""
    if block.tool_name is None:
        raise OpenAIError(400, f"Missing required parameter: '{where}.tool_name'.",
                          param=f"{where}.tool_name", code="missing_required_parameter")
    tool = next((t for t in request.tools or () if t.name == block.tool_name), None)
    if tool is None:
        raise _invalid(f"{where}.tool_name", f"'{where}.tool_name' names "
                       f"'{block.tool_name[:64]}', which is not among the tools.")
    definition = {"name": tool.name, "description": tool.description or "",
                  "parameters": tool.input_schema or {}}
    return json.dumps(definition, ensure_ascii=False, separators=(", ", ": "))
