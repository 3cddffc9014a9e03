"""Requests as coding agents send them (issue 42 items 4 and 5), on both
engines, through the real stack with the openai SDK and raw HTTP for the
Messages API (the anthropic SDK is not installed).

- Qwen Code sends non-strict tools whose schemas use oneOf, anyOf and $ref
  beside `max_tokens: 32000` and a long system prompt; Claude Code sends
  rich `input_schema`s and the same max_tokens. Both are served: the schema
  is relaxed for the grammar (service/schema_relax.py), a forced call's
  arguments still parse and follow what was enforced, and max_tokens past
  the room the prompt leaves is capped to it (X-miLLM-Max-Tokens-Capped).
- A strict tool keeps the subset; a prompt past the window stays
  context_length_exceeded.
- Where the window fills, each route says so its own way: `length` on chat,
  `model_context_window_exceeded` on Messages, `incomplete` with
  max_output_tokens on Responses. Shown on a GGUF stack with a 1,024-token
  window (MILLM_GGUF_CONTEXT): filling the demo's 32k window takes too long.
"""

from __future__ import annotations

import json

import grpc
import jsonschema
import openai
import pytest
import requests

from millm.v1 import generation_service_pb2_grpc
from service.demo_model.build import CONTEXT_WINDOW
from service.schema_relax import relax
from tests import harness
from tests.conftest import MODEL
from tests.grpc_helpers import chat_request

Q8 = "millm-tiny-gguf:Q8_0"
CAPPED = "x-millm-max-tokens-capped"
SMALL_WINDOW = 1024
# A tool schema in the shapes agents send: unions, a definition, `not`,
# conditions and pattern-keyed properties. Every property is required and
# bounded, so a forced call closes quickly.
RICH = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {
        "action": {"oneOf": [{"const": "read"}, {"const": "write"}]},
        "target": {"$ref": "#/definitions/Target"},
        "flag": {"anyOf": [{"type": "boolean"}, {"type": "null"}], "not": {"const": 1}},
    },
    "required": ["action", "target", "flag"],
    "additionalProperties": False,
    "patternProperties": {"^x-": {"type": "string"}},
    "definitions": {"Target": {
        "type": "object", "properties": {"line": {"type": "integer", "minimum": 0,
                                                  "maximum": 99}},
        "required": ["line"], "additionalProperties": False,
        "if": {"required": ["line"]}, "then": {"properties": {"line": {"minimum": 0}}}}},
}
CHAT_TOOL = {"type": "function", "function": {"name": "edit_file", "description": "Edit a file",
                                              "parameters": RICH}}
RESPONSES_TOOL = {"type": "function", "name": "edit_file", "description": "Edit a file",
                  "parameters": RICH, "strict": False}
MESSAGES_TOOL = {"name": "edit_file", "description": "Edit a file", "input_schema": RICH}
# Long enough that 32,000 more tokens do not fit in the demo's 32,768.
SYSTEM = "You are Qwen Code, an interactive CLI agent for software engineering. " * 80
ASK = "What does calc.py do?"


@pytest.fixture(params=[("stack", MODEL), ("gguf_stack", Q8)], ids=["transformers", "gguf"])
def served(request):
    """(stack, model) of each engine."""
    name, model = request.param
    return request.getfixturevalue(name), model


def _sdk(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0,
                         timeout=300)


def _messages(stack, body: dict, **headers) -> requests.Response:
    return requests.post(f"{stack.base_url}/v1/messages", json=body, timeout=300,
                         headers={"anthropic-version": "2023-06-01", **headers})


def _cap(headers, prompt_tokens: int, window: int = CONTEXT_WINDOW) -> None:
    assert headers[CAPPED] == f"{window - prompt_tokens};requested=32000"


def _first_event(stack, path: str, body: dict, **headers) -> tuple[int, dict, str]:
    """Status, headers and the first SSE event of a streamed request; the
    stream is then closed. Whether the model ends its turn or writes until
    the window is full is the model's choice (a rambling build would take
    minutes to fill 32,768 positions): what these tests check is that the
    request is served and capped, which the response's head says."""
    with requests.post(f"{stack.base_url}{path}", json={**body, "stream": True}, stream=True,
                       timeout=300, headers={"anthropic-version": "2023-06-01", **headers}
                       ) as reply:
        lines = reply.iter_lines(decode_unicode=True)
        first = next((line for line in lines if line.startswith("data:")), "")
        return reply.status_code, dict(reply.headers), first


