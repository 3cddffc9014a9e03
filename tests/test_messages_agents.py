"""Anthropic Messages as a coding agent sends it (issue 42, item 2), on the
wire, on both engines: Claude Code's first request (tests/claude_code_body.py)
answered 200 whole and streamed; a system message mid-conversation rendered
where it stands, as chat completions renders it; deferred tools kept out of
the prompt until a tool_reference loads them, then callable; context edits
done or reported; output_config's effort and format; any anthropic-beta flag
accepted. Thinking on a reasoning model: tests/test_messages_thinking.py.
"""

from __future__ import annotations

import json
import re

import pytest

from tests import claude_code_body as cc
from tests.conftest import MODEL
from tests.http_helpers import call, post
from tests.test_messages_api import error_of, events

Q8 = "millm-tiny-gguf:Q8_0"
ASK = {"role": "user", "content": "What does calc.py do?"}


@pytest.fixture(params=[MODEL, Q8])
def served(request, stack, gguf_stack):
    """(HTTP port, model) on each engine."""
    return (stack.http_port if request.param == MODEL else gguf_stack.http_port), request.param


def header_list(raw: str | None) -> list[str]:
    """X-miLLM-Ignored-Fields as a list (RFC 8941 sf-strings)."""
    return [re.sub(r"\\(.)", r"\1", s)
            for s in re.findall(r'"((?:[^"\\]|\\.)*)"', raw or "")]


def _count(port: int, model: str, **fields) -> int:
    reply = call(port, "POST", "/v1/messages/count_tokens", {"model": model, **fields})
    assert reply.status_code == 200, reply.text
    return reply.json()["input_tokens"]


def test_claude_codes_first_request_is_answered_whole_and_streamed(served):
    port, model = served
    reply, content = post(port, cc.PATH, cc.first_request(model, stream=False), cc.HEADERS)
    assert reply.status == 200, content[:400]
    message = json.loads(content)
    assert message["type"] == "message" and message["stop_reason"] in ("end_turn",
                                                                        "max_tokens", "tool_use")
    assert message["context_management"] == {"applied_edits": []}  # keep: all
    for block in message["content"]:
        assert block["type"] in ("text", "tool_use", "thinking"), block
        if block["type"] == "tool_use":  # only tools the prompt offers
            assert block["name"] not in cc.DEFERRED, block
    ignored = header_list(reply.getheader("X-miLLM-Ignored-Fields"))
    # The demo model has no reasoning format: the effort changes nothing (adaptive
    # thinking leaves thinking to the model, which has no way to).
    for name in ("metadata.user_id", "system[1].cache_control", "output_config"):
        assert name in ignored, ignored
    assert not any(n.startswith(("messages[1]", "tools", "context_management")) for n in ignored)

    reply, content = post(port, cc.PATH, cc.first_request(model, stream=True), cc.HEADERS)
    assert reply.status == 200 and reply.getheader("Content-Type").startswith(
        "text/event-stream")
    seen = events(content)
    names = [name for name, _ in seen]
    assert names[0] == "message_start" and names[-1] == "message_stop", names
    assert "error" not in names, seen
    delta = next(data for name, data in seen if name == "message_delta")
    assert delta["context_management"] == {"applied_edits": []}
    assert delta["delta"]["stop_reason"] == message["stop_reason"]


def test_a_system_message_mid_conversation_renders_where_it_stands(served):
    """The same prompt as chat completions renders for the same turns (ChatML
    takes a system turn anywhere)."""
    port, model = served
    turns = [{"role": "user", "content": "Hi"},
             {"role": "system", "content": "Answer in French."},
             {"role": "user", "content": "Name a colour."}]
    count = _count(port, model, system="Be brief.", messages=turns)
    chat = call(port, "POST", "/v1/chat/completions", {
        "model": model, "max_tokens": 1,
        "messages": [{"role": "system", "content": "Be brief."}, *turns]})
    assert chat.status_code == 200, chat.text
    assert count == chat.json()["usage"]["prompt_tokens"]
    blocks = [{"role": "system", "content": [{"type": "text", "text": "Answer in French."}]}]
    assert _count(port, model, system="Be brief.", messages=[turns[0], *blocks, turns[2]]) \
        == count
    reply = call(port, "POST", "/v1/messages", {"model": model, "max_tokens": 4,
                                                "messages": turns})
    assert reply.status_code == 200, reply.text


def _loading_history(name: str) -> list[dict]:
    """A tool search that found `name`, as Claude Code's ToolSearch answers."""
    return [ASK,
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                               "name": "ToolSearch",
                                               "input": {"query": f"select:{name}"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                          "content": [{"type": "tool_reference",
                                                       "tool_name": name}]}]}]


