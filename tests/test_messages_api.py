"""Anthropic's Messages API on the bridge, on the wire: the shapes, the event
sequence, the counts, the refusals in Anthropic's envelope, on the session
stack (millm-tiny) and on a stack of this module's own that serves the GGUF
export, and a tiny-queue stack for what only a full queue or a failing row
shows (529, an error event after the stream started); the idle pings are
checked on the bridge's own loop with a silent stand-in for the engine. The SDKs
themselves (anthropic, langchain-anthropic) run in tests/test_ecosystem.py.
"""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from millm.v1 import server_service_pb2, server_service_pb2_grpc
from rest_bridge.protocol.messages import MessagesInput
from rest_bridge.serving import messages, messages_input
from tests import harness
from tests.conftest import MODEL, inference_status, wait_until
from tests.grpc_helpers import prompt_request
from tests.http_helpers import call, post

Q8 = "millm-tiny-gguf:Q8_0"
WEATHER = {"name": "get_weather", "description": "Look up the weather in a city.",
           "input_schema": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 24}}, "required": ["city"]}}


def body(model: str, **extra) -> dict:
    return {"model": model, "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": "Tell me about the river."}], **extra}


def events(content: bytes) -> list[tuple[str, dict]]:
    """An Anthropic SSE body as (event, data) pairs; each frame names its
    event and its data's type is the same name."""
    assert content.endswith(b"\n\n"), content[-80:]
    out = []
    for frame in content[:-2].decode().split("\n\n"):
        name_line, data_line = frame.split("\n")
        name = name_line.removeprefix("event: ")
        data = json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name, frame
        out.append((name, data))
    return out


def error_of(reply) -> dict:
    payload = reply.json()
    assert payload["type"] == "error", payload
    return payload["error"]


@pytest.fixture(scope="module")
def gguf_stack(tmp_path_factory):
    own = harness.OwnStack(tmp_path_factory.mktemp("messages-gguf"), MILLM_MODEL=Q8)
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture(params=[MODEL, Q8])
def served(request, stack, gguf_stack):
    """(HTTP port, model) on each engine."""
    return (stack.http_port if request.param == MODEL else gguf_stack.http_port), request.param


# -- shapes --------------------------------------------------------------------------------


def test_message_shape_and_usage_match_count_tokens(served):
    port, model = served
    prompt = {"system": "You answer briefly.", "messages": [
        {"role": "user", "content": [{"type": "text", "text": f"Name a colour ({model})."}]}]}
    reply = call(port, "POST", "/v1/messages", {**body(model), **prompt})
    assert reply.status_code == 200, reply.text
    message = reply.json()
    assert message["id"].startswith("msg_") and message["type"] == "message"
    assert (message["role"], message["model"]) == ("assistant", model)
    assert message["stop_reason"] in ("end_turn", "max_tokens")
    assert [b["type"] for b in message["content"]] == ["text"]
    assert message["content"][0]["text"]
    usage = message["usage"]
    assert 0 < usage["output_tokens"] <= 24
    count = call(port, "POST", "/v1/messages/count_tokens", {"model": model, **prompt})
    assert count.status_code == 200, count.text
    assert count.json() == {"input_tokens": usage["input_tokens"]
                            + usage["cache_read_input_tokens"]}
    assert reply.headers["request-id"] == reply.headers["x-request-id"]


