"""A Responses API request, translated: its input items into the contract's
ResponseItems, the conversation (replayed items, then the new ones) into the
GenerateRequest that GenerationService already serves, and the engine's
refusals back to the locations the client wrote.

Only the JSON shape is judged here: which item, content and tool types have
a place in the contract. Whether a conversation, a tool or a value is valid
is the engine's to say; `Origins` maps its `messages[k]...` back to
`input[i]...`, `instructions` or `previous_response_id`.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from millm.v1 import generation_pb2, generation_service_pb2
from millm.v1 import response_service_pb2 as rpb
from rest_bridge.errors import OpenAIError
from rest_bridge.protocol.responses import ContentPart, ResponsesRequest
from rest_bridge.serving import responses_tools
from rest_bridge.serving.chat import add_reasoning_fields, response_format_pb
from rest_bridge.serving.responses_json import decrypted_reasoning

ROLES = {"user": generation_pb2.ROLE_USER, "system": generation_pb2.ROLE_SYSTEM,
         "developer": generation_pb2.ROLE_DEVELOPER, "assistant": generation_pb2.ROLE_ASSISTANT}
PART_TYPES = {"input_text": rpb.CONTENT_PART_TYPE_INPUT_TEXT,
              "output_text": rpb.CONTENT_PART_TYPE_OUTPUT_TEXT}
_SAMPLING = ("temperature", "top_p", "seed", "top_k", "min_p", "frequency_penalty",
             "presence_penalty", "repetition_penalty")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _missing(param: str) -> OpenAIError:
    return OpenAIError(400, f"Missing required parameter: '{param}'.", param=param,
                       code="missing_required_parameter")


def _text_parts(parts: str | list[ContentPart], where: str, default_type: int,
                allowed: tuple[str, ...]) -> list[rpb.ContentPart]:
    if isinstance(parts, str):
        return [rpb.ContentPart(type=default_type, text=parts)]
    out = []
    for j, part in enumerate(parts):
        if part.type not in allowed:
            # The contract carries text; an image or file would answer another question.
            raise OpenAIError(400, f"Content parts of type '{part.type}' are not supported; "
                              f"only {' and '.join(allowed)} parts are.",
                              param=f"{where}[{j}].type", code="unsupported_content_type")
        if part.text is None:
            raise _missing(f"{where}[{j}].text")
        out.append(rpb.ContentPart(type=PART_TYPES[part.type], text=part.text))
    return out


def input_items(request: ResponsesRequest, unused: list[str]) -> list[rpb.ResponseItem]:
    """The request's input as items, each with a fresh id; what it holds that
    nothing reads is appended to `unused`."""
    if request.input is None:
        return []
    if isinstance(request.input, str):
        return [rpb.ResponseItem(id=new_id("msg"), message=rpb.MessageItem(
            role=generation_pb2.ROLE_USER,
            content=[rpb.ContentPart(type=rpb.CONTENT_PART_TYPE_INPUT_TEXT,
                                     text=request.input)]))]
    items = []
    for i, item in enumerate(request.input):
        where = f"input[{i}]"
        kind = item.type or ("message" if item.role is not None else None)
        if kind == "message":
            if item.role not in ROLES:
                raise OpenAIError(400, f"'{where}.role' must be one of {', '.join(ROLES)}.",
                                  param=f"{where}.role", code="invalid_parameter")
            assistant = item.role == "assistant"
            default = (rpb.CONTENT_PART_TYPE_OUTPUT_TEXT if assistant
                       else rpb.CONTENT_PART_TYPE_INPUT_TEXT)
            parts = _text_parts(item.content if item.content is not None else "",
                                f"{where}.content", default,
                                ("output_text", "input_text") if assistant else ("input_text",))
            items.append(rpb.ResponseItem(id=new_id("msg"), message=rpb.MessageItem(
                role=ROLES[item.role], content=parts)))
        elif kind == "function_call":
            for name in ("call_id", "name", "arguments"):
                if getattr(item, name) is None:
                    raise _missing(f"{where}.{name}")
            items.append(rpb.ResponseItem(id=new_id("fc"), function_call=rpb.FunctionCallItem(
                call_id=item.call_id, name=item.name, arguments_json=item.arguments,
                namespace=item.namespace or "")))
        elif kind == "custom_tool_call":
            for name in ("call_id", "name", "input"):
                if getattr(item, name) is None:
                    raise _missing(f"{where}.{name}")
            items.append(rpb.ResponseItem(id=new_id("ctc"), custom_tool_call=rpb.CustomToolCallItem(
                call_id=item.call_id, name=item.name, input=item.input)))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            if item.call_id is None:
                raise _missing(f"{where}.call_id")
            if item.output is None:
                raise _missing(f"{where}.output")
            parts = _text_parts(item.output, f"{where}.output",
                                rpb.CONTENT_PART_TYPE_INPUT_TEXT, ("input_text",))
            text = "".join(p.text for p in parts)
            if kind == "function_call_output":
                items.append(rpb.ResponseItem(
                    id=new_id("fco"), function_call_output=rpb.FunctionCallOutputItem(
                        call_id=item.call_id, output=text)))
            else:
                items.append(rpb.ResponseItem(
                    id=new_id("ctco"), custom_tool_call_output=rpb.CustomToolCallOutputItem(
                        call_id=item.call_id, output=text)))
        elif kind == "reasoning":
            items.append(rpb.ResponseItem(id=new_id("rs"), reasoning=rpb.ReasoningItem(
                text=_reasoning_text(item, where, unused))))
        elif kind is None:
            raise _missing(f"{where}.type")
        else:
            raise OpenAIError(400, f"Input items of type '{kind}' are not supported; only "
                              "message, function_call, function_call_output, custom_tool_call, "
                              "custom_tool_call_output and reasoning items are.",
                              param=f"{where}.type", code="unsupported_item_type")
    return items


def _reasoning_text(item, where: str, unused: list[str]) -> str:
    """A reasoning item's text: its reasoning_text parts, else the text in an
    encrypted_content this bridge wrote, else its summary's."""
    if not item.content and item.encrypted_content:
        text = decrypted_reasoning(item.encrypted_content)
        if text is not None:
            return text
        unused.append(f"{where}.encrypted_content")  # another server's: unreadable here
    for name, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = getattr(item, name)
        if isinstance(parts, list) and parts:
            for j, part in enumerate(parts):
                if part.type != part_type or part.text is None:
                    raise OpenAIError(400, f"'{where}.{name}[{j}]' must be a {part_type} part "
                                      "with its text.", param=f"{where}.{name}[{j}]",
                                      code="invalid_parameter")
            return "".join(p.text for p in parts)
    return ""


