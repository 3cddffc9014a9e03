"""Generated requests on every /v1/responses route: never a 5xx, always the
OpenAI envelope on an error, a stream read to its end that ends with one
terminal event and no [DONE] and carries no fault of the server (a
response.failed the server caused fails the test), and the server keeps
answering afterwards (as tests/test_fuzz_bodies.py does for chat and text
completions), drawn anew each run (tests/fuzz_support.py). POST bodies, and
GET, DELETE and input_items on stored responses, unknown ones and odd ids
with odd query values. The checks take a stack, so another stack (a
PostgreSQL one) can run them too."""

from __future__ import annotations

import json
import urllib.parse

from hypothesis import event, given
from hypothesis import strategies as st

from tests.conftest import MODEL
from tests.fuzz_support import ANY_JSON, JSON_VALUES, ODD_TEXT, fuzz
from tests.http_helpers import call, post
from tests.sweep_support import stream_problem
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
    st.fixed_dictionaries({"type": st.sampled_from(["custom_tool_call",
                                                    "custom_tool_call_output"])}, optional={
        "call_id": sometimes(st.sampled_from(["call_1", "call_9"])),
        "name": sometimes(st.sampled_from(["patch", "f"])),
        "input": sometimes(TEXT), "output": sometimes(CONTENT)}),
    st.fixed_dictionaries({"type": st.sampled_from(["input_image", "web_search_call",
                                                    "item_reference", "reasoning"])},
                          optional={"encrypted_content": sometimes(TEXT)}),
), max_size=1)
TOOL = st.one_of(
    st.fixed_dictionaries({"type": st.just("function"), "name": st.sampled_from(
        ["get_weather", "f", "bad name"])}, optional={"parameters": sometimes(
            st.sampled_from([{"type": "object"}, {"type": "string"}, {"type": "object",
                             "properties": {"city": {"type": "string", "maxLength": 8}}}]))}),
    st.fixed_dictionaries({"type": st.sampled_from(["web_search", "file_search", "mcp",
                                                    "local_shell"])}),
    # Codex's shapes: a namespace of functions, a custom tool with a grammar.
    st.fixed_dictionaries({"type": st.just("namespace"), "name": sometimes(
        st.sampled_from(["collab", "mcp__x__", "bad name"])), "tools": sometimes(st.lists(
            st.fixed_dictionaries({"type": st.sampled_from(["function", "custom", "mcp"]),
                                   "name": sometimes(st.sampled_from(["f", "g"]))}),
            max_size=2))}),
    st.fixed_dictionaries({"type": st.just("custom"), "name": st.sampled_from(
        ["patch", "f"])}, optional={"format": sometimes(st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "grammar", "yaml"])}, optional={
                "syntax": sometimes(st.sampled_from(["lark", "regex", "ebnf"])),
                "definition": sometimes(st.one_of(TEXT, st.sampled_from(
                    ['start: "a"+', "[a-z]{1,3}", 'start: x\nx: "\\"" /[^"]*/']))),
            }))}))
FIELDS = {
    "instructions": sometimes(TEXT),
    "temperature": sometimes(st.floats(-1, 3)),
    "top_p": sometimes(st.floats(-0.5, 1.5)),
    "tools": sometimes(st.lists(TOOL, max_size=2)),
    "tool_choice": sometimes(st.one_of(st.sampled_from(["auto", "none", "required", "any"]),
                                       st.fixed_dictionaries({"type": st.sampled_from(
                                           ["function", "custom", "web_search"]),
                                           "name": st.sampled_from(["f", "patch"])},
                                           optional={"namespace": sometimes(st.sampled_from(
                                               ["collab", "mcp__x__"]))}))),
    "include": sometimes(st.lists(st.sampled_from(
        ["reasoning.encrypted_content", "message.output_text.logprobs", ""]), max_size=2)),
    "prompt_cache_key": sometimes(TEXT),
    "client_metadata": sometimes(JSON_VALUES),
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


def check_body(stack, payload: dict, headers: dict) -> None:
    """One POST /v1/responses against the fuzzers' bar."""
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
        assert stream_problem(content) is None, (stream_problem(content), payload)
    else:
        assert json.loads(content)["object"] == "response"


@fuzz(max_examples=150)
@given(payload=BODIES, headers=STRICT)
def test_responses_bodies(stack, payload, headers):
    check_body(stack, payload, headers)


# An id: a stored one, an unknown one, or odd text (NUL, long, escaped, empty).
ID = st.one_of(st.just("STORED"), st.sampled_from(["resp_nothing", "resp_", "chatcmpl-1"]),
               ODD_TEXT, st.text(max_size=300), st.builds(lambda n: "resp_" + "a" * n,
                                                          st.integers(190, 5_000)))
QUERY_VALUE = st.one_of(ODD_TEXT, st.sampled_from(["1", "100", "101", "0", "-1", "asc",
                                                   "desc", "true", "msg_x"]),
                        ANY_JSON.map(json.dumps))
READS = st.sampled_from([("GET", ""), ("GET", "/input_items"), ("DELETE", "")])


def check_read(stack, method: str, path: str) -> None:
    """One GET or DELETE on a stored response's route against the fuzzers' bar."""
    reply = call(stack.http_port, method, path, timeout=60)
    assert reply.status_code < 500, (method, path[:300], reply.text[:500])
    if reply.status_code >= 400:
        error = reply.json()["error"]
        event(f"{method} {reply.status_code} {error['code']}")
        assert set(error) == {"message", "type", "param", "code"}, reply.text[:500]
    elif reply.status_code >= 300:  # "/v1/responses/" (no id): FastAPI's slash redirect
        event(f"{method} {reply.status_code}")
        assert reply.headers["location"], reply.headers
    else:
        event(f"{method} {reply.status_code}")
        assert reply.json()["object"] in ("response", "list"), reply.text[:500]


def stored_response(stack) -> str:
    made = call(stack.http_port, "POST", "/v1/responses", {
        "model": MODEL, "input": [{"role": "user", "content": "one"},
                                  {"role": "user", "content": "two"}],
        "max_output_tokens": 1})
    assert made.status_code == 200, made.text
    return made.json()["id"]


@fuzz(max_examples=150)
@given(read=READS, response_id=ID,
       query=st.dictionaries(st.sampled_from(["limit", "order", "after", "before", "stream",
                                              "include"]), QUERY_VALUE, max_size=3))
def test_stored_response_routes(stack, read, response_id, query):
    method, suffix = read
    if response_id == "STORED":
        response_id = stored_response(stack)
    quoted = urllib.parse.quote(response_id.encode("utf-8", "surrogatepass"), safe="")[:8_000]
    path = f"/v1/responses/{quoted}{suffix}"
    if query:
        path += "?" + urllib.parse.urlencode(
            {k: v.encode("utf-8", "surrogatepass")[:2_000] for k, v in query.items()})
    check_read(stack, method, path)


def test_still_answering_after_the_fuzzing(client):
    r = client.responses.create(model=MODEL, input="Hello!", max_output_tokens=3, store=False)
    assert r.status in ("completed", "incomplete")
