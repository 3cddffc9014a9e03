"""POST /v1/chat/completions."""

from __future__ import annotations

import json

from millm.v1 import generation_pb2, generation_service_pb2
from rest_bridge.errors import OpenAIError
from rest_bridge.protocol.base import MAX_EXTRA_FIELD_DEPTH, json_depth
from rest_bridge.protocol.chat import ChatCompletionRequest, ChatMessage
from rest_bridge.serving import tool_calls
from rest_bridge.serving.generation import GenerationHandler
from rest_bridge.serving.logprobs import chat_content
from rest_bridge.serving.request_fields import sampling_to_pb

# OpenAI role names are the contract's Role values, lower-cased without the prefix.
ROLES = {name.removeprefix("ROLE_").lower(): value
         for name, value in generation_pb2.Role.items() if value}


def _content_text(message: ChatMessage, index: int, where: str = "messages") -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type == "text" and part.text is None:
            raise OpenAIError(400, "Missing required parameter: "
                              f"'{where}[{index}].content[{j}].text'.",
                              param=f"{where}[{index}].content[{j}].text",
                              code="missing_required_parameter")
        if part.type != "text":
            # The contract carries text only; silently dropping an image would
            # answer a different question than the one asked.
            raise OpenAIError(
                400,
                f"Content parts of type '{part.type}' are not supported; only text parts are.",
                param=f"{where}[{index}].content[{j}]",
                code="unsupported_content_type",
            )
        texts.append(part.text)
    return "".join(texts)


def chat_input(turns: list[ChatMessage], where: str) -> generation_pb2.ChatInput:
    return generation_pb2.ChatInput(messages=[
        generation_pb2.ChatMessage(
            # An unknown role stays ROLE_UNSPECIFIED; the engine refuses it by name.
            role=ROLES.get(m.role, generation_pb2.ROLE_UNSPECIFIED),
            content=_content_text(m, i, where),
            name=m.name or "",
            tool_calls=tool_calls.message_calls(m, f"{where}[{i}]"),
            tool_call_id=m.tool_call_id or "",
            reasoning_content=(m.reasoning_content if m.reasoning_content is not None
                               else m.reasoning or ""),
        )
        for i, m in enumerate(turns)
    ])


def response_format_pb(kind: str, spec, where: str, spec_where: str
                       ) -> generation_pb2.ResponseFormat:
    """An output format in the contract's terms. `kind` is text, json_object or
    json_schema; `spec` holds a json_schema's name, strict, schema and
    description (chat: response_format.json_schema, at `spec_where`; the
    Responses API: text.format itself). `where` names the field in errors."""
    out = generation_pb2.ResponseFormat()
    if kind == "text":
        out.text.SetInParent()
    elif kind == "json_object":
        out.json_object.SetInParent()
    elif kind == "json_schema":
        for missing, present in ((spec_where, spec is not None),
                                 (f"{spec_where}.name", spec is not None
                                  and spec.name is not None)):
            if not present:
                raise OpenAIError(400, f"Missing required parameter: '{missing}'.",
                                  param=missing, code="missing_required_parameter")
        out.json_schema.name = spec.name
        if spec.strict is not None:
            out.json_schema.strict = spec.strict
        if spec.schema_ is not None:
            out.json_schema.schema_json = json.dumps(spec.schema_, separators=(",", ":"))
        out.json_schema.description = spec.description or ""
    else:
        raise OpenAIError(400, f"Unknown {where} type '{kind}'; expected text, json_object or "
                          "json_schema.", param=f"{where}.type", code="invalid_parameter")
    return out