def _prompt_tokens(stack, path: str, body: dict) -> int:
    """The prompt's tokens as the route counts them (a one-token answer)."""
    if path == "/v1/messages":
        usage = _messages(stack, {**body, "max_tokens": 1}).json()["usage"]
        return usage["input_tokens"] + usage["cache_read_input_tokens"]
    reply = requests.post(f"{stack.base_url}{path}", timeout=300, json={
        **body, **({"max_output_tokens": 16} if path == "/v1/responses" else {"max_tokens": 1})})
    usage = reply.json()["usage"]
    return usage.get("prompt_tokens", usage.get("input_tokens"))


def test_a_qwen_code_request_is_served_with_its_max_tokens_capped(served):
    engine, model = served
    body = {"model": model, "seed": 1, "tools": [CHAT_TOOL],
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}]}
    status, headers, first = _first_event(engine, "/v1/chat/completions",
                                          {**body, "max_tokens": 32000})
    assert status == 200 and first, first
    _cap(headers, _prompt_tokens(engine, "/v1/chat/completions", body))


def test_the_rich_tool_is_served_on_responses_and_messages(served):
    engine, model = served
    body = {"model": model, "instructions": SYSTEM, "input": ASK, "tools": [RESPONSES_TOOL],
            "temperature": 0, "store": False}
    status, headers, first = _first_event(engine, "/v1/responses",
                                          {**body, "max_output_tokens": 32000})
    assert status == 200 and '"response.created"' in first, first
    _cap(headers, _prompt_tokens(engine, "/v1/responses", body))
    body = {"model": model, "system": SYSTEM, "temperature": 0, "tools": [MESSAGES_TOOL],
            "messages": [{"role": "user", "content": ASK}]}
    status, headers, first = _first_event(engine, "/v1/messages", {**body, "max_tokens": 32000})
    assert status == 200 and '"message_start"' in first, first
    _cap(headers, _prompt_tokens(engine, "/v1/messages", body))


def _follows(arguments: dict) -> None:
    """The enforced part holds: the relaxed schema, and the original's
    unions, definition and required names."""
    jsonschema.Draft202012Validator(relax(RICH)).validate(arguments)
    assert list(arguments) == ["action", "target", "flag"]
    assert arguments["action"] in ("read", "write") and 0 <= arguments["target"]["line"] <= 99


def test_a_forced_call_under_a_rich_schema_returns_arguments_that_parse(served):
    engine, model = served
    sdk = _sdk(engine)
    chat = sdk.chat.completions.create(
        model=model, messages=[{"role": "user", "content": ASK}], tools=[CHAT_TOOL],
        tool_choice={"type": "function", "function": {"name": "edit_file"}}, max_tokens=32000,
        seed=1)
    assert chat.choices[0].finish_reason == "tool_calls"
    _follows(json.loads(chat.choices[0].message.tool_calls[0].function.arguments))
    response = sdk.responses.create(
        model=model, input=ASK, tools=[RESPONSES_TOOL], temperature=0,
        tool_choice={"type": "function", "name": "edit_file"})
    call = next(item for item in response.output if item.type == "function_call")
    _follows(json.loads(call.arguments))
    reply = _messages(engine, {"model": model, "max_tokens": 32000, "temperature": 0,
                               "tools": [MESSAGES_TOOL],
                               "tool_choice": {"type": "tool", "name": "edit_file"},
                               "messages": [{"role": "user", "content": ASK}]})
    assert reply.status_code == 200 and reply.json()["stop_reason"] == "tool_use", reply.text
    _follows(next(b for b in reply.json()["content"] if b["type"] == "tool_use")["input"])


def test_a_strict_tool_with_a_rich_schema_is_still_refused_naming_it(stack):
    strict = {"type": "function", "function": {**CHAT_TOOL["function"], "strict": True}}
    with pytest.raises(openai.BadRequestError) as caught:
        _sdk(stack).chat.completions.create(model=MODEL, tools=[strict], max_tokens=4,
                                            messages=[{"role": "user", "content": ASK}])
    error = caught.value.body
    assert (error["code"], error["param"]) == ("response_format_unsupported",
                                               "tools[0].function.parameters")
    assert "oneOf" in error["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        _sdk(stack).responses.create(model=MODEL, input=ASK, max_output_tokens=4,
                                     tools=[{**RESPONSES_TOOL, "strict": True}])
    assert caught.value.body["code"] == "response_format_unsupported"
    assert caught.value.body["param"].startswith("tools[0]")