@dataclass
class Origins:
    """Where each chat message (and each of its calls) came from in the
    client's JSON, to name it in the engine's refusals."""

    messages: list[str] = field(default_factory=list)
    calls: list[list[str]] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)  # the contract's tools[k]'s location
    # Locations the bridge itself reports (hosted tools kept from the model),
    # already in the client's terms: not the contract's tools[k].
    as_sent: set[str] = field(default_factory=set)

    def relabel(self, error: OpenAIError) -> OpenAIError:
        param = error.param
        if param is None:
            return error
        new = _PLAIN.get(param) or _rename(param, self)
        if new != param:
            error.message = error.message.replace(f"'{param}'", f"'{new}'")
            error.param = new
        return error

    def relabel_ignored(self, locations) -> list[str]:
        """The engine's ignored-field locations as the client wrote them."""
        return [loc if loc in self.as_sent else
                _PLAIN.get(loc) or _tool_location(loc, self) or loc for loc in locations]


def _tool_location(param: str, origins: Origins) -> str | None:
    """`tools[k].function.X` (and `tools[k].custom`) at the client's tool."""
    tool = re.fullmatch(r"tools\[(\d+)\](?:\.function\.(.*)|\.(custom)(.*))?", param)
    if not tool:
        return None
    k = int(tool[1])
    origin = origins.tools[k] if k < len(origins.tools) else f"tools[{k}]"
    if tool[2] is not None:
        return f"{origin}.{tool[2]}"
    if tool[3] is not None:
        return f"{origin}.format{tool[4]}"
    return origin


_PLAIN = {"messages": "input", "max_tokens": "max_output_tokens",
          "max_completion_tokens": "max_output_tokens", "response_format": "text.format",
          "tool_choice.function.name": "tool_choice.name"}
_MESSAGE = re.compile(r"messages\[(\d+)\](?:\.tool_calls\[(\d+)\]\.function\.arguments"
                      r"|\.tool_call_id|\.(role|content))?(.*)")


def _rename(param: str, origins: Origins) -> str:
    if param.startswith("response_format.json_schema."):
        return "text.format." + param.removeprefix("response_format.json_schema.")
    if param.startswith("response_format."):
        return "text.format." + param.removeprefix("response_format.")
    tool = _tool_location(param, origins)
    if tool is not None:
        return tool
    found = _MESSAGE.fullmatch(param)
    if not found or int(found[1]) >= len(origins.messages):
        return param
    k = int(found[1])
    origin = origins.messages[k]
    if found[2] is not None and int(found[2]) < len(origins.calls[k]):
        return f"{origins.calls[k][int(found[2])]}.arguments"
    if origin.startswith("input["):
        if "tool_call_id" in param:
            return f"{origin}.call_id"
        if found[3]:
            return f"{origin}.{found[3]}{found[4]}"
    return origin


