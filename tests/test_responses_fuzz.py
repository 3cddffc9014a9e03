"""Generated bodies thrown at POST /v1/responses: never a 5xx, always the
OpenAI envelope on an error, a stream that ends with one terminal event and no
[DONE], and the server keeps answering afterwards (as tests/test_fuzz_bodies.py
does for chat and text completions), drawn anew each run (tests/fuzz_support.py)."""

from __future__ import annotations

import json

from hypothesis import event, given
from hypothesis import strategies as st

from tests.conftest import MODEL
from tests.fuzz_support import JSON_VALUES, fuzz
from tests.http_helpers import post
from tests.test_fuzz_bodies import STRICT, TEXT, sometimes, with_unknown_keys

PART = st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text",
                                                       "input_image", "refusal"])},
                             optional={"text": TEXT})
CONTENT = st.one_of(TEXT, st.lists(PART, max_size=2))
ITEM = with_unknown_keys(st.one_of(
    st.fixed_dictionaries({"role": sometimes(st.sampled_from(
        ["user", "system", "developer", "assistant", "tool", ""]))},
        optional={"type": st.just("message"), "content": sometimes(CONTENT)}),
    st.fixed_dictionaries({"type": st.just("function_call")}, optional={
        "call_id": sometimes(st.sampled_from(["call_1", "call_2", ""])),
        "name": sometimes(st.sampled_from(["f", "get_weather", "bad name"])),
        "arguments": sometimes(st.sampled_from(["{}", '{"city": "x"}', "[1]", "nope"]))}),
    st.fixed_dictionaries({"type": st.just("function_call_output")}, optional={
        "call_id": sometimes(st.sampled_from(["call_1", "call_9"])),
        "output": sometimes(CONTENT)}),
    st.fixed_dictionaries({"type": st.sampled_from(["input_image", "web_search_call",
                                                    "item_reference", "reasoning"])}),
), max_size=1)
TOOL = st.one_of(
    st.fixed_dictionaries({"type": st.just("function"), "name": st.sampled_from(
        ["get_weather", "f", "bad name"])}, optional={"parameters": sometimes(
            st.sampled_from([{"type": "object"}, {"type": "string"}, {"type": "object",
                             "properties": {"city": {"type": "string", "maxLength": 8}}}]))}),
    st.fixed_dictionaries({"type": st.sampled_from(["web_search", "file_search"])}))
FIELDS = {
    "instructions": sometimes(TEXT),
    "temperature": sometimes(st.floats(-1, 3)),
    "top_p": sometimes(st.floats(-0.5, 1.5)),
    "tools": sometimes(st.lists(TOOL, max_size=2)),
    "tool_choice": sometimes(st.one_of(st.sampled_from(["auto", "none", "required", "any"]),
                                       st.fixed_dictionaries({"type": st.just("function"),
                                                              "name": st.just("f")}))),
    "parallel_tool_calls": sometimes(st.booleans()),
    "text": sometimes(st.fixed_dictionaries({}, optional={"format": st.sampled_from([
        {"type": "text"}, {"type": "json_object"}, {"type": "yaml"},
        {"type": "json_schema", "name": "w", "schema": {"type": "object"}}])})),
    "stream": sometimes(st.booleans()),
    "store": sometimes(st.booleans()),
    "previous_response_id": sometimes(st.sampled_from(["resp_nothing", "", "chatcmpl-1"])),
    "metadata": sometimes(st.dictionaries(st.text(max_size=70), st.text(max_size=20),
                                          max_size=18)),
    "background": sometimes(st.booleans()),
    "truncation": sometimes(st.sampled_from(["auto", "disabled"])),
    "reasoning": sometimes(JSON_VALUES),
    "seed": sometimes(st.integers(-5, 2**33)),
    "n": sometimes(st.integers(0, 3)),
}
BODIES = with_unknown_keys(st.fixed_dictionaries(
    {"model": sometimes(st.sampled_from([MODEL, MODEL, "other-model"])),
     "max_output_tokens": sometimes(st.integers(-1, 6)),
     "input": sometimes(st.one_of(TEXT, st.lists(ITEM, max_size=4)))},
    optional=FIELDS))


@fuzz(max_examples=150)
@given(payload=BODIES, headers=STRICT)
def test_responses_bodies(stack, payload, headers):
    reply, content = post(stack.http_port, "/v1/responses", payload, headers=headers)
    assert reply.status < 500, (reply.status, payload, content[:500])
    if reply.status >= 400:
        error = json.loads(content)["error"]
        event(f"{reply.status} {error['code']}")
        assert set(error) == {"message", "type", "param", "code"}, content
        assert error["message"] and error["type"] == "invalid_request_error"
        return
    event("200")
    if payload.get("stream") is True:
        assert b"[DONE]" not in content
        last = json.loads(content.strip().split(b"\n")[-1].removeprefix(b"data: "))
        assert last["type"] in ("response.completed", "response.incomplete",
                                "response.failed"), content[-500:]
    else:
        assert json.loads(content)["object"] == "response"


def test_still_answering_after_the_fuzzing(client):
    r = client.responses.create(model=MODEL, input="Hello!", max_output_tokens=3, store=False)
    assert r.status in ("completed", "incomplete")
