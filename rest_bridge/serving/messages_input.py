"""Anthropic's Messages request into the contract's GenerateRequest.

A Messages body is a chat conversation in other clothes: `system` becomes a
system turn, each message a turn (a `system` message a system turn where it
stands: the engine renders it there or merges it into the leading one,
service/chat_template.py), an assistant's tool_use blocks its tool
calls and its thinking blocks its reasoning_content, and a user's
tool_result blocks tool turns (before the user's text, where Anthropic puts
them); `thinking` and `output_config.effort` are the contract's reasoning fields
(messages_reasoning.py); context edits and deferred tools decide which
blocks and tools reach the prompt (messages_context.py). `tool_choice` any/tool are the contract's
required/named choices, so forced calls are grammar-constrained exactly as
on chat completions. The engine judges everything else and names the field;
`Origins.relabel` turns its chat-shaped names back into the client's
("messages[3].tool_calls[0].function.arguments" -> "messages[2].content[1]").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from millm.v1 import generation_pb2, generation_service_pb2
from rest_bridge.errors import OpenAIError
from rest_bridge.protocol.messages import ContentBlock, MessagesInput, MessagesRequest
from rest_bridge.serving import messages_context, messages_reasoning, tool_calls
from rest_bridge.serving.messages_context import ContextPlan
from rest_bridge.serving.messages_reasoning import Spelling

_CHOICES = {
    "auto": generation_pb2.TOOL_CHOICE_MODE_AUTO,
    "any": generation_pb2.TOOL_CHOICE_MODE_REQUIRED,
    "tool": generation_pb2.TOOL_CHOICE_MODE_FUNCTION,
    "none": generation_pb2.TOOL_CHOICE_MODE_NONE,
}
# Blocks a request may carry that the model never reads: encrypted reasoning.
# (Readable `thinking` blocks go to the chat template as the turn's
# reasoning_content, which keeps or drops them as its family does.)
_NOT_RENDERED = frozenset({"redacted_thinking"})


def _invalid(param: str, message: str, code: str = "invalid_parameter") -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def _missing(param: str) -> OpenAIError:
    return _invalid(param, f"Missing required parameter: '{param}'.",
                    "missing_required_parameter")


def _unsupported_block(param: str, kind: str) -> OpenAIError:
    # The contract carries text; dropping an image would answer another question.
    return _invalid(param, f"Content blocks of type '{kind}' are not supported here; text, "
                    "tool_use, tool_result and thinking blocks are.", "unsupported_content_type")


def _text_of(blocks: str | list[ContentBlock], where: str,
             request: MessagesInput | None = None) -> str:
    """Text blocks' text, joined (system prompts, tool results; a tool
    result's tool_reference blocks, given `request`, as the tools they load)."""
    if isinstance(blocks, str):
        return blocks
    texts = []
    for j, block in enumerate(blocks):
        if block.type == "tool_reference" and request is not None:
            line = messages_context.tool_reference_text(block, f"{where}[{j}]", request)
            # One line each, apart from the text around it.
            texts.append(("\n" if texts and not texts[-1].endswith("\n") else "") + line
                         + ("\n" if j + 1 < len(blocks) else ""))
            continue
        if block.type != "text":
            raise _unsupported_block(f"{where}[{j}].type", block.type)
        if block.text is None:
            raise _missing(f"{where}[{j}].text")
        texts.append(block.text)
    return "".join(texts)


