"""A Responses request's tools as coding agents send them (Codex CLI first),
translated into the contract's flat FunctionTool list, and the names the
model calls mapped back to what the client dispatches on.

- `function`: as it is.
- `namespace`: a group of function (and custom) tools. The contract's tools
  are flat, so each member is offered under one name that joins the two
  (`offered_name`); a call of it comes back as a function_call item with the
  member's own `name` and the group's `namespace`, which is how Codex looks
  up its handler.
- `custom`: a freeform tool whose input is text, with its grammar
  (FunctionTool.custom): the engine constrains it and writes the call as
  {"input": TEXT}; the bridge returns a custom_tool_call item with `input`.
- any other type (web_search, file_search, code_interpreter,
  image_generation, computer use, mcp, local_shell, ...) is a tool the
  OpenAI platform would run or whose calls have no item here: it is kept
  from the model and reported as `tools[i]`, never refused.

Only the JSON shape is judged here; names, schemas and grammars are the
engine's to accept or refuse (its refusals are mapped back to `tools[i]...`
by `ToolMap.origins`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from millm.v1 import generation_pb2
from rest_bridge.errors import OpenAIError
from rest_bridge.protocol.responses import SERVED_TOOL_TYPES, ResponsesRequest
from rest_bridge.serving import tool_calls

MAX_NAME = 64
_SYNTAX = {"lark": generation_pb2.CUSTOM_TOOL_SYNTAX_LARK,
           "regex": generation_pb2.CUSTOM_TOOL_SYNTAX_REGEX}
FUNCTION, CUSTOM = "function", "custom"


def offered_name(namespace: str, name: str) -> str:
    """The one name a namespace's member is offered under: the two joined by
    "__" (no second separator when the namespace already ends in one, as
    Codex's `mcp__server__` do), cut to 64 characters with a hash when
    longer. A top-level tool keeps its own name."""
    if not namespace:
        return name
    joined = namespace + name if namespace.endswith("__") else f"{namespace}__{name}"
    if len(joined) <= MAX_NAME:
        return joined
    digest = hashlib.sha256(joined.encode()).hexdigest()[:8]
    return f"{joined[:MAX_NAME - 9]}_{digest}"


def _missing(param: str) -> OpenAIError:
    return OpenAIError(400, f"Missing required parameter: '{param}'.", param=param,
                       code="missing_required_parameter")


@dataclass
class ToolMap:
    """What the offered names stand for, and where each came from."""

    # offered name -> (FUNCTION or CUSTOM, namespace, the tool's own name)
    names: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    # the contract's tools[k] -> the client's location (tools[4].tools[1])
    origins: list[str] = field(default_factory=list)
    hosted: list[str] = field(default_factory=list)  # locations reported

    def kind(self, offered: str) -> tuple[str, str, str]:
        return self.names.get(offered, (FUNCTION, "", offered))


def add_tools(request: ResponsesRequest, out) -> ToolMap:
    """The request's tools into `out` (a FunctionTool list)."""
    found = ToolMap()

    def add(tool, where: str, namespace: str = "") -> None:
        if tool.name is None:
            raise _missing(f"{where}.name")
        offered = offered_name(namespace, tool.name)
        if tool.type == CUSTOM:
            pb = out.add(name=offered, description=tool.description or "")
            pb.custom.SetInParent()
            fmt = tool.format
            if fmt is not None and fmt.type == "grammar":
                if fmt.syntax not in _SYNTAX:
                    raise OpenAIError(400, f"'{where}.format.syntax' must be lark or regex.",
                                      param=f"{where}.format.syntax", code="invalid_parameter")
                if fmt.definition is None:
                    raise _missing(f"{where}.format.definition")
                pb.custom.syntax = _SYNTAX[fmt.syntax]
                pb.custom.definition = fmt.definition
            elif fmt is not None and fmt.type != "text":
                raise OpenAIError(400, f"'{where}.format.type' must be text or grammar.",
                                  param=f"{where}.format.type", code="invalid_parameter")
        else:
            # A Responses function tool is strict unless it says otherwise
            # (OpenAI's default, which the response's echo shows too).
            tool_calls.add_tool(out, len(found.origins), tool.type, offered, tool.description,
                                tool.parameters, tool.strict is not False)
        found.names[offered] = (tool.type, namespace, tool.name)
        found.origins.append(where)

    for i, tool in enumerate(request.tools or ()):
        where = f"tools[{i}]"
        if tool.type == "namespace":
            if tool.name is None:
                raise _missing(f"{where}.name")
            for j, member in enumerate(tool.tools or ()):
                if member.type not in (FUNCTION, CUSTOM):
                    raise OpenAIError(400, f"A namespace holds function and custom tools; "
                                      f"got '{member.type}'.", param=f"{where}.tools[{j}].type",
                                      code="invalid_parameter")
                add(member, f"{where}.tools[{j}]", tool.name)
        elif tool.type in SERVED_TOOL_TYPES:
            add(tool, where)
        else:
            found.hosted.append(where)
    return found


def set_choice(request: ResponsesRequest, target: generation_pb2.ToolChoice,
               tools: ToolMap) -> None:
    """tool_choice: a mode, or a named function or custom tool (a namespace
    member by its namespace and name, or by its name when that is unique)."""
    choice = request.tool_choice
    named = None
    if not isinstance(choice, str) and choice.type in (FUNCTION, CUSTOM):
        named = choice.name
        if named is not None and choice.namespace:
            named = offered_name(choice.namespace, named)
        elif named is not None and named not in tools.names:
            members = [o for o, (_, ns, own) in tools.names.items() if ns and own == named]
            named = members[0] if len(members) == 1 else named
    elif not isinstance(choice, str) and choice.type not in SERVED_TOOL_TYPES:
        raise OpenAIError(400, f"'tool_choice' names a '{choice.type}' tool, which this server "
                          "does not run.", param="tool_choice.type", code="field_not_honoured")
    tool_calls.set_choice(target, choice, named, '{"type": "function", "name": ...}')


_OPEN = '{"input": "'


def custom_input(arguments_json: str) -> str:
    """A custom tool call's input from the arguments the model wrote
    ({"input": TEXT}). A call cut short (max_output_tokens) gives the text
    written so far; anything else is shown as it is."""
    try:
        value = json.loads(arguments_json)
    except ValueError:
        value = None
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return value["input"]
    if arguments_json.startswith(_OPEN):
        body = arguments_json[len(_OPEN):]
        for cut in range(min(len(body), 6) + 1):  # a dangling escape: \, \u00
            try:
                return json.loads('"' + body[:len(body) - cut] + '"')
            except ValueError:
                continue
    return arguments_json

