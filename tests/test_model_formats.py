"""Real families' own syntaxes, served: model directories made from the demo
model's weights and tokenizer with DeepSeek R1, DeepSeek V3.1, Mistral,
Llama 3.1 and Qwen3 chat templates (tests/format_models.py), on the
transformers engine and, for three of them, as GGUF exports. Each is
detected from its template alone and reported by /api/capabilities and
GetCapabilities; forced calls come back as OpenAI tool_calls in any syntax;
reasoning comes back apart from the answer, closed by the budget where the
tiny model would not close it, with json_schema enforced after it."""

from __future__ import annotations

import json

import grpc
import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from millm.v1 import (
    generation_pb2,
    generation_service_pb2,
    generation_service_pb2_grpc,
    model_service_pb2,
    model_service_pb2_grpc,
    server_service_pb2,
    server_service_pb2_grpc,
)
from tests import format_models, harness, http_helpers

SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0,
                                                      "maximum": 99},
                                           "label": {"type": "string", "maxLength": 8}},
          "required": ["answer", "label"], "additionalProperties": False}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA,
                                                      "strict": True}}
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "ping", "parameters": {"type": "object"}}}]
FORCED = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "What is the weather in Paris? Answer in JSON."}]
MARKUP = ("<think>", "</think>", "[TOOL_CALLS]", "[ARGS]", '"parameters"', "<｜tool",
          "<tool_call>", "<|channel|>", "<|start|>", "<|message|>", "<parameter=", "<function=",
          "<|tool_call>", "<|channel>", "<channel|>")
FORMATS = {"tiny-r1": ("deepseek_r1", "think"), "tiny-v31": ("deepseek_v3_1", "think"),
           "tiny-mistral": ("mistral", "none"), "tiny-llama31": ("llama3_json", "none"),
           "tiny-qwen3": ("hermes", "think"), "tiny-harmony": ("harmony", "harmony"),
           "tiny-qwen3-coder": ("qwen3_coder", "none"), "tiny-gemma4": ("gemma4", "gemma4")}
GGUF = {"tiny-r1": "tiny-r1-gguf:F32", "tiny-mistral": "tiny-mistral-gguf:F32",
        "tiny-llama31": "tiny-llama31-gguf:F32"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    own = format_models.serve(tmp_path_factory, "formats")
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture(scope="module")
def sdk(stack):
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0,
                         timeout=120)


@pytest.fixture(scope="module")
def channel(stack):
    with grpc.insecure_channel(stack.grpc_target) as ch:
        yield ch


def load(channel, model_id: str) -> None:
    model_service_pb2_grpc.ModelServiceStub(channel).LoadModel(
        model_service_pb2.LoadModelRequest(id=model_id), timeout=120)


def capabilities(stack) -> dict:
    reply = http_helpers.call(stack.http_port, "GET", "/api/capabilities")
    assert reply.status_code == 200
    return reply.json()


def streamed(sdk, **body) -> tuple[str, str, dict, str | None]:
    """(reasoning, content, calls by index, finish) of a streamed answer."""
    reasoning, content, calls, finish = [], [], {}, None
    for chunk in sdk.chat.completions.create(stream=True, **body):
        for choice in chunk.choices:
            delta = choice.delta
            extra = delta.model_extra or {}
            reasoning.append(extra.get("reasoning_content") or "")
            content.append(delta.content or "")
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return "".join(reasoning), "".join(content), calls, finish


@pytest.mark.parametrize("model", ["tiny-r1", GGUF["tiny-r1"]])
def test_the_bar_budget_closed_reasoning_then_schema_valid_json(sdk, model):
    # Seeded: on GGUF a seeded request runs alone in a lane, so the streamed
    # answer is byte for byte the first one (a reused prefix may move a tie).
    body = dict(model=model, messages=ASK, response_format=JSON_SCHEMA, max_tokens=120,
                temperature=0, seed=1, extra_body={"thinking_token_budget": 8})
    reply = sdk.chat.completions.create(**body)
    message = reply.choices[0].message
    reasoning = (message.model_extra or {}).get("reasoning_content")
    assert reasoning and "<think>" not in reasoning and "</think>" not in reasoning
    assert reply.choices[0].finish_reason == "stop"
    assert not any(mark in message.content for mark in ("<think>", "</think>"))
    jsonschema.validate(json.loads(message.content), SCHEMA)
    details = reply.usage.completion_tokens_details
    # At most the budget and the close's tokens (at most one a character of
    # "</think>"); fewer where this build's model closes the block itself.
    assert 1 <= details.reasoning_tokens <= 8 + len("</think>")
    assert details.reasoning_tokens < reply.usage.completion_tokens
    # Streamed, the deltas carry the same split.
    thought, content, _, finish = streamed(sdk, **body)
    assert (thought, content, finish) == (reasoning, message.content, "stop")


