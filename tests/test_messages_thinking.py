"""Thinking blocks on Anthropic's Messages API: a reasoning model's
reasoning (tests/format_models.py's DeepSeek R1-style tiny-r1, on both
engines) comes back as a thinking block before the text, whole and streamed
(thinking_delta); `thinking.budget_tokens` is the engine's reasoning budget;
`disabled` switches thinking off; earlier turns' thinking blocks reach the
chat template; a model without a reasoning format reports `thinking`."""

from __future__ import annotations

import json

import pytest

from tests import format_models
from tests.http_helpers import call, post
from tests.test_messages_api import events

R1, R1_GGUF = "tiny-r1", "tiny-r1-gguf:F32"
ASK = [{"role": "user", "content": "What is the weather like by the river?"}]
MARKS = ("<think>", "</think>")


@pytest.fixture(scope="module")
def formats_stack(tmp_path_factory):
    stack = format_models.serve(tmp_path_factory, "messages-thinking")
    try:
        yield stack
    finally:
        stack.stop()


def body(model: str, **extra) -> dict:
    return {"model": model, "max_tokens": 48, "temperature": 0, "messages": ASK, **extra}


@pytest.mark.parametrize("model", [R1, R1_GGUF])
def test_thinking_block_whole_and_streamed(formats_stack, model):
    port = formats_stack.http_port
    sent = body(model, thinking={"type": "enabled", "budget_tokens": 8})
    reply = call(port, "POST", "/v1/messages", sent)
    assert reply.status_code == 200, reply.text
    message = reply.json()
    kinds = [b["type"] for b in message["content"]]
    assert kinds[0] == "thinking" and "thinking" not in kinds[1:], kinds
    thinking = message["content"][0]
    assert thinking["thinking"] and thinking["signature"] == ""
    for block in message["content"]:
        shown = block.get("thinking", "") + block.get("text", "")
        assert not any(mark in shown for mark in MARKS), block
    assert "x-millm-ignored-fields" not in reply.headers, reply.headers
    _, content = post(port, "/v1/messages", {**sent, "stream": True})
    seen = events(content)
    starts = [d["content_block"]["type"] for n, d in seen if n == "content_block_start"]
    assert starts == kinds
    streamed = "".join(d["delta"]["thinking"] for n, d in seen
                       if n == "content_block_delta" and d["delta"]["type"] == "thinking_delta")
    assert streamed == thinking["thinking"]
    text = "".join(d["delta"].get("text", "") for n, d in seen if n == "content_block_delta")
    assert text == "".join(b.get("text", "") for b in message["content"])
    count = call(port, "POST", "/v1/messages/count_tokens",
                 {"model": model, "messages": ASK, "thinking": sent["thinking"]}).json()
    usage = message["usage"]
    assert count["input_tokens"] == usage["input_tokens"] + usage["cache_read_input_tokens"]


def test_a_budget_past_max_tokens_names_it(formats_stack):
    reply = call(formats_stack.http_port, "POST", "/v1/messages",
                 body(R1, thinking={"type": "enabled", "budget_tokens": 1024}))
    assert reply.status_code == 400
    assert "'thinking.budget_tokens'" in reply.json()["error"]["message"], reply.text


def test_disabled_thinking_writes_none(formats_stack):
    reply = call(formats_stack.http_port, "POST", "/v1/messages",
                 body(R1, thinking={"type": "disabled"}))
    assert reply.status_code == 200, reply.text
    assert [b["type"] for b in reply.json()["content"]] in ([], ["text"]), reply.text


def test_earlier_thinking_reaches_the_template(formats_stack):
    history = [*ASK, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Rivers are wet.", "signature": "sig"},
        {"type": "text", "text": "It is damp."}]},
        {"role": "user", "content": "And tomorrow?"}]
    reply = call(formats_stack.http_port, "POST", "/v1/messages",
                 body(R1, messages=history, thinking={"type": "enabled", "budget_tokens": 4}))
    assert reply.status_code == 200, reply.text
    ignored = reply.headers.get("x-millm-ignored-fields", "")
    assert ignored == '"messages[1].content[0].signature"', ignored


