"""Tool calling on /v1/chat/completions: OpenAI's tools, tool_choice and
tool turns to the contract, and the engine's ToolCallDelta fragments back to
OpenAI's shapes. Only the JSON shape is checked here; which tools, schemas
and histories are valid is the engine's to say (requests/tools.py)."""

from __future__ import annotations

import json

from millm.v1 import generation_pb2, generation_service_pb2
from rest_bridge.errors import OpenAIError
from rest_bridge.protocol.chat import ChatCompletionRequest, ChatMessage

_MODES = {
    "none": generation_pb2.TOOL_CHOICE_MODE_NONE,
    "auto": generation_pb2.TOOL_CHOICE_MODE_AUTO,
    "required": generation_pb2.TOOL_CHOICE_MODE_REQUIRED,
}


def unsupported_tool(i: int, kind: str) -> OpenAIError:
    # Built-in tools (web search, file search, computer use) have no place in the contract.
    return OpenAIError(400, f"Tools of type '{kind}' are not supported; only function tools "
                       "are.", param=f"tools[{i}].type", code="field_not_honoured")


def add_tool(tools, i: int, kind: str, name: str, description: str | None,
             parameters, strict: bool | None) -> None:
    """One function tool into `tools` (a FunctionTool list). Chat nests the
    function under `function`, the Responses API does not; both land here."""
    if kind != "function":
        raise unsupported_tool(i, kind)
    out = tools.add(name=name, description=description or "")
    if parameters is not None:
        out.parameters_json = json.dumps(parameters, separators=(",", ":"))
    if strict is not None:
        out.strict = strict


def set_choice(target: generation_pb2.ToolChoice, choice: str | None, named: str | None,
               shape: str) -> None:
    """tool_choice as a mode string, or a named function (`named`; `shape` is
    how the route spells a named choice, for the error)."""
    if isinstance(choice, str):
        if choice not in _MODES:
            raise OpenAIError(400, f"'tool_choice' must be none, auto, required or a named "
                              f"function; got '{choice}'.", param="tool_choice",
                              code="invalid_parameter")
        target.mode = _MODES[choice]
    elif named is not None:
        target.mode = generation_pb2.TOOL_CHOICE_MODE_FUNCTION
        target.function_name = named
    else:
        raise OpenAIError(400, f"'tool_choice' must name a function: {shape}.",
                          param="tool_choice", code="invalid_parameter")


def add_to_request(request: ChatCompletionRequest,
                   pb: generation_service_pb2.GenerateRequest) -> None:
    for i, tool in enumerate(request.tools or ()):
        fn = tool.function
        if fn is None:
            raise unsupported_tool(i, tool.type)
        add_tool(pb.tools, i, tool.type, fn.name, fn.description, fn.parameters, fn.strict)
    choice = request.tool_choice
    if choice is not None:
        named = (choice.function.name if not isinstance(choice, str) and choice.type == "function"
                 and choice.function is not None else None)
        set_choice(pb.tool_choice, choice, named,
                   '{"type": "function", "function": {"name": ...}}')
    if request.parallel_tool_calls is not None:
        pb.parallel_tool_calls = request.parallel_tool_calls


def message_calls(message: ChatMessage, where: str) -> list[generation_pb2.ToolCall]:
    calls = []
    for j, call in enumerate(message.tool_calls or ()):
        if call.type != "function":
            raise OpenAIError(400, f"Tool calls of type '{call.type}' are not supported.",
                              param=f"{where}.tool_calls[{j}].type", code="invalid_parameter")
        calls.append(generation_pb2.ToolCall(id=call.id, name=call.function.name,
                                             arguments_json=call.function.arguments))
    return calls


def fold(calls: dict[int, dict], fragments) -> None:
    """Add ToolCallDelta fragments to a choice's calls (by call index)."""
    for f in fragments:
        if f.id:
            calls[f.index] = {"id": f.id, "type": "function",
                              "function": {"name": f.name, "arguments": f.arguments}}
        elif f.index in calls:
            calls[f.index]["function"]["arguments"] += f.arguments


def stream_fragments(fragments) -> list[dict]:
    """OpenAI's streamed shape: the first fragment of a call names it."""
    out = []
    for f in fragments:
        if f.id:
            out.append({"index": f.index, "id": f.id, "type": "function",
                        "function": {"name": f.name, "arguments": f.arguments}})
        else:
            out.append({"index": f.index, "function": {"arguments": f.arguments}})
    return out
