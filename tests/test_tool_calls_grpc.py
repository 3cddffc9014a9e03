"""Tool calling over gRPC: the engine constrains forced and required calls,
parses them out of the text into ToolCallDelta fragments, validates their
arguments, and refuses bad tools naming the field."""

from __future__ import annotations

import json

import grpc
import jsonschema
import pytest

from millm.v1 import generation_pb2, generation_service_pb2
from tests.conftest import MODEL
from tests.grpc_helpers import error_info

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "when": {"type": "string", "format": "date"},
    "days": {"type": "integer", "exclusiveMinimum": 0, "maximum": 7}},
    "required": ["city", "when", "days"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
        "required": ["zone"], "additionalProperties": False}


def tool(name: str, schema: dict) -> generation_pb2.FunctionTool:
    return generation_pb2.FunctionTool(name=name, description=f"{name} tool",
                                       parameters_json=json.dumps(schema))


def request(*messages, choice=None, parallel=None, max_tokens=120, seed=3, tools=None,
            **sampling) -> generation_service_pb2.GenerateRequest:
    msgs = messages or (generation_pb2.ChatMessage(role=generation_pb2.ROLE_USER,
                                                   content="What is the weather in Paris?"),)
    req = generation_service_pb2.GenerateRequest(
        model=MODEL, chat=generation_pb2.ChatInput(messages=msgs),
        sampling=generation_pb2.SamplingParams(max_tokens=max_tokens, seed=seed,
                                               temperature=1.0, **sampling),
        tools=tools if tools is not None else [tool("get_weather", WEATHER),
                                               tool("get_time", TIME)])
    if choice is not None:
        req.tool_choice.CopyFrom(choice)
    if parallel is not None:
        req.parallel_tool_calls = parallel
    return req


def named(name: str) -> generation_pb2.ToolChoice:
    return generation_pb2.ToolChoice(mode=generation_pb2.TOOL_CHOICE_MODE_FUNCTION,
                                     function_name=name)


def collect(stub, req):
    """(content, {index: [id, name, arguments]}, finish reason, fragments)."""
    content, calls, finish, fragments = "", {}, None, []
    for response in stub.Generate(req, timeout=60):
        for d in response.choices:
            content += d.text
            for f in d.tool_calls:
                fragments.append(f)
                if f.id:
                    assert f.index not in calls and f.name and f.arguments == ""
                    calls[f.index] = [f.id, f.name, ""]
                else:
                    assert not f.name
                    calls[f.index][2] += f.arguments
            if d.finish_reason:
                finish = d.finish_reason
    return content, calls, finish, fragments


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_named_choice_is_one_valid_call(generation_stub, seed):
    content, calls, finish, _ = collect(generation_stub, request(choice=named("get_weather"),
                                                                 seed=seed))
    assert content == "" and finish == generation_pb2.FINISH_REASON_TOOL_CALLS
    assert list(calls) == [0]
    call_id, name, arguments = calls[0]
    assert name == "get_weather" and call_id.startswith("call_")
    jsonschema.validate(json.loads(arguments), WEATHER,
                        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def test_required_calls_a_tool_and_parallel_false_calls_one(generation_stub):
    choice = generation_pb2.ToolChoice(mode=generation_pb2.TOOL_CHOICE_MODE_REQUIRED)
    for seed in range(4):
        _, calls, finish, _ = collect(generation_stub, request(choice=choice, parallel=False,
                                                               seed=seed))
        assert finish == generation_pb2.FINISH_REASON_TOOL_CALLS and len(calls) == 1
        assert calls[0][1] in ("get_weather", "get_time")
    ids = {collect(generation_stub, request(choice=choice, seed=s))[1][0][0] for s in range(3)}
    assert len(ids) == 3  # every call has its own id


def test_the_arguments_stream_in_pieces(generation_stub):
    _, calls, _, fragments = collect(generation_stub, request(choice=named("get_weather")))
    assert len([f for f in fragments if not f.id]) >= 2
    assert json.loads(calls[0][2])["city"] is not None


def test_a_conversation_with_a_call_and_its_answer_is_served(generation_stub):
    """The call and its answer reach the prompt: nothing reported, and the
    prompt grows with the answer's text and with the call's arguments."""
    def prompt_tokens(answer_text: str, arguments: str) -> int:
        user = generation_pb2.ChatMessage(role=generation_pb2.ROLE_USER, content="Weather?")
        assistant = generation_pb2.ChatMessage(
            role=generation_pb2.ROLE_ASSISTANT, tool_calls=[generation_pb2.ToolCall(
                id="call_1", name="get_time", arguments_json=arguments)])
        answer = generation_pb2.ChatMessage(role=generation_pb2.ROLE_TOOL,
                                            tool_call_id="call_1", content=answer_text)
        first = next(iter(generation_stub.Generate(
            request(user, assistant, answer, max_tokens=2), timeout=60)))
        assert list(first.metadata.ignored_fields) == []
        return first.metadata.prompt_tokens

    base = prompt_tokens("12:00", '{"zone": "UTC"}')
    assert prompt_tokens("12:00 and a long answer from the tool", '{"zone": "UTC"}') > base
    assert prompt_tokens("12:00", '{"zone": "UTC", "note": "a longer call"}') > base


@pytest.mark.parametrize(("change", "param"), [
    (lambda r: r.tools.append(tool("get_weather", TIME)), "tools[2].function.name"),
    (lambda r: r.tools.append(tool("bad name", TIME)), "tools[2].function.name"),
    (lambda r: r.tools.append(generation_pb2.FunctionTool(  # strict: held to the subset
        name="odd", strict=True, parameters_json=json.dumps({"type": "object", "properties": {
            "x": {"not": {}}}}))), "tools[2].function.parameters"),
    (lambda r: r.tool_choice.CopyFrom(named("nowhere")), "tool_choice.function.name"),
    (lambda r: r.sampling.stop.append("}"), "stop"),
    (lambda r: r.response_format.json_object.SetInParent(), "response_format"),
])
def test_bad_tools_are_refused_naming_the_field(generation_stub, change, param):
    req = request()
    change(req)
    with pytest.raises(grpc.RpcError) as caught:
        list(generation_stub.Generate(req, timeout=60))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).metadata["param"] == param


def test_a_tool_message_must_answer_an_earlier_call(generation_stub):
    user = generation_pb2.ChatMessage(role=generation_pb2.ROLE_USER, content="Hi")
    stray = generation_pb2.ChatMessage(role=generation_pb2.ROLE_TOOL, tool_call_id="call_x",
                                       content="1")
    with pytest.raises(grpc.RpcError) as caught:
        list(generation_stub.Generate(request(user, stray), timeout=60))
    assert error_info(caught.value).metadata["param"] == "messages[1].tool_call_id"


def test_unused_tool_fields_are_reported_not_refused(generation_stub):
    none = generation_pb2.ToolChoice(mode=generation_pb2.TOOL_CHOICE_MODE_NONE)
    first = next(iter(generation_stub.Generate(request(choice=none, max_tokens=4), timeout=60)))
    assert list(first.metadata.ignored_fields) == ["tools"]
    req = request(choice=named("x"), tools=[], max_tokens=4)
    first = next(iter(generation_stub.Generate(req, timeout=60)))
    assert list(first.metadata.ignored_fields) == ["tool_choice"]


def test_more_than_128_tools_are_refused(generation_stub):
    many = [tool(f"t{i}", TIME) for i in range(129)]
    with pytest.raises(grpc.RpcError) as caught:
        list(generation_stub.Generate(request(tools=many), timeout=60))
    assert error_info(caught.value).metadata["param"] == "tools"
