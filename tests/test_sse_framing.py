"""SSE on the wire, byte for byte."""

from __future__ import annotations

import json

from tests.conftest import MODEL
from tests.http_helpers import post, sse_events

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 10,
        "stream": True, "seed": 9}


def test_chat_stream_framing(stack):
    reply, content = post(stack.http_port, "/v1/chat/completions", CHAT)
    assert reply.status == 200
    assert reply.getheader("content-type").startswith("text/event-stream")
    assert reply.getheader("cache-control") == "no-cache"
    assert reply.getheader("x-millm-seed") == '9;scope="request"'
    payloads = sse_events(content)
    assert payloads[-1] == b"[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    # Compact JSON, one object per event.
    assert payloads[0] == json.dumps(chunks[0], separators=(",", ":")).encode()
    first = chunks[0]
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                 "logprobs": None, "finish_reason": None}]
    assert "usage" not in first  # only with stream_options.include_usage
    assert "system_fingerprint" not in first
    body = chunks[1:-1]
    assert all(list(c["choices"][0]["delta"]) == ["content"] for c in body)
    assert all(c["choices"][0]["delta"]["content"] for c in body)
    last = chunks[-1]
    assert last["choices"][0]["delta"] == {}
    finish = last["choices"][0]["finish_reason"]
    assert finish in ("stop", "length")
    # Without stream_options the final chunk carries the usage, and only it.
    usage = last["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    if finish == "length":
        assert usage["completion_tokens"] == CHAT["max_tokens"]
    else:
        assert 0 < usage["completion_tokens"] <= CHAT["max_tokens"]
    assert all("usage" not in c for c in chunks[:-1])
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1


def test_usage_chunk_comes_last_before_done(stack):
    body = {**CHAT, "stream_options": {"include_usage": True}}
    _, content = post(stack.http_port, "/v1/chat/completions", body)
    payloads = sse_events(content)
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[-1]["choices"] == []
    usage = chunks[-1]["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert all(c["usage"] is None for c in chunks[:-1])


def test_completion_stream_framing(stack):
    body = {"model": MODEL, "prompt": ["The river", "The market"], "max_tokens": 5,
            "stream": True, "temperature": 0, "ignore_eos": True}
    _, content = post(stack.http_port, "/v1/completions", body)
    payloads = sse_events(content)
    assert payloads[-1] == b"[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    finished = [c["choices"][0] for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(c["index"] for c in finished) == [0, 1]
    assert all(c["finish_reason"] == "length" for c in finished)


def test_error_before_stream_is_plain_http(stack):
    reply, content = post(stack.http_port, "/v1/chat/completions", {**CHAT, "model": "nope"})
    assert reply.status == 404
    assert reply.getheader("content-type") == "application/json"
    assert json.loads(content)["error"]["code"] == "model_not_found"


def test_with_several_choices_only_the_final_chunk_carries_the_usage(stack):
    body = {"model": CHAT["model"], "prompt": ["One", "Two", "Three"], "max_tokens": 5,
            "stream": True, "temperature": 0, "ignore_eos": True}
    _, content = post(stack.http_port, "/v1/completions", body)
    chunks = [json.loads(p) for p in sse_events(content)[:-1]]
    finished = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert sorted(c["choices"][0]["index"] for c in finished) == [0, 1, 2]
    assert all(c["choices"][0]["finish_reason"] == "length" for c in finished)
    assert chunks[-1] is finished[-1] and chunks[-1]["usage"]["completion_tokens"] == 3 * 5
    assert all("usage" not in c for c in chunks[:-1])