def conversation(instructions: str | None, replayed: list[rpb.ResponseItem],
                 new: list[rpb.ResponseItem]) -> tuple[generation_pb2.ChatInput, Origins]:
    """Instructions as a system turn, then the replayed items, then the new
    ones; consecutive function calls (with the assistant text before them)
    make one assistant turn, and each call's output a tool turn."""
    chat, origins = generation_pb2.ChatInput(), Origins()

    def turn(origin: str, **fields) -> generation_pb2.ChatMessage:
        origins.messages.append(origin)
        origins.calls.append([])
        return chat.messages.add(**fields)

    if instructions is not None:
        turn("instructions", role=generation_pb2.ROLE_SYSTEM, content=instructions)
    located = [("previous_response_id", item) for item in replayed]
    located += [(f"input[{i}]", item) for i, item in enumerate(new)]
    calls_open = False  # the last turn is an assistant turn that may take calls
    thought = ""  # reasoning waiting for the assistant turn it came before
    for origin, item in located:
        kind = item.WhichOneof("item")
        if kind == "reasoning":
            thought += item.reasoning.text
            calls_open = False
        elif kind == "message":
            m = item.message
            assistant = m.role == generation_pb2.ROLE_ASSISTANT
            turn(origin, role=m.role, content="".join(p.text for p in m.content),
                 reasoning_content=thought if assistant else "")
            thought = "" if assistant else thought
            calls_open = assistant
        elif kind in ("function_call", "custom_tool_call"):
            if not calls_open:
                turn(origin, role=generation_pb2.ROLE_ASSISTANT, content="",
                     reasoning_content=thought)
                thought = ""
                calls_open = True
            if kind == "function_call":
                c = item.function_call
                name, arguments = (responses_tools.offered_name(c.namespace, c.name),
                                   c.arguments_json)
            else:  # written as the engine writes a custom tool's calls
                c = item.custom_tool_call
                name, arguments = c.name, json.dumps({"input": c.input}, ensure_ascii=False)
            chat.messages[-1].tool_calls.add(id=c.call_id, name=name, arguments_json=arguments)
            origins.calls[-1].append(origin)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out = getattr(item, kind)
            turn(origin, role=generation_pb2.ROLE_TOOL, content=out.output,
                 tool_call_id=out.call_id)
            calls_open = False
    return chat, origins


_SUMMARIES = ("auto", "concise", "detailed")
ENCRYPTED = "reasoning.encrypted_content"


def settings(request: ResponsesRequest) -> tuple[rpb.ResponseSettings, responses_tools.ToolMap]:
    """What the request asks of generation, in the contract's terms (it is
    echoed back with the response, and stored with it), and what its tools'
    offered names stand for."""
    out = rpb.ResponseSettings()
    for name in _SAMPLING:
        value = getattr(request, name)
        if value is not None:  # integers are within int64 (protocol/base.py's Int64)
            setattr(out.sampling, name, value)
    if request.max_output_tokens is not None:
        out.sampling.max_tokens = request.max_output_tokens
    if request.stop is not None:
        out.sampling.stop.extend([request.stop] if isinstance(request.stop, str)
                                 else request.stop)
    tools = responses_tools.add_tools(request, out.tools)
    if request.tool_choice is not None:
        responses_tools.set_choice(request, out.tool_choice, tools)
    if request.parallel_tool_calls is not None:
        out.parallel_tool_calls = request.parallel_tool_calls
    if request.text is not None and request.text.format is not None:
        fmt = request.text.format
        out.text_format.CopyFrom(response_format_pb(fmt.type, fmt, "text.format",
                                                    "text.format"))
    if request.user is not None:
        out.user = request.user
    if request.reasoning is not None and request.reasoning.effort is not None:
        out.reasoning_effort = request.reasoning.effort
    reasoning = request.reasoning
    summary = reasoning and (reasoning.summary or reasoning.generate_summary)
    if summary is not None:
        # The summary is the reasoning itself (docs/responses.md), for each value.
        if summary not in _SUMMARIES:
            param = "reasoning.summary" if reasoning.summary else "reasoning.generate_summary"
            raise OpenAIError(400, f"'{param}' must be one of {', '.join(_SUMMARIES)}.",
                              param=param, code="invalid_parameter")
        out.reasoning_summary = summary
    out.reasoning_encrypted_content = ENCRYPTED in (request.include or ())
    return out, tools


@dataclass
class _Reasoning:
    reasoning_effort: str | None
    thinking_token_budget: int | None
    chat_template_kwargs: dict | None


def generate_request(request: ResponsesRequest, chat: generation_pb2.ChatInput,
                     s: rpb.ResponseSettings) -> generation_service_pb2.GenerateRequest:
    pb = generation_service_pb2.GenerateRequest(model=request.model, chat=chat,
                                                sampling=s.sampling, tools=s.tools)
    if s.HasField("tool_choice"):
        pb.tool_choice.CopyFrom(s.tool_choice)
    if s.HasField("parallel_tool_calls"):
        pb.parallel_tool_calls = s.parallel_tool_calls
    if s.HasField("text_format"):
        pb.response_format.CopyFrom(s.text_format)
    # reasoning.effort as chat's reasoning_effort, with the budget and variables.
    add_reasoning_fields(_Reasoning(s.reasoning_effort if s.HasField("reasoning_effort")
                                    else None, request.thinking_token_budget,
                                    request.chat_template_kwargs), pb)
    # The rest of `include` is the engine's to judge, as an extra field.
    rest = [value for value in request.include or () if value != ENCRYPTED]
    if rest:
        pb.extra_fields.update({"include": rest})
    return pb
