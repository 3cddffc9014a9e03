"""stream_interval (issue 45 item 3): fewer, larger streamed messages on
request, the first token still at once, the same text and tokens in the end,
over gRPC and through the bridge's chat and completions streams, on both
engines."""

from __future__ import annotations

import json

import pytest

from tests.grpc_helpers import chat_request
from tests.http_helpers import call

TOKENS = 17


def _token_messages(stub, interval: int | None, model: str = "millm-tiny"):
    request = chat_request("Tell me about the sea.", model=model, temperature=0,
                           max_tokens=TOKENS, ignore_eos=True)
    request.stream = True
    if interval is not None:
        request.stream_interval = interval
    messages = list(stub.Generate(request))
    return [m for m in messages if m.choices], messages


@pytest.mark.parametrize("interval", [1, 4, 16, 64])
def test_grpc_messages_hold_that_many_tokens_after_the_first(generation_stub, interval):
    plain, _ = _token_messages(generation_stub, None)
    spaced, everything = _token_messages(generation_stub, interval)
    tokens = [sum(len(d.token_ids) for d in m.choices) for m in spaced]
    # The first message is never held for more (it holds what the engine had:
    # steps a slow reader let pile up come merged, as without an interval);
    # later ones are held until they have the interval's tokens, but the last.
    assert all(t >= interval for t in tokens[1:-1])
    assert sum(tokens) == TOKENS
    assert len(spaced) <= 1 + -(-(TOKENS - 1) // interval)

    def joined(messages):
        return ("".join(d.text for m in messages for d in m.choices),
                [t for m in messages for d in m.choices for t in d.token_ids])

    assert joined(spaced) == joined(plain)
    assert everything[-1].HasField("usage")
    assert everything[-1].usage.completion_tokens == TOKENS


def _sse(port: int, path: str, body: dict) -> list[dict]:
    reply = call(port, "POST", path, {**body, "stream": True})
    assert reply.status_code == 200, reply.text
    return [json.loads(line[6:]) for line in reply.text.splitlines()
            if line.startswith("data: {")]


@pytest.mark.parametrize("path, body, text_of", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me a story."}]},
     lambda c: c["delta"].get("content") or ""),
    ("/v1/completions", {"prompt": "Once upon a time"}, lambda c: c["text"]),
])
def test_bridge_streams_carry_the_interval(stack, path, body, text_of):
    common = {"model": "millm-tiny", "temperature": 0, "max_tokens": TOKENS,
              "ignore_eos": True, **body}
    plain = _sse(stack.http_port, path, common)
    spaced = _sse(stack.http_port, path, {**common, "stream_interval": 8})
    texts = [text_of(c["choices"][0]) for c in spaced if c["choices"]]
    assert "".join(texts) == "".join(text_of(c["choices"][0]) for c in plain if c["choices"])
    assert len([t for t in texts if t]) <= 1 + -(-(TOKENS - 1) // 8)
    assert len([t for t in texts if t]) < len([c for c in plain if c["choices"]])


def test_gguf_streams_carry_the_interval_too(gguf_stack):
    import grpc

    from millm.v1 import generation_service_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{gguf_stack.grpc_port}") as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        spaced, _ = _token_messages(stub, 5, model="millm-tiny-gguf:Q8_0")
    tokens = [sum(len(d.token_ids) for d in m.choices) for m in spaced]
    assert sum(tokens) == TOKENS and all(t >= 5 for t in tokens[1:-1])
    assert len(spaced) <= 1 + -(-(TOKENS - 1) // 5)


@pytest.mark.parametrize("value", [0, 257, -3])
def test_out_of_range_is_400_naming_the_field(stack, value):
    reply = call(stack.http_port, "POST", "/v1/chat/completions", {
        "model": "millm-tiny", "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 2, "stream": True, "stream_interval": value})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "stream_interval"