def test_stream_event_sequence_matches_the_whole_message(served):
    port, model = served
    whole = call(port, "POST", "/v1/messages", body(model, seed=5, temperature=0.8)).json()
    reply, content = post(port, "/v1/messages", body(model, seed=5, temperature=0.8,
                                                       stream=True))
    assert reply.status == 200 and reply.getheader("content-type").startswith(
        "text/event-stream")
    seen = events(content)
    names = [name for name, _ in seen]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert "ping" in names
    start = seen[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["id"].startswith("msg_")
    body_names = [n for n in names[1:-2] if n != "ping"]
    assert body_names[0] == "content_block_start" and body_names[-1] == "content_block_stop"
    text = "".join(d["delta"]["text"] for n, d in seen if n == "content_block_delta")
    assert text == whole["content"][0]["text"]
    delta = seen[-2][1]
    assert delta["delta"]["stop_reason"] == whole["stop_reason"]
    assert delta["usage"]["output_tokens"] == whole["usage"]["output_tokens"]


def test_stop_sequence_is_reported(served):
    port, model = served
    plain = call(port, "POST", "/v1/messages", body(model)).json()["content"][0]["text"]
    words = plain.split()
    assert len(words) > 2, plain
    stop = words[1]  # a word the greedy answer is known to write
    reply = call(port, "POST", "/v1/messages", body(model, stop_sequences=["\x01", stop]))
    message = reply.json()
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", stop)
    assert message["content"][0]["text"] == plain[:plain.index(stop)]
    _, content = post(port, "/v1/messages", body(model, stop_sequences=[stop], stream=True))
    delta = events(content)[-2][1]["delta"]
    assert delta == {"stop_reason": "stop_sequence", "stop_sequence": stop}


def test_forced_tool_use_and_the_tool_result_turn(served):
    port, model = served
    ask = {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather"},
           "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    message = call(port, "POST", "/v1/messages", {**body(model, max_tokens=64), **ask}).json()
    assert message["stop_reason"] == "tool_use", message
    (use,) = message["content"]
    assert use["type"] == "tool_use" and use["name"] == "get_weather"
    assert use["id"].startswith("toolu_")
    assert set(use["input"]) == {"city"} and len(use["input"]["city"]) <= 24
    _, content = post(port, "/v1/messages", {**body(model, max_tokens=64, stream=True), **ask})
    seen = events(content)
    starts = [d["content_block"] for n, d in seen if n == "content_block_start"]
    assert [(b["type"], b["name"], b["input"]) for b in starts] == [
        ("tool_use", "get_weather", {})]
    partial = "".join(d["delta"]["partial_json"] for n, d in seen if n == "content_block_delta")
    assert set(json.loads(partial)) == {"city"}
    follow = {"tools": [WEATHER], "messages": [
        ask["messages"][0], {"role": "assistant", "content": message["content"]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                      "content": [{"type": "text", "text": "Sunny, 21 C"}]}]}]}
    answer = call(port, "POST", "/v1/messages", {**body(model, max_tokens=32), **follow})
    assert answer.status_code == 200, answer.text
    assert answer.json()["stop_reason"] in ("end_turn", "max_tokens", "tool_use")


