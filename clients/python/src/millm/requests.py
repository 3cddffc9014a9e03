"""The requests millm.client sends, built from plain Python values: chat and
raw-prompt GenerateRequests (sampling fields as keyword arguments, stop as a
string or a list, logit_bias as {token id: bias}) and TokenizeRequests."""

from __future__ import annotations

from collections.abc import Iterable

from millm.tools import function_tool, tool_call
from millm.tools import tool_choice as _tool_choice
from millm.v1 import generation_pb2, generation_service_pb2, tokenization_service_pb2

_ROLES = {
    "system": generation_pb2.ROLE_SYSTEM, "developer": generation_pb2.ROLE_DEVELOPER,
    "user": generation_pb2.ROLE_USER, "assistant": generation_pb2.ROLE_ASSISTANT,
    "tool": generation_pb2.ROLE_TOOL, "function": generation_pb2.ROLE_FUNCTION,
}


def message_pb(m: dict) -> generation_pb2.ChatMessage:
    """One message dict (role, content, tool_calls, tool_call_id) as the contract's."""
    return generation_pb2.ChatMessage(
        role=_ROLES[m["role"]], content=m.get("content") or "",
        tool_calls=[tool_call(c) for c in m.get("tool_calls") or ()],
        tool_call_id=m.get("tool_call_id") or "")


def chat_request(model: str, messages: Iterable[dict], *, tools=None, tool_choice=None,
                 parallel_tool_calls: bool | None = None, **sampling
                 ) -> generation_service_pb2.GenerateRequest:
    """The GenerateRequest chat() sends. Messages are dicts with `role`, `content`
    and, for tools, `tool_calls` (assistant) or `tool_call_id` (tool)."""
    request = generation_service_pb2.GenerateRequest(
        model=model,
        chat=generation_pb2.ChatInput(messages=[message_pb(m) for m in messages]),
        sampling=sampling_pb(sampling),
        tools=[function_tool(t) for t in tools or ()])
    if tool_choice is not None:
        request.tool_choice.CopyFrom(_tool_choice(tool_choice))
    if parallel_tool_calls is not None:
        request.parallel_tool_calls = parallel_tool_calls
    return request


def prompt_request(model: str, prompts: Iterable[str | list[int]], **sampling
                   ) -> generation_service_pb2.GenerateRequest:
    return generation_service_pb2.GenerateRequest(
        model=model,
        prompt=generation_pb2.PromptInput(prompts=[prompt_pb(p) for p in prompts]),
        sampling=sampling_pb(sampling))


def prompt_pb(p: str | list[int]) -> generation_pb2.Prompt:
    if isinstance(p, str):
        return generation_pb2.Prompt(text=p)
    return generation_pb2.Prompt(token_ids=generation_pb2.TokenIds(ids=p))


def sampling_pb(fields: dict) -> generation_pb2.SamplingParams:
    stop = fields.pop("stop", ())
    return generation_pb2.SamplingParams(stop=[stop] if isinstance(stop, str) else stop,
                                         **fields)


def tokenize_request(model: str, text_or_messages: str | Iterable[dict], tools=None,
                     **options) -> tokenization_service_pb2.TokenizeRequest:
    """A prompt (str) or a conversation (message dicts, as chat requests take);
    `options` are TokenizeRequest's flags (add_generation_prompt, ...)."""
    request = tokenization_service_pb2.TokenizeRequest(
        model=model, tools=[function_tool(t) for t in tools or ()],
        **{k: v for k, v in options.items() if v is not None})
    if isinstance(text_or_messages, str):
        request.prompt = text_or_messages
    else:
        request.chat.messages.extend(message_pb(m) for m in text_or_messages)
    return request