def test_harmony_answers_in_its_final_channel_after_analysis(sdk):
    body = dict(model="tiny-harmony", messages=ASK, response_format=JSON_SCHEMA, max_tokens=120,
                temperature=0, reasoning_effort="high", extra_body={"thinking_token_budget": 6})
    reply = sdk.chat.completions.create(**body)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "stop"
    assert not any(mark in message.content for mark in MARKUP)
    jsonschema.validate(json.loads(message.content), SCHEMA)
    thought, content, _, _ = streamed(sdk, **body)
    assert (thought, content) == ((message.model_extra or {}).get("reasoning_content") or "",
                                  message.content)


@pytest.mark.parametrize("model", ["tiny-r1", "tiny-qwen3"])
def test_reasoning_without_a_constraint_is_closed_by_the_budget(sdk, model):
    extra = {"thinking_token_budget": 4}
    if model == "tiny-qwen3":  # the model would open the block itself: ask it to
        extra["chat_template_kwargs"] = {"enable_thinking": True}
    reply = sdk.chat.completions.create(model=model, messages=ASK, max_tokens=40,
                                        temperature=0, extra_body=extra)
    message = reply.choices[0].message
    content = message.content or ""
    assert "<think>" not in content and "</think>" not in content
    if model == "tiny-r1":
        assert (message.model_extra or {}).get("reasoning_content")
        assert reply.usage.completion_tokens_details.reasoning_tokens >= 4


def test_a_switched_off_block_leaves_no_reasoning(sdk):
    reply = sdk.chat.completions.create(
        model="tiny-qwen3", messages=ASK, max_tokens=80, temperature=0,
        response_format=JSON_SCHEMA,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "stop"
    assert not (message.model_extra or {}).get("reasoning_content")
    jsonschema.validate(json.loads(message.content), SCHEMA)
    assert reply.usage.completion_tokens_details.reasoning_tokens == 0


@pytest.mark.parametrize("model", list(FORMATS))
def test_each_family_is_detected_and_reported(stack, channel, model):
    load(channel, model)
    tool_format, reasoning_format = FORMATS[model]
    body = capabilities(stack)
    assert (body["model"], body["tool_call_format"], body["reasoning_format"]) == (
        model, tool_format, reasoning_format)
    reply = server_service_pb2_grpc.ServerServiceStub(channel).GetCapabilities(
        server_service_pb2.GetCapabilitiesRequest(), timeout=10)
    assert (reply.tool_call_format, reply.reasoning_format) == (tool_format, reasoning_format)


def test_a_setting_overrides_detection_and_an_unknown_one_is_a_load_failure(stack, channel):
    load(channel, "tiny-overridden")
    body = capabilities(stack)
    assert (body["tool_call_format"], body["reasoning_format"]) == ("mistral", "none")
    with pytest.raises(grpc.RpcError) as caught:
        load(channel, "tiny-misnamed")
    assert "tool_call_format" in caught.value.details()
    assert "klingon" in caught.value.details()


# Room for one forced call whatever the tokenizer: R1's call is about 170
# bytes of markup and arguments, each at least one token, after the thinking.
CALL_ROOM = 400
CALL_MODELS = ["tiny-r1", "tiny-v31", "tiny-mistral", "tiny-llama31", "tiny-qwen3", "tiny-harmony",
               "tiny-qwen3-coder", "tiny-gemma4",
               GGUF["tiny-mistral"], GGUF["tiny-llama31"], GGUF["tiny-r1"]]


@pytest.mark.parametrize("model", CALL_MODELS)
def test_a_forced_call_comes_back_as_openai_tool_calls(sdk, model):
    tools, schema = TOOLS, WEATHER
    if model == "tiny-gemma4":
        # xgrammar's Gemma notation does not bound a string's length (it says
        # so as it compiles), so the tiny model would ramble in one: an enum.
        schema = {**WEATHER, "properties": {**WEATHER["properties"],
                                            "city": {"enum": ["Paris", "Oslo"]}}}
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": schema}}]
    # CALL_ROOM: a family's markers need not be tokens of the demo tokenizer,
    # so the grammar may spell them a byte at a time.
    body = dict(model=model, messages=ASK, tools=tools, tool_choice=FORCED, max_tokens=CALL_ROOM,
                temperature=0)
    if model.startswith(("tiny-r1", "tiny-harmony", "tiny-gemma4")):
        # A reasoning block the tiny model would never close once open.
        body["extra_body"] = {"thinking_token_budget": 8}
    reply = sdk.chat.completions.create(**body)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert not any(mark in (choice.message.content or "") for mark in MARKUP)
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, schema)
    # Streamed fragments add up to the same call.
    _, content, calls, finish = streamed(sdk, **body)
    assert finish == "tool_calls" and not any(mark in content for mark in MARKUP)
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("get_weather", arguments)]


