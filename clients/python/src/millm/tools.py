"""Tool calling for millm.client: tools and tool_choice into their protobuf
messages, and streamed ToolCallDelta fragments folded into whole calls.

Tools, tool calls and tool_choice may be given flat or in OpenAI's shape:

    {"name": "get_weather", "description": "...", "parameters": {...}}
    {"type": "function", "function": {"name": "get_weather", "parameters": {...}}}
    {"id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
    {"id": "call_1", "type": "function", "function": {"name": ..., "arguments": ...}}
    "none" | "auto" | "required" | "get_weather" | {"type": "function", "function": {"name": ...}}
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from millm.v1 import generation_pb2


@dataclass(frozen=True)
class ToolCall:
    """One call of a function tool; `arguments` is a JSON object as text."""

    id: str
    name: str
    arguments: str

    def parsed_arguments(self):
        """The arguments as Python values (json.loads)."""
        return json.loads(self.arguments) if self.arguments else {}


@dataclass(frozen=True)
class ToolCallFragment:
    """A streamed piece of a tool call (millm.v1.ToolCallDelta): a call's first
    fragment carries its id and name, later ones pieces of its arguments."""

    index: int
    id: str
    name: str
    arguments: str


def fold_tool_calls(calls: Iterable[ToolCall],
                    fragments: Iterable[ToolCallFragment]) -> list[ToolCall]:
    """The calls of one choice after `fragments`: a fragment at the next index
    starts a call, one at a known index appends its arguments (and fills an id
    or name still empty). An index past the next one means fragments were lost."""
    out = list(calls)
    for f in fragments:
        if f.index == len(out):
            out.append(ToolCall(f.id, f.name, f.arguments))
        elif 0 <= f.index < len(out):
            old = out[f.index]
            out[f.index] = ToolCall(old.id or f.id, old.name or f.name,
                                    old.arguments + f.arguments)
        else:
            raise ValueError(f"tool call fragment for index {f.index} before "
                             f"index {len(out)} started")
    return out


def fragments(delta) -> tuple[ToolCallFragment, ...]:
    """The fragments of a millm.v1.ChoiceDelta."""
    return tuple(ToolCallFragment(t.index, t.id, t.name, t.arguments) for t in delta.tool_calls)


def _function(item) -> dict:
    return item["function"] if isinstance(item, dict) and "function" in item else item


def _json_text(value) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def function_tool(tool) -> generation_pb2.FunctionTool:
    """A millm.v1.FunctionTool from a dict (`parameters` a JSON Schema dict or
    JSON text) or a FunctionTool as it is."""
    if isinstance(tool, generation_pb2.FunctionTool):
        return tool
    spec = _function(tool)
    out = generation_pb2.FunctionTool(name=spec["name"],
                                      description=spec.get("description") or "",
                                      parameters_json=_json_text(spec.get("parameters")))
    if spec.get("strict") is not None:
        out.strict = spec["strict"]
    return out


_MODES = {"none": generation_pb2.TOOL_CHOICE_MODE_NONE,
          "auto": generation_pb2.TOOL_CHOICE_MODE_AUTO,
          "required": generation_pb2.TOOL_CHOICE_MODE_REQUIRED}


def tool_choice(choice) -> generation_pb2.ToolChoice:
    """A millm.v1.ToolChoice from "none", "auto", "required", a function's name,
    or OpenAI's {"type": "function", "function": {"name": ...}}."""
    if isinstance(choice, generation_pb2.ToolChoice):
        return choice
    if isinstance(choice, str) and choice in _MODES:
        return generation_pb2.ToolChoice(mode=_MODES[choice])
    name = choice if isinstance(choice, str) else _function(choice)["name"]
    return generation_pb2.ToolChoice(mode=generation_pb2.TOOL_CHOICE_MODE_FUNCTION,
                                     function_name=name)


def tool_call(call) -> generation_pb2.ToolCall:
    """A millm.v1.ToolCall from a ToolCall or a dict (`arguments` JSON text or a dict)."""
    if isinstance(call, ToolCall):
        return generation_pb2.ToolCall(id=call.id, name=call.name, arguments_json=call.arguments)
    spec = _function(call)
    return generation_pb2.ToolCall(id=call.get("id") or "", name=spec["name"],
                                   arguments_json=_json_text(spec.get("arguments")))