def add_reasoning_fields(request, pb: generation_service_pb2.GenerateRequest) -> None:
    """reasoning_effort, thinking_token_budget and chat_template_kwargs as
    sent (the engine judges them)."""
    if request.reasoning_effort is not None:
        pb.reasoning_effort = request.reasoning_effort
    if request.thinking_token_budget is not None:
        pb.thinking_token_budget = request.thinking_token_budget
    if request.chat_template_kwargs is not None:
        if json_depth(request.chat_template_kwargs) > MAX_EXTRA_FIELD_DEPTH:
            raise OpenAIError(400, f"'chat_template_kwargs' is nested deeper than "
                              f"{MAX_EXTRA_FIELD_DEPTH} levels.", param="chat_template_kwargs",
                              code="invalid_parameter")
        try:
            pb.chat_template_kwargs.update(request.chat_template_kwargs)
        except (OverflowError, ValueError):  # an integer no double holds
            raise OpenAIError(400, "'chat_template_kwargs' holds a number out of range.",
                              param="chat_template_kwargs", code="invalid_parameter") from None
        pb.chat_template_kwargs.SetInParent()


class ChatCompletionHandler(GenerationHandler):
    id_prefix = "chatcmpl-"
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def to_pb(self, request: ChatCompletionRequest) -> generation_service_pb2.GenerateRequest:
        pb = generation_service_pb2.GenerateRequest(
            model=request.model,
            chat=chat_input(request.messages, "messages"),
            sampling=sampling_to_pb(request),
        )
        for k, turns in enumerate(request.extra_messages or ()):
            pb.extra_chats.append(chat_input(turns, f"extra_messages[{k}]"))
        if request.response_format is not None:
            fmt = request.response_format
            pb.response_format.CopyFrom(response_format_pb(
                fmt.type, fmt.json_schema, "response_format", "response_format.json_schema"))
        tool_calls.add_to_request(request, pb)
        add_reasoning_fields(request, pb)
        if request.logprobs:
            pb.sampling.logprobs = request.top_logprobs or 0
        elif request.top_logprobs:
            raise OpenAIError(400, "'top_logprobs' needs 'logprobs': true.",
                              param="top_logprobs", code="invalid_parameter")
        return pb

    def relabel(self, error: OpenAIError) -> OpenAIError:
        # The contract's one logprobs field carries chat's top_logprobs count,
        # so a complaint about the count is about top_logprobs; a refusal of
        # log-probabilities altogether is about chat's own `logprobs` flag.
        if error.param == "logprobs" and error.code != "field_not_honoured":
            error.param = "top_logprobs"
            error.message = error.message.replace("'logprobs'", "'top_logprobs'")
        return error

    def choice_count(self, request: ChatCompletionRequest) -> int:
        return (request.n or 1) * (1 + len(request.extra_messages or ()))

    def _logprobs(self, reply, scores: list) -> dict | None:
        request = reply.request
        if not request.logprobs:
            return None  # allowed_token_ids alone constrains without reporting
        return {"content": chat_content(scores, bool(request.return_tokens_as_token_ids)),
                "refusal": None}

    def final_choice(self, reply, index: int, text: str, finish: str | None,
                     scores: list, calls: list[dict] = (), reasoning: str = "") -> dict:
        message = {"role": "assistant", "content": text if text or not calls else None,
                   "refusal": None}
        if reasoning:
            # What llama.cpp, SGLang, LiteLLM and LangChain read.
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = list(calls)
        return {
            "index": index,
            "message": message,
            "logprobs": self._logprobs(reply, scores),
            "finish_reason": finish,
        }

    def tool_call_choice(self, reply, index: int, fragments) -> dict | None:
        return {"index": index, "delta": {"tool_calls": tool_calls.stream_fragments(fragments)},
                "logprobs": None, "finish_reason": None}

    def reasoning_choice(self, reply, index: int, reasoning: str) -> dict | None:
        return {"index": index, "delta": {"reasoning_content": reasoning}, "logprobs": None,
                "finish_reason": None}

    def opening_choices(self, reply, count: int) -> list[dict]:
        return [
            {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
             "finish_reason": None}
            for i in range(count)
        ]

    def delta_choice(self, reply, index: int, text: str, finish: str | None,
                     scores: list) -> dict:
        return {
            "index": index,
            "delta": {"content": text} if text else {},
            "logprobs": self._logprobs(reply, scores) if scores else None,
            "finish_reason": finish,
        }