def test_a_prompt_past_the_window_is_still_context_length_exceeded(served):
    engine, model = served
    too_long = "the river and the mill " * (CONTEXT_WINDOW // 4)
    with pytest.raises(openai.BadRequestError) as caught:
        _sdk(engine).chat.completions.create(
            model=model, messages=[{"role": "user", "content": too_long}], max_tokens=32000)
    assert caught.value.body["code"] == "context_length_exceeded"
    reply = _messages(engine, {"model": model, "max_tokens": 32000,
                               "messages": [{"role": "user", "content": too_long}]})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert "maximum context length" in reply.json()["error"]["message"]


def test_grpc_callers_see_the_cap_in_the_metadata(generation_stub):
    first = next(iter(generation_stub.Generate(chat_request(SYSTEM, max_tokens=32000, seed=1),
                                               timeout=300)))
    cap = first.metadata.max_tokens_cap
    assert (cap.requested, cap.applied) == (32000, CONTEXT_WINDOW - first.metadata.prompt_tokens)
    request = chat_request(SYSTEM, max_tokens=32000)
    request.strict = True  # strict callers keep the refusal
    with pytest.raises(grpc.RpcError) as caught:
        list(generation_stub.Generate(request, timeout=60))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# -- filling the window ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def small(tmp_path_factory):
    own = harness.OwnStack(tmp_path_factory.mktemp("small-window"), MILLM_MODEL=Q8,
                           MILLM_GGUF_CONTEXT=str(SMALL_WINDOW))
    try:
        yield own
    finally:
        own.stop()


def test_chat_generates_until_the_window_is_full_and_ends_with_length(small):
    sdk = _sdk(small)
    ask = [{"role": "user", "content": ASK}]
    reply = sdk.chat.completions.with_raw_response.create(
        model=Q8, messages=ask, max_tokens=32000, seed=1, extra_body={"ignore_eos": True})
    answer = reply.parse()
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage.total_tokens == SMALL_WINDOW
    _cap(reply.headers, answer.usage.prompt_tokens, SMALL_WINDOW)
    with sdk.chat.completions.with_streaming_response.create(
            model=Q8, messages=ask, max_tokens=32000, seed=1, stream=True,
            extra_body={"ignore_eos": True}) as streamed:
        assert streamed.headers[CAPPED].endswith(";requested=32000")
        finishes = [c.choices[0].finish_reason for c in streamed.parse() if c.choices]
    assert finishes[-1] == "length"


def test_messages_and_responses_say_the_window_ended_the_reply(small):
    # Greedy over a prompt that leaves a few dozen tokens: the demo model goes on.
    near = "the river and the mill " * (SMALL_WINDOW // 5 - 8)
    reply = _messages(small, {"model": Q8, "max_tokens": 32000, "temperature": 0,
                              "messages": [{"role": "user", "content": near}]})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["stop_reason"] == "model_context_window_exceeded"
    usage = body["usage"]
    assert (usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["output_tokens"]
            == SMALL_WINDOW)
    assert reply.headers[CAPPED] == f"{usage['output_tokens']};requested=32000"
    response = _sdk(small).responses.with_raw_response.create(
        model=Q8, input=near, max_output_tokens=32000, temperature=0)
    answer = response.parse()
    assert answer.status == "incomplete"
    assert answer.incomplete_details.reason == "max_output_tokens"
    assert answer.usage.total_tokens == SMALL_WINDOW
    _cap(response.headers, answer.usage.input_tokens, SMALL_WINDOW)


def test_the_small_stack_still_answers_grpc(small):
    """The cap reaches a gRPC caller of the GGUF engine too."""
    with grpc.insecure_channel(small.grpc_target) as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        first = next(iter(stub.Generate(chat_request(ASK, model=Q8, max_tokens=32000),
                                        timeout=60)))
    assert first.metadata.max_tokens_cap.requested == 32000
    assert first.metadata.max_tokens_cap.applied == SMALL_WINDOW - first.metadata.prompt_tokens