@pytest.mark.parametrize("model", ["tiny-mistral", "tiny-v31", "tiny-llama31"])
def test_required_calls_in_a_grouped_or_bare_syntax(sdk, model):
    reply = sdk.chat.completions.create(model=model, messages=ASK, tools=TOOLS,
                                        tool_choice="required", max_tokens=200, seed=3)
    choice = reply.choices[0]
    assert choice.finish_reason in ("tool_calls", "length")
    if choice.finish_reason == "tool_calls":
        assert choice.message.tool_calls
        for call in choice.message.tool_calls:
            assert call.function.name in ("get_weather", "ping")
            assert isinstance(json.loads(call.function.arguments), dict)


def test_a_forced_call_after_thinking(sdk):
    reply = sdk.chat.completions.create(model="tiny-r1", messages=ASK, tools=TOOLS,
                                        tool_choice=FORCED, max_tokens=CALL_ROOM, temperature=0,
                                        extra_body={"thinking_token_budget": 6})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert (choice.message.model_extra or {}).get("reasoning_content")
    jsonschema.validate(json.loads(choice.message.tool_calls[0].function.arguments), WEATHER)


def test_history_with_reasoning_and_calls_renders_through_the_family_template(sdk):
    history = [*ASK, {"role": "assistant", "content": "", "reasoning_content": "Weather: a tool.",
                      "tool_calls": [{"id": "call_1", "type": "function", "function": {
                          "name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
               {"role": "user", "content": "And tomorrow?"}]
    for model in ("tiny-r1", "tiny-qwen3", "tiny-mistral", "tiny-llama31", "tiny-harmony",
                  "tiny-v31", "tiny-qwen3-coder"):
        reply = sdk.chat.completions.create(model=model, messages=history, tools=TOOLS,
                                            tool_choice=FORCED, max_tokens=CALL_ROOM,
                                            temperature=0, extra_body={"thinking_token_budget": 4})
        assert reply.choices[0].finish_reason == "tool_calls", model


def test_bad_reasoning_fields_are_refused_naming_them(stack):
    port = stack.http_port
    for extra, param in (({"reasoning_effort": "extreme"}, "reasoning_effort"),
                         ({"thinking_token_budget": -1}, "thinking_token_budget"),
                         ({"thinking_token_budget": 50, "max_tokens": 10},
                          "thinking_token_budget"),
                         ({"chat_template_kwargs": {"messages": []}},
                          "chat_template_kwargs.messages")):
        reply = http_helpers.call(port, "POST", "/v1/chat/completions",
                                  {"model": "tiny-r1", "messages": ASK, **extra})
        assert reply.status_code == 400, extra
        error = reply.json()["error"]
        assert error["param"] == param and error["code"] == "invalid_parameter"


def test_template_variables_a_template_cannot_use_are_a_400(stack):
    for kwargs, param in (({"namespace": 1}, "chat_template_kwargs.namespace"),
                          ({"reasoning_effort": 5}, "chat_template_kwargs")):
        # (harmony's template adds reasoning_effort to a string)
        reply = http_helpers.call(stack.http_port, "POST", "/v1/chat/completions",
                                  {"model": "tiny-harmony", "messages": ASK, "max_tokens": 2,
                                   "chat_template_kwargs": kwargs})
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == param


def test_a_model_without_reasoning_reports_the_fields_as_ignored(stack):
    reply = http_helpers.call(stack.http_port, "POST", "/v1/chat/completions",
                              {"model": "tiny-llama31", "messages": ASK, "max_tokens": 4,
                               "thinking_token_budget": 2, "reasoning_effort": "low"})
    assert reply.status_code == 200
    ignored = reply.headers.get("x-millm-ignored-fields", "")
    assert "thinking_token_budget" in ignored and "reasoning_effort" in ignored
    message = reply.json()["choices"][0]["message"]
    assert "reasoning_content" not in message


def test_grpc_carries_reasoning_as_its_own_field(channel):
    stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
    request = generation_service_pb2.GenerateRequest(
        model="tiny-r1", chat=generation_pb2.ChatInput(messages=[generation_pb2.ChatMessage(
            role=generation_pb2.ROLE_USER, content="Hello")]),
        sampling=generation_pb2.SamplingParams(max_tokens=30, temperature=0),
        thinking_token_budget=5)
    reasoning, text, usage = [], [], None
    for message in stub.Generate(request, timeout=120):
        for delta in message.choices:
            reasoning.append(delta.reasoning)
            text.append(delta.text)
        if message.HasField("usage"):
            usage = message.usage
    assert "".join(reasoning) and "<think>" not in "".join(text)
    assert "</think>" not in "".join(text) and usage.reasoning_tokens >= 5


@pytest.mark.parametrize("model", ["tiny-mistral-marked", "tiny-mistral-marked-gguf:F32",
                                   "tiny-harmony-marked", "tiny-harmony-marked-gguf:F32"])
def test_special_markup_tokens_are_generated_and_parsed(channel, model):
    """A tokenizer with the family's markers as special tokens: the model may
    write [TOOL_CALLS] as the one token (every other special token stays
    banned), and it is read as markup, never shown."""
    [tool] = format_models.MARKED_TOOLS
    request = generation_service_pb2.GenerateRequest(
        model=model, chat=generation_pb2.ChatInput(messages=[generation_pb2.ChatMessage(
            role=generation_pb2.ROLE_USER, content=format_models.MARKED_ASK[0]["content"])]),
        sampling=generation_pb2.SamplingParams(max_tokens=160, temperature=0),
        tools=[generation_pb2.FunctionTool(
            name="ping", parameters_json=json.dumps(tool["function"]["parameters"]))],
        tool_choice=generation_pb2.ToolChoice(mode=generation_pb2.TOOL_CHOICE_MODE_FUNCTION,
                                              function_name="ping"), thinking_token_budget=4)
    if "mistral" in model:
        request.ClearField("thinking_token_budget")  # (no reasoning: reported, not used)
    stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
    ids, text, thought, calls, finish = [], [], [], [], None
    for message in stub.Generate(request, timeout=120):
        for delta in message.choices:
            ids += list(delta.token_ids)
            text.append(delta.text)
            thought.append(delta.reasoning)
            calls += [(c.name, c.arguments) for c in delta.tool_calls]
            finish = delta.finish_reason or finish
    # [TOOL_CALLS] or <|channel|>: the first token added after the demo vocabulary.
    assert ids[0] == len(AutoTokenizer.from_pretrained(harness.models_dir() / "millm-tiny"))
    assert not any(marker in "".join(thought) for marker in format_models.HARMONY_MARKERS)
    assert finish == generation_pb2.FINISH_REASON_TOOL_CALLS and not "".join(text)
    assert [name for name, _ in calls if name] == ["ping"]
    assert "".join(arguments for _, arguments in calls) == "{}"