@dataclass
class Origins:
    """Where each chat turn (and each call of a turn) came from in the body."""

    turns: list[str] = field(default_factory=list)
    calls: list[list[str]] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)
    # Top-level keys sent as extra fields: the engine names them as sent.
    extras: frozenset[str] = frozenset()
    # The contract's tools[k] is the body's tools[tool_index[k]] (deferred
    # tools not yet loaded are left out).
    tool_index: list[int] = field(default_factory=list)
    spelling: Spelling = field(default_factory=Spelling)
    context: ContextPlan = field(default_factory=ContextPlan)

    def relabel(self, error: OpenAIError) -> OpenAIError:
        param = error.param
        if param is None or param in self.extras:
            return error
        new = (self.spelling.names.get(param) or _PLAIN.get(param)
               or self._rename(param))
        if new != param:
            error.message = error.message.replace(f"'{param}'", f"'{new}'")
            error.param = new
        return error

    def _rename(self, param: str) -> str:
        tool = re.fullmatch(r"tools\[(\d+)\]\.function\.(name|description|parameters)(.*)", param)
        if tool:
            name = "input_schema" if tool[2] == "parameters" else tool[2]
            k = int(tool[1])
            index = self.tool_index[k] if k < len(self.tool_index) else k
            return f"tools[{index}].{name}{tool[3]}"
        found = _TURN.fullmatch(param)
        if not found or int(found[1]) >= len(self.turns):
            return param
        k = int(found[1])
        if found[2] is not None and int(found[2]) < len(self.calls[k]):
            return f"{self.calls[k][int(found[2])]}.input"
        if found[3] is not None:
            return f"{self.turns[k]}.tool_use_id"
        return self.turns[k] + (".content" if found[4] == "content" else "")


_PLAIN = {"stop": "stop_sequences", "tool_choice.function.name": "tool_choice.name",
          "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
          "max_completion_tokens": "max_tokens", "output_format": "output_config.format"}
_TURN = re.compile(r"messages\[(\d+)\](?:\.tool_calls\[(\d+)\].*|(\.tool_call_id)"
                   r"|\.(role|content|name)(?:.*))?")


def conversation(request: MessagesInput) -> tuple[generation_pb2.ChatInput, Origins]:
    chat, origins = generation_pb2.ChatInput(), Origins()
    origins.context = messages_context.context_plan(request)

    def turn(origin: str, **fields) -> generation_pb2.ChatMessage:
        origins.turns.append(origin)
        origins.calls.append([])
        return chat.messages.add(**fields)

    if request.system is not None:
        turn("system", role=generation_pb2.ROLE_SYSTEM, content=_text_of(request.system,
                                                                         "system"))
    for i, message in enumerate(request.messages):
        where = f"messages[{i}]"
        if message.role not in ("user", "assistant", "system"):
            raise _invalid(f"{where}.role", f"'{where}.role' must be user, assistant or "
                           f"system; got '{message.role[:64]}'.")
        blocks = message.content
        if message.role == "system":
            # Agents' mid-conversation instructions: a system turn where it stands.
            turn(where, role=generation_pb2.ROLE_SYSTEM,
                 content=_text_of(blocks, f"{where}.content"))
            continue
        if isinstance(blocks, str):
            blocks = [ContentBlock(type="text", text=blocks)]
        if message.role == "user":
            _user_turns(blocks, where, turn, origins, request)
        else:
            _assistant_turn(blocks, where, turn, origins,
                            origins.context.keeps_thinking(i))
    # A final assistant message (Anthropic's prefill) is continued by the
    # engine, as it continues any conversation that ends with one.
    return chat, origins


def _user_turns(blocks: list[ContentBlock], where: str, turn, origins: Origins,
                request: MessagesInput) -> None:
    texts = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if block.type == "text":
            if block.text is None:
                raise _missing(f"{at}.text")
            texts.append(block.text)
        elif block.type == "tool_result":
            if block.tool_use_id is None:
                raise _missing(f"{at}.tool_use_id")
            output = _text_of(block.content or "", f"{at}.content", request)
            if block.is_error:
                # The contract's tool turn is text: the failure is said in it.
                output = f"Error: {output}"
            turn(at, role=generation_pb2.ROLE_TOOL, content=output,
                 tool_call_id=block.tool_use_id)
        elif block.type in _NOT_RENDERED:
            origins.unused.append(at)
        else:
            raise _unsupported_block(f"{at}.type", block.type)
    if texts or not any(b.type == "tool_result" for b in blocks):
        turn(where, role=generation_pb2.ROLE_USER, content="".join(texts))