def test_a_deferred_tool_stays_out_of_the_prompt_until_loaded(served):
    port, model = served
    tools = [t for t in cc.TOOLS if t["name"] in ("Read", "ToolSearch", "WebFetch")]
    # A short url, so that a forced call ends inside max_tokens.
    tools[-1] = {**tools[-1], "input_schema": {"type": "object", "properties": {
        "url": {"type": "string", "maxLength": 12}}, "required": ["url"]}}
    eager = [{k: v for k, v in t.items() if k != "defer_loading"} for t in tools]
    offered = [t for t in tools if not t.get("defer_loading")]
    # Not loaded: the prompt is the one without the tool.
    assert _count(port, model, messages=[ASK], tools=tools) == \
        _count(port, model, messages=[ASK], tools=offered)
    assert _count(port, model, messages=[ASK], tools=tools) < \
        _count(port, model, messages=[ASK], tools=eager)
    # Loaded by a tool_reference: the prompt is the one that always had it.
    loaded = _loading_history("WebFetch")
    assert _count(port, model, messages=loaded, tools=tools) == \
        _count(port, model, messages=loaded, tools=eager)
    # ... and it can be called (forced here: the demo model picks its own tools).
    reply = call(port, "POST", "/v1/messages", {
        "model": model, "max_tokens": 48, "temperature": 0, "messages": loaded,
        "tools": tools, "tool_choice": {"type": "tool", "name": "WebFetch"}})
    assert reply.status_code == 200, reply.text
    use = [b for b in reply.json()["content"] if b["type"] == "tool_use"]
    assert use and use[0]["name"] == "WebFetch" and "url" in use[0]["input"], reply.text


def test_a_tool_reference_to_an_unknown_tool_names_it(stack):
    reply = call(stack.http_port, "POST", "/v1/messages", {
        "model": MODEL, "max_tokens": 4, "messages": _loading_history("Nope"),
        "tools": cc.TOOLS})
    assert reply.status_code == 400
    assert "'messages[2].content[0].content[0].tool_name'" in error_of(reply)["message"]


def test_every_tool_deferred_and_none_loaded_is_a_plain_answer(stack):
    deferred = [t for t in cc.TOOLS if t.get("defer_loading")]
    reply = call(stack.http_port, "POST", "/v1/messages", {
        "model": MODEL, "max_tokens": 4, "messages": [ASK], "tools": deferred,
        "tool_choice": {"type": "auto"}})
    assert reply.status_code == 200, reply.text
    assert all(b["type"] == "text" for b in reply.json()["content"])


def test_context_edits_are_done_or_reported(stack):
    history = [ASK,
               {"role": "assistant", "content": [
                   {"type": "thinking", "thinking": "Look at it.", "signature": "s1"},
                   {"type": "text", "text": "It adds."}]},
               {"role": "user", "content": "And?"},
               {"role": "assistant", "content": [
                   {"type": "thinking", "thinking": "Think more.", "signature": "s2"},
                   {"type": "text", "text": "It adds numbers."}]},
               {"role": "user", "content": "Thanks."}]
    edits = [{"type": "clear_thinking_20251015",
              "keep": {"type": "thinking_turns", "value": 1}},
             {"type": "clear_tool_uses_20250919",
              "trigger": {"type": "input_tokens", "value": 30000}}]
    sent = {"model": MODEL, "max_tokens": 4, "messages": history,
            "context_management": {"edits": edits}}
    reply, content = post(stack.http_port, "/v1/messages", sent)
    assert reply.status == 200, content
    assert json.loads(content)["context_management"] == {"applied_edits": [
        {"type": "clear_thinking_20251015", "cleared_thinking_turns": 1,
         "cleared_input_tokens": 0}]}
    ignored = header_list(reply.getheader("X-miLLM-Ignored-Fields"))
    assert "context_management.edits[1]" in ignored, ignored
    # The cleared block's signature is not reported: the block is gone, not unread.
    assert "messages[1].content[0].signature" not in ignored, ignored
    assert "messages[3].content[0].signature" in ignored, ignored
    # A keep this server cannot read names itself.
    bad = {**sent, "context_management": {"edits": [{"type": "clear_thinking_20251015",
                                                     "keep": {"type": "sometimes"}}]}}
    reply = call(stack.http_port, "POST", "/v1/messages", bad)
    assert reply.status_code == 400
    assert "'context_management.edits[0].keep'" in error_of(reply)["message"]


def test_output_config_effort_is_reported_and_format_refused(stack):
    base = {"model": MODEL, "max_tokens": 4, "messages": [ASK]}
    reply = call(stack.http_port, "POST", "/v1/messages",
                 {**base, "output_config": {"effort": "max"}})
    assert reply.status_code == 200, reply.text
    assert "output_config" in header_list(reply.headers["x-millm-ignored-fields"])
    reply = call(stack.http_port, "POST", "/v1/messages", {**base, "output_config": {
        "format": {"type": "json_schema", "schema": {"type": "object"}}}})
    assert reply.status_code == 400
    assert "'output_config.format' is not honoured" in error_of(reply)["message"], reply.text


def test_any_anthropic_beta_flag_is_accepted(stack):
    sent = {"model": MODEL, "max_tokens": 2, "messages": [ASK]}
    for flags in ("made-up-2099-01-01", " , ,x", cc.BETAS + ",another-2030-01-01"):
        reply, content = post(stack.http_port, cc.PATH, sent, {"anthropic-beta": flags})
        assert reply.status == 200, (flags, content)
    reply, content = post(stack.http_port, "/v1/messages/count_tokens?beta=true",
                          {"model": MODEL, "messages": [ASK]}, {"anthropic-beta": "zz-1"})
    assert reply.status == 200, content
