"""Tool calling through the REST bridge with the OpenAI SDK, on both engines:
OpenAI's exact shapes, streamed and not, and a conversation that carries a
call and its answer."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests import harness
from tests.conftest import MODEL

Q8 = "millm-tiny-gguf:Q8_0"
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "days": {"type": "integer", "exclusiveMinimum": 0, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
             "required": ["zone"], "additionalProperties": False}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
FORCED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    own = harness.OwnStack(tmp_path_factory.mktemp("tools"))
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture(scope="module")
def sdk(stack):
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0,
                         timeout=60)


@pytest.mark.parametrize("model", [MODEL, Q8])
def test_a_named_choice_returns_one_valid_call(sdk, model):
    reply = sdk.chat.completions.create(model=model, messages=ASK, tools=TOOLS,
                                        tool_choice=FORCED, seed=5, max_tokens=120)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


@pytest.mark.parametrize("model", [MODEL, Q8])
def test_parallel_tool_calls_false_allows_exactly_one_call(sdk, model):
    """The grammar's guarantee, whatever the model prefers: with the
    end-of-sequence token pushed down (logit_bias), a choice that may write
    more calls cannot end after the first, and one that may not must."""
    ask = [{"role": "user", "content": "Weather in Paris, Rome and Oslo?"}]
    for seed in (1, 2):
        counts = {}
        for parallel in (False, True):
            choice = sdk.chat.completions.create(
                model=model, messages=ask, tools=TOOLS, tool_choice="required",
                parallel_tool_calls=parallel, logit_bias={"2": -100}, max_tokens=120, seed=seed,
                temperature=1).choices[0]
            counts[parallel] = (len(choice.message.tool_calls or ()), choice.finish_reason)
        assert counts[False] == (1, "tool_calls"), counts
        calls, finish = counts[True]
        assert calls > 1 or finish == "length", counts


@pytest.mark.parametrize("model", [MODEL, Q8])
def test_the_streamed_call_accumulates_to_the_same_call(sdk, model):
    body = dict(model=model, messages=ASK, tools=TOOLS, tool_choice="required", seed=9,
                max_tokens=120, temperature=1.0, parallel_tool_calls=False)
    whole = sdk.chat.completions.create(**body).choices[0]
    calls: dict[int, dict] = {}
    finishes = []
    firsts = []
    for chunk in sdk.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
            for f in choice.delta.tool_calls or ():
                if f.id:
                    firsts.append(f)
                    calls[f.index] = {"name": f.function.name, "arguments": ""}
                    assert f.type == "function" and f.function.arguments == ""
                else:
                    assert f.function.name is None and f.id is None
                calls[f.index]["arguments"] += f.function.arguments or ""
    assert finishes == ["tool_calls"] and len(firsts) == 1
    [call] = whole.message.tool_calls
    assert calls == {0: {"name": call.function.name, "arguments": call.function.arguments}}


def test_the_sdk_stream_helper_and_pydantic_function_tool(sdk):
    class Lookup(BaseModel):
        city: str = Field(max_length=10)
        days: int = Field(gt=0, le=7)

    tool = openai.pydantic_function_tool(Lookup)
    with sdk.chat.completions.stream(
            model=MODEL, messages=ASK, tools=[tool], max_tokens=120, seed=2,
            tool_choice={"type": "function", "function": {"name": "Lookup"}}) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert call.function.name == "Lookup"
    parsed = call.function.parsed_arguments
    assert isinstance(parsed, Lookup) and 0 < parsed.days <= 7


def test_a_conversation_with_a_call_and_its_answer_ignores_nothing(stack, sdk):
    first = sdk.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                        tool_choice=FORCED, seed=1, max_tokens=120)
    call = first.choices[0].message.tool_calls[0]
    messages = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"}]
    raw = sdk.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=20, seed=1)
    assert raw.http_response.status_code == 200
    assert "X-miLLM-Ignored-Fields" not in raw.headers
    assert raw.parse().choices[0].finish_reason in ("stop", "length", "tool_calls")
    # The bridge carries the answer to the prompt: a longer one makes a longer prompt.
    messages[-1]["content"] = "Sunny, 21 C, with a light wind from the west all afternoon"
    longer = sdk.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                         max_tokens=2, seed=1)
    assert longer.usage.prompt_tokens > raw.parse().usage.prompt_tokens


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[1].function.name"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
])
def test_bad_tool_requests_are_400_naming_the_field(sdk, body, param):
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(**{"model": MODEL, "messages": ASK, "max_tokens": 4,
                                       **body})
    assert caught.value.body["param"] == param


def test_tools_on_completions_are_not_honoured(sdk):
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.completions.create(model=MODEL, prompt="Hi", max_tokens=4,
                               extra_body={"tools": TOOLS})
    assert (caught.value.code, caught.value.body["param"]) == ("field_not_honoured", "tools")
