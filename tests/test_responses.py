"""POST /v1/responses and the stored responses, through the real OpenAI SDK
against the session's engine and bridge (millm-tiny).

The demo model is tiny and random-ish: these tests assert on shapes, event
order, what a forced tool call's grammar guarantees (arguments that
validate), what the store keeps (input items, chains), and on text only where
a seed makes it reproducible.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from service.demo_model.build import CONTEXT_WINDOW
from tests.conftest import MODEL
from tests.http_helpers import call

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
           "required": ["city"], "additionalProperties": False}
TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
        "parameters": WEATHER}
FORCED = {"type": "function", "name": "get_weather"}
MESSAGE_EVENTS = ["response.output_item.added", "response.content_part.added",
                  "response.output_text.delta", "response.output_text.done",
                  "response.content_part.done", "response.output_item.done"]


def _collapse(types: list[str]) -> list[str]:
    """Runs of the same delta event as one."""
    out: list[str] = []
    for t in types:
        if not (out and out[-1] == t and t.endswith(".delta")):
            out.append(t)
    return out


def test_create_returns_a_completed_response_with_output_text(client):
    # 64: room for the demo model's seeded answer (35 tokens on build 5), so
    # that it ends on its own and the response is completed.
    r = client.responses.create(model=MODEL, input="Hello!", max_output_tokens=64,
                                metadata={"team": "search"}, instructions="Be brief.",
                                extra_body={"seed": 1})
    assert r.id.startswith("resp_") and r.object == "response" and r.model == MODEL
    assert r.status == "completed" and r.error is None and r.incomplete_details is None
    assert isinstance(r.output_text, str) and r.output_text
    [message] = r.output
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.status == "completed"
    assert message.content[0].type == "output_text"
    assert message.content[0].text == r.output_text
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 64
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    # The request's settings, echoed.
    assert (r.max_output_tokens, r.instructions, r.metadata) == (64, "Be brief.",
                                                                 {"team": "search"})
    assert (r.temperature, r.top_p, r.tool_choice, r.tools) == (1.0, 1.0, "auto", [])
    assert r.store is True and r.parallel_tool_calls is True
    # Seeded: the same request gives the same text.
    again = client.responses.create(model=MODEL, input="Hello!", max_output_tokens=64,
                                    instructions="Be brief.", store=False,
                                    extra_body={"seed": 1})
    assert again.output_text == r.output_text and again.id != r.id


def test_max_output_tokens_reached_is_incomplete(client):
    r = client.responses.create(model=MODEL, input="Tell me a long story.", max_output_tokens=1,
                                temperature=0, store=False)
    assert r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete" and r.usage.output_tokens == 1


def test_stream_events_come_in_order(client):
    with client.responses.stream(model=MODEL, input="Hello!", max_output_tokens=60,
                                 extra_body={"seed": 2}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(events)))
    assert _collapse(types) == ["response.created", "response.in_progress", *MESSAGE_EVENTS,
                                "response.completed"]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == text == final.output_text
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert item_ids == {final.output[0].id}
    assert final.status == "completed" and final.id == events[0].response.id
    # The streamed response was stored before its last event.
    stored = client.responses.retrieve(final.id)
    assert stored.output_text == text and stored.status == "completed"
    # The same seed, not streamed: the same text.
    whole = client.responses.create(model=MODEL, input="Hello!", max_output_tokens=60,
                                    store=False, extra_body={"seed": 2})
    assert whole.output_text == text


def test_raw_stream_is_typed_sse_without_done(stack):
    reply = call(stack.http_port, "POST", "/v1/responses",
                 {"model": MODEL, "input": "Hi", "max_output_tokens": 5, "stream": True,
                  "store": False})
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in reply.text.split("\n\n") if b]
    assert "[DONE]" not in reply.text
    for block in blocks:
        event, data = block.split("\n")
        assert event.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[6:])["type"] == event[7:]
    last = json.loads(blocks[-1].split("\n")[1][6:])
    # Five tokens may not be enough: the terminal event says which it was.
    assert last["type"] == f"response.{last['response']['status']}"
    assert last["response"]["status"] in ("completed", "incomplete")


def test_forced_function_call_validates(client):
    r = client.responses.create(model=MODEL, input="What is the weather in Paris?",
                                tools=[TOOL], tool_choice=FORCED, store=False,
                                extra_body={"seed": 1})
    assert r.status == "completed" and r.output_text == ""
    [item] = r.output
    assert item.type == "function_call" and item.name == "get_weather"
    assert item.call_id.startswith("call_") and item.id.startswith("fc_")
    jsonschema.validate(json.loads(item.arguments), WEATHER)
    assert r.tool_choice.name == "get_weather" and r.tools[0].name == "get_weather"


def test_streamed_function_call_has_its_own_item(client):
    with client.responses.stream(model=MODEL, input="Weather in Rome?", tools=[TOOL],
                                 tool_choice=FORCED, store=False,
                                 extra_body={"seed": 2}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = _collapse([e.type for e in events])
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done",
                     "response.completed"]
    added = events[2].item
    assert added.type == "function_call" and added.arguments == "" and added.name == "get_weather"
    arguments = "".join(e.delta for e in events
                        if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == arguments == final.output[0].arguments
    jsonschema.validate(json.loads(arguments), WEATHER)
    assert not any(e.type == "response.output_text.delta" for e in events)


def test_three_turn_chain_with_a_function_call(client):
    first = client.responses.create(model=MODEL, input="My name is Ada.", max_output_tokens=10,
                                    instructions="Turn one only.")
    second = client.responses.create(model=MODEL, previous_response_id=first.id,
                                     input="What is the weather in Oslo?", tools=[TOOL],
                                     tool_choice=FORCED)
    [call_item] = second.output
    assert call_item.type == "function_call"
    third = client.responses.create(
        model=MODEL, previous_response_id=second.id, max_output_tokens=10,
        input=[{"type": "function_call_output", "call_id": call_item.call_id,
                "output": "Sunny, 21 degrees."}])
    assert third.status in ("completed", "incomplete")
    assert third.previous_response_id == second.id and third.instructions is None
    items = client.responses.input_items.list(third.id, order="asc", limit=100).data
    assert [i.type for i in items] == ["message", "message", "message", "function_call",
                                       "function_call_output"]
    user1, answer1, user2, called, output = items
    assert (user1.role, user1.content[0].text) == ("user", "My name is Ada.")
    assert answer1.role == "assistant" and answer1.id == first.output[0].id
    assert answer1.content[0].text == first.output_text
    assert user2.content[0].text == "What is the weather in Oslo?"
    assert (called.id, called.call_id, called.arguments) == (
        call_item.id, call_item.call_id, call_item.arguments)
    assert (output.call_id, output.output) == (call_item.call_id, "Sunny, 21 degrees.")
    # The earlier turns reach the prompt (the second's tools, not sent again, do not).
    assert third.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


def test_input_items_pages(client):
    turns = [{"role": "user", "content": f"Line {i}"} for i in range(5)]
    r = client.responses.create(model=MODEL, input=turns, max_output_tokens=2)
    newest_first = client.responses.input_items.list(r.id, limit=2)
    assert [i.content[0].text for i in newest_first.data] == ["Line 4", "Line 3"]
    assert newest_first.has_more and newest_first.first_id == newest_first.data[0].id
    seen = [i.content[0].text for i in client.responses.input_items.list(r.id, limit=2)]
    assert seen == [f"Line {i}" for i in (4, 3, 2, 1, 0)]  # the SDK follows `after`
    page = client.responses.input_items.list(r.id, order="asc", limit=3)
    assert [i.content[0].text for i in page.data] == ["Line 0", "Line 1", "Line 2"]
    rest = client.responses.input_items.list(r.id, order="asc", limit=3, after=page.last_id)
    assert [i.content[0].text for i in rest.data] == ["Line 3", "Line 4"]
    assert rest.has_more is False and page.has_more is True


def test_retrieve_then_delete(client):
    r = client.responses.create(model=MODEL, input="Remember me.", max_output_tokens=5,
                                metadata={"k": "v"})
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.retrieve(r.id)
    assert caught.value.body["code"] == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="again", previous_response_id=r.id)


def test_a_call_cut_by_max_output_tokens_is_stored_incomplete(stack, client):
    """A forced call cut mid-arguments is an incomplete response with an
    incomplete function_call item whose arguments are the text so far, and
    it is stored (the save once refused the cut arguments as "not JSON" and
    the client got a 400 naming a field it never sent). Continuing from it is
    a 400 naming previous_response_id: a cut call cannot be answered."""
    tool = {"type": "function", "name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}
    made = call(stack.http_port, "POST", "/v1/responses", {
        "model": MODEL, "input": "hi", "max_output_tokens": 16, "temperature": 0,
        "tools": [tool], "tool_choice": "required"})
    assert made.status_code == 200, made.text
    body = made.json()
    assert body["status"] == "incomplete", body
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    item = body["output"][0]
    assert item["type"] == "function_call" and item["status"] == "incomplete", item
    with pytest.raises(json.JSONDecodeError):
        json.loads(item["arguments"])
    read = call(stack.http_port, "GET", f"/v1/responses/{body['id']}")
    assert read.status_code == 200 and read.json()["output"] == body["output"], read.text
    after = call(stack.http_port, "POST", "/v1/responses", {
        "model": MODEL, "previous_response_id": body["id"], "max_output_tokens": 4,
        "input": [{"type": "function_call_output", "call_id": item["call_id"], "output": "3"}]})
    assert after.status_code == 400, after.text
    assert after.json()["error"]["param"].startswith("previous_response_id"), after.text


@pytest.mark.parametrize("method, path", [
    ("GET", "/v1/responses/abc"), ("GET", "/v1/responses/%2e%2e"),
    ("DELETE", "/v1/responses/abc"), ("GET", "/v1/responses/abc/input_items")])
def test_a_malformed_path_id_is_named_as_the_path_parameter(stack, method, path):
    """Every route with the id in its path names it `response_id` (OpenAI's
    `{response_id}`); a read once said "'None' must be a response id"."""
    error = call(stack.http_port, method, path).json()["error"]
    assert error["param"] == "response_id", error
    assert error["message"].startswith("'response_id' must be a response id"), error


def test_retrieve_does_not_replay_as_a_stream(stack, client):
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    reply = call(stack.http_port, "GET", f"/v1/responses/{r.id}?stream=true")
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "stream"


def test_store_false_is_not_kept(client):
    r = client.responses.create(model=MODEL, input="Forget me.", max_output_tokens=3,
                                store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_json_schema_text_format(client):
    fmt = {"type": "json_schema", "name": "weather", "schema": WEATHER, "strict": True}
    r = client.responses.create(model=MODEL, input="Weather in Lima as JSON.",
                                text={"format": fmt}, extra_body={"seed": 4}, store=False)
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), WEATHER)
    assert r.text.format.type == "json_schema" and r.text.format.name == "weather"


@pytest.mark.parametrize(("body", "status", "code", "param"), [
    ({"previous_response_id": "resp_doesnotexist"}, 404, "response_not_found",
     "previous_response_id"),
    ({"input": [{"type": "input_image", "image_url": "http://x/y.png"}]}, 400,
     "unsupported_item_type", "input[0].type"),
    ({"input": [{"role": "user", "content": "a"}, {"type": "web_search_call", "id": "ws_1"}]},
     400, "unsupported_item_type", "input[1].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, 400,
     "unsupported_content_type", "input[0].content[0].type"),
    # A hosted tool is reported (test_responses_agents.py); forcing one is refused.
    ({"tools": [TOOL, {"type": "web_search"}], "tool_choice": {"type": "web_search"}}, 400,
     "field_not_honoured", "tool_choice.type"),
    ({"background": True}, 400, "field_not_honoured", "background"),
    ({"truncation": "auto"}, 400, "field_not_honoured", "truncation"),
    ({"n": 2}, 400, "field_not_honoured", "n"),
    ({"prompt": {"id": "pmpt_1"}}, 400, "field_not_honoured", "prompt"),
    ({"temperature": 5}, 400, "invalid_parameter", "temperature"),
    ({"max_output_tokens": 0}, 400, "invalid_parameter", "max_output_tokens"),
    ({"input": "mill " * (CONTEXT_WINDOW + 100)}, 400, "context_length_exceeded", "input"),
    ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [TOOL]}, 400,
     "invalid_parameter", "tool_choice.name"),
    ({"input": [{"role": "user", "content": "a"},
                {"type": "function_call_output", "call_id": "call_x", "output": "1"}]}, 400,
     "invalid_parameter", "input[1].call_id"),
    ({"input": [{"role": "user", "content": "a"},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]},
     400, "invalid_parameter", "input[1].arguments"),
    ({"input": [{"role": "tool", "content": "a"}]}, 400, "invalid_parameter", "input[0].role"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "bad name!",
                                        "schema": WEATHER}}}, 400, "invalid_parameter",
     "text.format.name"),
])
def test_bad_input_names_the_field(stack, body, status, code, param):
    reply = call(stack.http_port, "POST", "/v1/responses",
                 {"model": MODEL, "input": "Hello", "max_output_tokens": 4, **body})
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error


def test_a_refusal_before_the_stream_opens_is_an_http_error(stack):
    reply = call(stack.http_port, "POST", "/v1/responses",
                 {"model": MODEL, "input": "Hello", "stream": True, "background": True})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "background"


def test_oversized_body_is_413(stack):
    reply = call(stack.http_port, "POST", "/v1/responses",
                 {"model": MODEL, "input": "x" * (2 << 20)})
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "request_too_large"


def test_reported_fields_reach_the_ignored_fields_header(stack):
    reply = call(stack.http_port, "POST", "/v1/responses",
                 {"model": MODEL, "input": "Hi", "max_output_tokens": 2, "store": False,
                  "reasoning": {"effort": "low"}, "user": "u1", "service_tier": "auto"})
    assert reply.status_code == 200, reply.text
    ignored = reply.headers["x-millm-ignored-fields"]
    # reasoning.effort is chat's reasoning_effort, which a model with no
    # reasoning format reports (tests/test_format_replies.py serves one that has).
    for name in ("reasoning_effort", "service_tier", "user"):
        assert f'"{name}"' in ignored
    assert reply.json()["user"] == "u1"