def test_a_call_cut_by_max_tokens_is_left_out_of_the_whole_message(served):
    """max_tokens ending a forced call (before its arguments or inside them)
    leaves no input to give: the whole message has no tool_use block, where it
    once had one with `input: {}` when the cut came before the arguments."""
    port, model = served
    ask = {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather"},
           "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    whole = call(port, "POST", "/v1/messages", {**body(model, max_tokens=64), **ask}).json()
    assert whole["stop_reason"] == "tool_use", whole
    length = whole["usage"]["output_tokens"]
    for max_tokens in sorted({1, length // 2}):  # (at length - 1 the call is whole)
        message = call(port, "POST", "/v1/messages",
                       {**body(model, max_tokens=max_tokens), **ask}).json()
        assert message["stop_reason"] == "max_tokens", (max_tokens, message)
        assert message["content"] == [], (max_tokens, message)
        assert message["usage"]["output_tokens"] == max_tokens


def test_any_tool_choice_calls_a_tool(stack):
    ask = {"tools": [WEATHER], "tool_choice": {"type": "any"},
           "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    message = call(stack.http_port, "POST", "/v1/messages", {**body(MODEL, max_tokens=64),
                                                             **ask}).json()
    assert message["stop_reason"] == "tool_use"
    assert [b["type"] for b in message["content"]] == ["tool_use"]


def test_a_final_assistant_message_is_continued(served):
    """Anthropic's prefill: the answer goes on from the assistant's words,
    which are not repeated."""
    port, model = served
    start = "The river"
    prefilled = body(model, max_tokens=12, messages=[
        {"role": "user", "content": "Tell me about the river."},
        {"role": "assistant", "content": start}])
    reply = call(port, "POST", "/v1/messages", prefilled)
    assert reply.status_code == 200, reply.text
    fresh = call(port, "POST", "/v1/messages", body(model, max_tokens=12)).json()
    continued = reply.json()
    assert continued["usage"]["input_tokens"] + continued["usage"][
        "cache_read_input_tokens"] > fresh["usage"]["input_tokens"]
    text = "".join(b["text"] for b in continued["content"] if b["type"] == "text")
    assert not text.startswith(start), text


def test_one_call_when_parallel_use_is_disabled(stack):
    """disable_parallel_tool_use is the contract's parallel_tool_calls false
    (whose grammar allows one call: test_tool_calls.py shows it either way),
    and the answer then holds exactly one tool_use block."""
    ask = {"tools": [WEATHER], "tool_choice": {"type": "any",
                                               "disable_parallel_tool_use": True},
           "messages": [{"role": "user", "content": "Weather in Paris, Rome and Oslo?"}]}
    for disabled, parallel in ((True, False), (False, True), (None, None)):
        choice = {"type": "any"} if disabled is None else {
            "type": "any", "disable_parallel_tool_use": disabled}
        pb, _ = messages_input.generate_request(MessagesInput.model_validate(
            {**body(MODEL), **ask, "tool_choice": choice}))
        assert (pb.parallel_tool_calls if pb.HasField("parallel_tool_calls") else None) == parallel
    for seed in (1, 2, 3):
        message = call(stack.http_port, "POST", "/v1/messages",
                       {**body(MODEL, max_tokens=120, seed=seed, temperature=1), **ask}).json()
        assert [b["type"] for b in message["content"]] == ["tool_use"], message
        assert message["stop_reason"] == "tool_use"


def test_prefix_cache_reads_are_counted_apart(stack):
    """A repeated long prompt is read from the prefix cache the second time:
    Anthropic's input_tokens leaves those out, and the two add up to the count."""
    system = "You are a careful guide to rivers. " * 12 + "(cache test)"
    sent = body(MODEL, system=system, max_tokens=4)
    count = call(stack.http_port, "POST", "/v1/messages/count_tokens",
                 {"model": MODEL, "system": system, "messages": sent["messages"]}).json()
    first = call(stack.http_port, "POST", "/v1/messages", sent).json()["usage"]
    second = call(stack.http_port, "POST", "/v1/messages", sent).json()["usage"]
    assert second["cache_read_input_tokens"] > 0, second
    for usage in (first, second):
        assert usage["input_tokens"] + usage["cache_read_input_tokens"] == count["input_tokens"]
        assert usage["cache_creation_input_tokens"] == 0


# -- refusals, in Anthropic's envelope -------------------------------------------------------


@pytest.mark.parametrize(("change", "status", "kind", "names"), [
    ({"max_tokens": None}, 400, "invalid_request_error", "'max_tokens'"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, 400, "invalid_request_error",
     "'thinking.budget_tokens'"),
    ({"thinking": {"type": "sometimes"}}, 400, "invalid_request_error", "'thinking.type'"),
    ({"n": 2}, 400, "invalid_request_error", "'n' is not honoured"),
    ({"model": "no-such-model"}, 404, "not_found_error", "no-such-model"),
    ({"max_tokens": 0}, 400, "invalid_request_error", "'max_tokens'"),
    ({"stop_sequences": ["a", "b", "c", "d", "e"]}, 400, "invalid_request_error",
     "'stop_sequences'"),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400, "invalid_request_error",
     "'messages[0].role'"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400,
     "invalid_request_error", "'image'"),
    ({"tools": [{**WEATHER, "input_schema": {"type": "string"}}]}, 400,
     "invalid_request_error", "'tools[0].input_schema'"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400,
     "invalid_request_error", "'web_search_20250305'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, 400,
     "invalid_request_error", "'nope', which is not among the tools"),
])
def test_refusals_name_the_field(stack, change, status, kind, names):
    sent = body(MODEL)
    for key, value in change.items():
        if value is None:
            sent.pop(key)
        else:
            sent[key] = value
    reply = call(stack.http_port, "POST", "/v1/messages", sent)
    assert reply.status_code == status, reply.text
    error = error_of(reply)
    assert error["type"] == kind and names in error["message"], error


def test_disabled_thinking_and_unread_fields(stack):
    sent = body(MODEL, thinking={"type": "disabled"}, metadata={"user_id": "u-1"},
                service_tier="auto")
    sent["messages"] = [{"role": "user", "content": [
        {"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}]}]
    reply = call(stack.http_port, "POST", "/v1/messages", sent)
    assert reply.status_code == 200, reply.text
    ignored = reply.headers["x-millm-ignored-fields"]
    # The demo model has no reasoning format: switching thinking off changes nothing.
    for name in ("metadata.user_id", "messages[0].content[0].cache_control", "service_tier",
                 "thinking"):
        assert f'"{name}"' in ignored, ignored


def test_bad_json_and_unknown_sub_route_use_anthropic_envelope(stack):
    reply = call(stack.http_port, "POST", "/v1/messages", raw=b"{nope")
    assert reply.status_code == 400 and error_of(reply)["type"] == "invalid_request_error"
    reply = call(stack.http_port, "POST", "/v1/messages/batches", {})
    assert reply.status_code == 404 and error_of(reply)["type"] == "not_found_error"
    # The OpenAI routes keep theirs.
    reply = call(stack.http_port, "POST", "/v1/chat/completions", {"model": MODEL})
    assert reply.json()["error"]["code"] == "missing_required_parameter"


def test_models_in_anthropic_shape_with_anthropic_version(stack):
    reply, content = harness_get(stack.http_port, "/v1/models", {"anthropic-version":
                                                                 "2023-06-01"})
    page = json.loads(content)
    assert page["has_more"] is False and page["first_id"] == page["data"][0]["id"]
    assert {"type": "model", "id": MODEL, "display_name": MODEL} == {
        k: v for k, v in next(m for m in page["data"] if m["id"] == MODEL).items()
        if k != "created_at"}
    reply, content = harness_get(stack.http_port, f"/v1/models/{MODEL}",
                                 {"anthropic-version": "2023-06-01"})
    assert json.loads(content)["type"] == "model"
    reply, content = harness_get(stack.http_port, "/v1/models", {})
    assert json.loads(content)["object"] == "list"


def harness_get(port: int, path: str, headers: dict):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path, headers=headers)
    reply = conn.getresponse()
    content = reply.read()
    conn.close()
    return reply, content


def test_capabilities_list_the_messages_route(stack):
    with grpc.insecure_channel(stack.grpc_target) as channel:
        reply = server_service_pb2_grpc.ServerServiceStub(channel).GetCapabilities(
            server_service_pb2.GetCapabilitiesRequest(), timeout=10)
    rows = {(r.field, r.route): r for r in reply.fields}
    assert rows[("tools", "messages")].honoured
    assert rows[("seed", "messages")].honoured
    # The demo model has no reasoning format: thinking changes nothing there.
    assert rows[("thinking", "messages")].reported
    assert rows[("thinking", "chat")].refusal_code == "field_not_honoured"
    assert rows[("n", "messages")].refusal_code == "field_not_honoured"


# -- a full queue ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_queue(tmp_path_factory):
    """One running row, one waiting request at most; the 8th row pass fails."""
    own = harness.OwnStack(tmp_path_factory.mktemp("messages-queue"), MILLM_MAX_BATCH="1",
                           MILLM_MAX_QUEUED="1", MILLM_FAULT_INJECTION="row:error:8")
    try:
        yield own
    finally:
        own.stop()


def test_a_failure_after_the_start_is_an_error_event(tiny_queue):
    # The first request of this stack: its 8th token fails (fault injection).
    reply, content = post(tiny_queue.http_port, "/v1/messages",
                          body(MODEL, max_tokens=40, stream=True, temperature=0.0))
    assert reply.status == 200
    seen = events(content)
    assert seen[0][0] == "message_start"
    name, data = seen[-1]
    assert name == "error" and data["error"]["type"] == "api_error", seen[-3:]
    assert "message_stop" not in [n for n, _ in seen]
    # Counted as a failed stream of its own route, though its status was 200.
    metrics = call(tiny_queue.http_port, "GET", "/metrics").text
    assert any(line.startswith("millm_bridge_stream_failures_total{")
               and 'route="/v1/messages"' in line and not line.endswith(" 0.0")
               for line in metrics.splitlines()), metrics[-2000:]


def test_full_queue_is_529_overloaded(tiny_queue):
    from millm.v1 import generation_service_pb2_grpc

    with grpc.insecure_channel(tiny_queue.grpc_target) as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        status = server_service_pb2_grpc.ServerServiceStub(channel)
        long = dict(max_tokens=900, temperature=0, ignore_eos=True)
        running = stub.Generate(prompt_request("The river", **long))
        next(running)
        assert wait_until(lambda: inference_status(status).running_rows == 1)
        waiting = stub.Generate(prompt_request("The market", **long))
        next(waiting)  # metadata: accepted into the queue
        full = call(tiny_queue.http_port, "POST", "/v1/messages", body(MODEL))
        running.cancel()
        waiting.cancel()
    assert full.status_code == 529, full.text
    assert error_of(full) == {"type": "overloaded_error", "message": error_of(full)["message"]}
    assert full.headers.get("retry-after") == "1"


class _SlowCall:
    """A GenerateCall stand-in whose engine says nothing for a while."""

    def __init__(self, pause: float):
        self.pause = pause

    async def rest(self):
        yield "first"
        await asyncio.sleep(self.pause)
        yield "second"


def test_an_idle_stream_pings(monkeypatch):
    monkeypatch.setattr(messages, "PING_INTERVAL_S", 0.05)

    async def gather():
        return [m async for m in messages._with_pings(_SlowCall(0.3))]

    seen = asyncio.run(gather())
    assert seen[0] == "first" and seen[-1] == "second"
    assert 3 <= seen.count(None) <= 7, seen  # one per interval the engine was silent