def _assistant_turn(blocks: list[ContentBlock], where: str, turn, origins: Origins,
                    keep_thinking: bool) -> None:
    texts, calls, call_origins, thoughts = [], [], [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if block.type == "text":
            if block.text is None:
                raise _missing(f"{at}.text")
            texts.append(block.text)
        elif block.type == "thinking":
            if block.thinking is None:
                raise _missing(f"{at}.thinking")
            if not keep_thinking:
                continue  # cleared by context_management's clear_thinking
            thoughts.append(block.thinking)
            if block.signature is not None:
                origins.unused.append(f"{at}.signature")  # nothing is signed here
        elif block.type == "tool_use":
            for key in ("id", "name", "input"):
                if getattr(block, key) is None:
                    raise _missing(f"{at}.{key}")
            calls.append(generation_pb2.ToolCall(
                id=block.id, name=block.name,
                arguments_json=json.dumps(block.input, separators=(",", ":"))))
            call_origins.append(at)
        elif block.type in _NOT_RENDERED:
            if keep_thinking:
                origins.unused.append(at)
        else:
            raise _unsupported_block(f"{at}.type", block.type)
    turn(where, role=generation_pb2.ROLE_ASSISTANT, content="".join(texts), tool_calls=calls,
         reasoning_content="".join(thoughts))
    origins.calls[-1] = call_origins


def add_tools(request: MessagesInput, pb: generation_service_pb2.GenerateRequest,
              origins: Origins) -> None:
    for i, tool in messages_context.offered(request):
        if tool.type not in (None, "custom"):
            raise OpenAIError(400, f"Tools of type '{tool.type[:64]}' (Anthropic's server "
                              "tools) are not supported; only client tools (name, "
                              "description, input_schema) are.", param=f"tools[{i}].type",
                              code="field_not_honoured")
        tool_calls.add_tool(pb.tools, i, "function", tool.name, tool.description,
                            tool.input_schema, None)
        origins.tool_index.append(i)
    choice = request.tool_choice
    if choice is None or (not pb.tools and request.tools and choice.type in ("auto", "none")):
        return  # every tool deferred: nothing to choose among yet
    if choice.type not in _CHOICES:
        raise _invalid("tool_choice.type", "'tool_choice.type' must be auto, any, tool or none; "
                       f"got '{choice.type[:64]}'.")
    if choice.type == "tool" and choice.name is None:
        raise _missing("tool_choice.name")
    pb.tool_choice.mode = _CHOICES[choice.type]
    if choice.type == "tool":
        pb.tool_choice.function_name = choice.name
    if choice.disable_parallel_tool_use is not None:
        pb.parallel_tool_calls = not choice.disable_parallel_tool_use


def generate_request(request: MessagesInput) -> tuple[generation_service_pb2.GenerateRequest,
                                                      Origins]:
    """The contract's request for a Messages body (a count's too: it has no
    sampling fields), and where its turns came from."""
    chat, origins = conversation(request)
    origins.extras = frozenset(request.model_extra or ())
    pb = generation_service_pb2.GenerateRequest(model=request.model, chat=chat)
    add_tools(request, pb, origins)
    origins.spelling = messages_reasoning.add_reasoning(request, pb, origins.unused)
    output_format = messages_reasoning.output_format(request)
    if output_format is not None and "output_format" not in origins.extras:
        pb.extra_fields.update({"output_format": output_format})  # the engine refuses it
    pb.unused_fields.extend(origins.context.unused)
    pb.unused_fields.extend(origins.unused)
    if isinstance(request, MessagesRequest):
        _sampling(request, pb.sampling)
        if request.metadata is not None and request.metadata.user_id is not None:
            pb.unused_fields.append("metadata.user_id")  # nothing here reads it
    return pb, origins


def _sampling(request: MessagesRequest, sampling: generation_pb2.SamplingParams) -> None:
    sampling.max_tokens = request.max_tokens
    for name in ("temperature", "top_p", "top_k", "seed"):
        value = getattr(request, name)
        if value is not None:
            setattr(sampling, name, value)
    sampling.stop.extend(request.stop_sequences or ())
