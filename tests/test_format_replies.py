"""Reasoning and family syntaxes where peers' users found bugs, and in the
Responses API, served on the model directories of tests/format_models.py.

Peer bugs, each as a test: Hermes streaming breaking on Qwen3's thinking
(vLLM #19056), a streamed call losing its closing brace (vLLM #22885), a
parameterless tool losing its arguments while streaming (vLLM #28806),
json_schema not enforced once reasoning is parsed (vLLM #44012), a Qwen3
template failing on a history holding reasoning_content and tool_calls
(llama.cpp #18463), and previous_response_id dropping function-call items
from the stored context (vLLM #43244)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from tests import format_models

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "when": {"type": "object", "properties": {"day": {"type": "integer", "minimum": 1,
                                                      "maximum": 7}},
             "required": ["day"], "additionalProperties": False}},
    "required": ["city", "when"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "ping", "parameters": {
             "type": "object", "properties": {}, "additionalProperties": False}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
THINK_QWEN3 = {"chat_template_kwargs": {"enable_thinking": True}, "thinking_token_budget": 6}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    own = format_models.serve(tmp_path_factory, "replies")
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture(scope="module")
def sdk(stack):
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0,
                         timeout=120)


def forced(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def answer(sdk, **body) -> tuple[str, list[tuple[str, str]]]:
    choice = sdk.chat.completions.create(**body).choices[0]
    assert choice.finish_reason == "tool_calls"
    return ((choice.message.model_extra or {}).get("reasoning_content") or "",
            [(c.function.name, c.function.arguments) for c in choice.message.tool_calls])


def stream(sdk, **body) -> tuple[str, str, list[tuple[str, str]]]:
    reasoning, content, calls = [], [], {}
    for chunk in sdk.chat.completions.create(stream=True, **body):
        for choice in chunk.choices:
            reasoning.append((choice.delta.model_extra or {}).get("reasoning_content") or "")
            content.append(choice.delta.content or "")
            for call in choice.delta.tool_calls or []:
                name, arguments = calls.get(call.index, ("", ""))
                calls[call.index] = (name + (call.function.name or ""),
                                     arguments + (call.function.arguments or ""))
    return "".join(reasoning), "".join(content), [calls[k] for k in sorted(calls)]


def test_vllm_19056_a_streamed_hermes_call_after_qwen3_thinking(sdk):
    body = dict(model="tiny-qwen3", messages=ASK, tools=TOOLS, tool_choice=forced("get_weather"),
                max_tokens=150, temperature=0, extra_body=THINK_QWEN3)
    reasoning, calls = answer(sdk, **body)
    streamed_reasoning, content, streamed_calls = stream(sdk, **body)
    assert (streamed_reasoning, streamed_calls) == (reasoning, calls) and not content.strip()
    jsonschema.validate(json.loads(calls[0][1]), WEATHER)


@pytest.mark.parametrize("model", ["tiny-mistral", "tiny-v31", "tiny-llama31", "tiny-r1"])
def test_vllm_22885_streamed_nested_arguments_keep_their_closing_braces(sdk, model):
    body = dict(model=model, messages=ASK, tools=TOOLS, tool_choice=forced("get_weather"),
                max_tokens=150, temperature=0, extra_body={"thinking_token_budget": 4}
                if model in ("tiny-r1",) else None)
    _, content, calls = stream(sdk, **body)
    [(name, arguments)] = calls
    assert arguments.endswith("}}") and name == "get_weather"
    jsonschema.validate(json.loads(arguments), WEATHER)
    assert "[TOOL_CALLS]" not in content and "<｜" not in content


@pytest.mark.parametrize("model", ["tiny-mistral", "tiny-v31", "tiny-llama31", "tiny-qwen3",
                                   "tiny-mistral-gguf:F32"])
def test_vllm_28806_a_parameterless_call_streams_its_empty_arguments(sdk, model):
    # (DeepSeek's markers are dozens of byte tokens in the demo vocabulary.)
    body = dict(model=model, messages=ASK, tools=TOOLS, tool_choice=forced("ping"),
                max_tokens=150, temperature=0)
    _, calls = answer(sdk, **body)
    _, _, streamed = stream(sdk, **body)
    assert streamed == calls and calls == [("ping", "{}")]


@pytest.mark.parametrize("model,extra", [("tiny-r1", {"thinking_token_budget": 5}),
                                         ("tiny-qwen3", THINK_QWEN3),
                                         ("tiny-r1-gguf:F32", {"thinking_token_budget": 5})])
def test_vllm_44012_json_schema_is_enforced_with_reasoning_on(sdk, model, extra):
    reply = sdk.chat.completions.create(
        model=model, messages=ASK, max_tokens=80, temperature=0, extra_body=extra,
        response_format={"type": "json_schema", "json_schema": {"name": "ok", "schema": SCHEMA,
                                                                 "strict": True}})
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)


def test_llama_cpp_18463_qwen3_history_with_reasoning_and_calls(sdk):
    history = [*ASK, {"role": "assistant", "content": None, "reasoning_content": "Use the tool.",
                      "tool_calls": [{"id": "call_7", "type": "function", "function": {
                          "name": "get_weather",
                          "arguments": '{"city": "Paris", "when": {"day": 1}}'}}]},
               {"role": "tool", "tool_call_id": "call_7", "content": "Sunny, 21C"}]
    reply = sdk.chat.completions.create(model="tiny-qwen3", messages=history, tools=TOOLS,
                                        max_tokens=10, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert "<think>" not in (reply.choices[0].message.content or "")


def test_responses_reasoning_items_stream_and_chain(sdk):
    body = dict(model="tiny-r1", input="Say hello.", max_output_tokens=40, temperature=0,
                reasoning={"effort": "low"}, extra_body={"thinking_token_budget": 6})
    first = sdk.responses.create(**body)
    kinds = [item.type for item in first.output]
    assert kinds[:2] == ["reasoning", "message"], kinds
    thought = first.output[0].content[0].text
    assert thought and "<think>" not in thought and "</think>" not in first.output_text
    assert first.reasoning.effort == "low"
    assert first.usage.output_tokens_details.reasoning_tokens >= 6
    events = list(sdk.responses.create(stream=True, **body))
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == thought
    done = [e for e in events if e.type == "response.reasoning_text.done"]
    assert [e.text for e in done] == [thought]
    # The stored reasoning is replayed into the next turn.
    second = sdk.responses.create(model="tiny-r1", input="Again.", max_output_tokens=20,
                                  previous_response_id=first.id,
                                  extra_body={"thinking_token_budget": 2})
    assert second.status in ("completed", "incomplete") and second.previous_response_id == first.id


def test_responses_reasoning_input_items_are_read(sdk):
    reply = sdk.responses.create(model="tiny-qwen3", max_output_tokens=10, input=[
        {"role": "user", "content": "Hi"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text",
                                                          "text": "Greet back."}]},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"}])
    assert reply.status in ("completed", "incomplete")


def test_vllm_43244_previous_response_id_keeps_the_function_call(sdk):
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    first = sdk.responses.create(model="tiny-mistral", input="Weather in Paris?", tools=tools,
                                 tool_choice={"type": "function", "name": "get_weather"},
                                 max_output_tokens=100, temperature=0)
    [call] = [item for item in first.output if item.type == "function_call"]
    # The output answers a call that only the stored context holds.
    second = sdk.responses.create(model="tiny-mistral", previous_response_id=first.id,
                                  input=[{"type": "function_call_output", "call_id": call.call_id,
                                          "output": "Sunny"}], max_output_tokens=5)
    assert second.status in ("completed", "incomplete")


@pytest.mark.parametrize("model", ["tiny-r1", "tiny-r1-gguf:F32"])
def test_rows_of_one_batch_keep_their_own_modes_and_budgets(sdk, model):
    """Four requests at once, each with its own budget and constraint: each
    answer is the one it gets alone (greedy), so no row's mode leaked."""
    schema = {"type": "json_schema", "json_schema": {"name": "ok", "schema": SCHEMA,
                                                     "strict": True}}
    bodies = [dict(response_format=schema, extra_body={"thinking_token_budget": 2}),
              dict(extra_body={"thinking_token_budget": 9}),
              dict(tools=TOOLS, tool_choice=forced("ping"),
                   extra_body={"thinking_token_budget": 4}),
              dict(extra_body={"thinking_token_budget": 0})]

    def run(body):
        choice = sdk.chat.completions.create(model=model, messages=ASK, max_tokens=150,
                                             temperature=0, **body).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        return ((choice.message.model_extra or {}).get("reasoning_content") or "",
                choice.message.content, calls, choice.finish_reason)

    alone = [run(body) for body in bodies]
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(run, bodies))
    assert together == alone
    (r0, c0, _, f0), (r1, _, _, _), (r2, _, calls, f2), (r3, _, _, _) = alone
    assert f0 == "stop" and r0 and json.loads(c0)["ok"] in (True, False)
    assert len(r1) > len(r0) and r3 == ""
    assert f2 == "tool_calls" and calls == [("ping", "{}")] and r2


@pytest.mark.parametrize("model", ["tiny-r1", "tiny-r1-gguf:F32"])
@pytest.mark.parametrize("constraint,pattern", [({"regex": "[ab]{3}"}, "[ab]{3}"),
                                               ({"choice": ["yes", "no"]}, "yes|no")])
def test_a_pattern_or_choice_starts_after_thinking(sdk, model, constraint, pattern):
    """structured_outputs (vLLM's) after a reasoning block, as json_schema is."""
    import re

    reply = sdk.chat.completions.create(
        model=model, messages=ASK, max_tokens=80, temperature=0,
        extra_body={"thinking_token_budget": 5, "structured_outputs": constraint})
    choice = reply.choices[0]
    assert (choice.message.model_extra or {}).get("reasoning_content")
    assert choice.finish_reason == "stop" and re.fullmatch(pattern, choice.message.content)