def test_a_model_without_reasoning_reports_thinking(formats_stack):
    reply = call(formats_stack.http_port, "POST", "/v1/messages",
                 body("tiny-overridden", thinking={"type": "enabled", "budget_tokens": 4}))
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-millm-ignored-fields"] == '"thinking"'
    assert all(b["type"] != "thinking" for b in reply.json()["content"])
    assert json.dumps(reply.json())  # a whole message


# -- as coding agents send it (issue 42): display, effort, context edits ------------------


@pytest.mark.parametrize("model", [R1, R1_GGUF])
def test_omitted_display_keeps_the_block_and_leaves_its_text_out(formats_stack, model):
    port = formats_stack.http_port
    shown = call(port, "POST", "/v1/messages",
                 body(model, thinking={"type": "enabled", "budget_tokens": 8}))
    sent = body(model, thinking={"type": "enabled", "budget_tokens": 8, "display": "omitted"})
    reply = call(port, "POST", "/v1/messages", sent)
    assert reply.status_code == 200, reply.text
    blocks = reply.json()["content"]
    assert blocks[0] == {"type": "thinking", "thinking": "", "signature": ""}, blocks
    # The model reasoned the same: the answer after the block is unchanged.
    assert blocks[1:] == shown.json()["content"][1:]
    _, content = post(port, "/v1/messages", {**sent, "stream": True})
    seen = events(content)
    assert [d["content_block"]["type"] for n, d in seen if n == "content_block_start"] == \
        [b["type"] for b in blocks]
    assert not any(n == "content_block_delta" and d["delta"]["type"] == "thinking_delta"
                   for n, d in seen)


def test_adaptive_thinking_with_an_effort_and_a_summarized_display(formats_stack):
    reply = call(formats_stack.http_port, "POST", "/v1/messages", body(
        R1, thinking={"type": "adaptive", "display": "summarized"},
        output_config={"effort": "max"}))
    assert reply.status_code == 200, reply.text
    assert "x-millm-ignored-fields" not in reply.headers, reply.headers
    # Shown whole (no summarizer): a thinking block, if the model wrote one, has its text.
    assert all(b["thinking"] for b in reply.json()["content"] if b["type"] == "thinking")
    # An effort no model has is named as the client sent it.
    reply = call(formats_stack.http_port, "POST", "/v1/messages", body(
        R1, output_config={"effort": "enormous"}))
    assert reply.status_code == 400
    assert "'output_config.effort'" in reply.json()["error"]["message"], reply.text
    # Thinking switched off wins over an effort, which is reported.
    reply = call(formats_stack.http_port, "POST", "/v1/messages", body(
        R1, thinking={"type": "disabled"}, output_config={"effort": "low"}))
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-millm-ignored-fields"] == '"output_config.effort"'


def test_clear_thinking_leaves_older_thinking_out_of_the_prompt(formats_stack):
    history = [*ASK, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Rivers are wet and wide today.", "signature": ""},
        {"type": "text", "text": "It is damp."}]},
        {"role": "user", "content": "And tomorrow?"}]

    def count(edits):
        sent = {"model": R1, "messages": history, "thinking": {"type": "adaptive"}}
        if edits is not None:
            sent["context_management"] = {"edits": edits}
        return call(formats_stack.http_port, "POST", "/v1/messages/count_tokens",
                    sent).json()["input_tokens"]

    kept = count([{"type": "clear_thinking_20251015", "keep": "all"}])
    assert kept == count(None)
    cleared = count([{"type": "clear_thinking_20251015",
                      "keep": {"type": "thinking_turns", "value": 0}}])
    plain = [history[0], {"role": "assistant", "content": "It is damp."}, history[2]]
    assert cleared == call(formats_stack.http_port, "POST", "/v1/messages/count_tokens", {
        "model": R1, "messages": plain, "thinking": {"type": "adaptive"}}).json()["input_tokens"]
    assert cleared <= kept
