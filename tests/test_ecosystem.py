"""The ecosystem suite: client libraries' default tool-calling and
structured-output paths against a real engine and bridge, on both engines.

Why: miLLM claims OpenAI compatibility, and what users run is not our raw
requests but LangChain, instructor, pydantic-ai, the OpenAI Agents SDK and
LlamaIndex, each of which builds its own bodies (tool_choice shapes,
parallel_tool_calls, strict tools, max_completion_tokens, tool messages).
Each library is pinned (tests/ecosystem/requirements*.txt) and installed by
`make eco-venvs` into a venv of its own: instructor and LlamaIndex need
openai<3, the rest run on openai 3.x, and none of them belongs in the
engine's venv. A script under tests/ecosystem/ runs one library path against
the bridge and prints one JSON line; the assertions here are on its values:
the tool's name, the arguments' types, the output's class and field types.
The OpenAI SDK itself (in the main venv) is called in process; the OpenAI
Node SDK runs tests/ecosystem/node/responses.mjs (its package pinned by
tests/ecosystem/node/package-lock.json, installed by `make eco-venvs`). The
Agents SDK's default model and pydantic-ai's "openai:<model>" shorthand
both speak the Responses API (POST /v1/responses). Anthropic's Python SDK
and LangChain's ChatAnthropic (tests/ecosystem/anthropic_paths.py) speak the
Messages API (POST /v1/messages).

The demo model is tiny and random-ish, so only what the schema guarantees is
asserted (city is a string of at most 24 characters, when a datetime, ...),
never what a sensible model would answer. A stack of this module's own
serves millm-tiny first, then millm-tiny-gguf:Q8_0 (the model fixture is
module-scoped, so pytest runs every test on one model before switching),
which leaves the session stack on millm-tiny.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime
from uuid import UUID

import openai
import pytest

from tests import harness
from tests.conftest import MODEL
from tests.ecosystem.shared import MAX_TOKENS, PROMPT, SEED, TOOL_PROMPT, Weather
from tests.json_prefix import is_json_prefix

Q8 = "millm-tiny-gguf:Q8_0"
HERE = harness.ROOT / "tests" / "ecosystem"
ECO = harness.ROOT / ".venv-eco" / "bin" / "python"
LEGACY = harness.ROOT / ".venv-eco-legacy" / "bin" / "python"
NODE_SDK = HERE / "node"
VENV_OF = {"langchain": ECO, "pydantic_ai": ECO, "agents": ECO, "anthropic": ECO,
           "reasoning": ECO,
           "instructor": LEGACY, "llamaindex": LEGACY}
WEATHER_TYPES = {"city": "str", "when": "datetime", "id": "UUID", "celsius": "int"}

GET_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Look up the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def eco_stack(tmp_path_factory):
    stack = harness.OwnStack(tmp_path_factory.mktemp("ecosystem"), MILLM_MODEL=MODEL)
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module", params=[MODEL, Q8])
def model(request):
    return request.param


@pytest.fixture(scope="module")
def eco_client(eco_stack):
    return openai.OpenAI(base_url=f"{eco_stack.base_url}/v1", api_key="unused", max_retries=0,
                         timeout=120)


def run_path(stack, model: str, library: str, path: str) -> dict:
    """Run tests/ecosystem/<library>_paths.py in its venv; its JSON line."""
    python = VENV_OF[library]
    assert python.exists(), f"{python} is missing: `make eco-venvs` builds it"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/"),
           "OPENAI_API_KEY": "unused", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1",
           "LANGSMITH_TRACING": "false", "OPENAI_AGENTS_DISABLE_TRACING": "1"}
    done = subprocess.run([str(python), str(HERE / f"{library}_paths.py"),
                           f"{stack.base_url}/v1", model, path],
                          capture_output=True, text=True, env=env, timeout=110)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or ["(no stderr)"]
        pytest.fail(f"{library} {path} on {model}: {last[0]}\n{done.stderr[-3000:]}",
                    pytrace=False)
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_weather(output: dict) -> None:
    """A Weather as a script reports it: the class, each field's type, and
    values within the schema."""
    assert output["class"] == "Weather", output
    assert output["types"] == WEATHER_TYPES, output
    fields = output["fields"]
    assert isinstance(fields["city"], str) and len(fields["city"]) <= 24
    assert isinstance(datetime.fromisoformat(fields["when"]), datetime)
    assert str(UUID(fields["id"])) == fields["id"].lower()
    assert -100 < fields["celsius"] < 100


def check_get_weather(call: dict) -> str:
    """One get_weather call: the name and {"city": <str of at most 24>}."""
    assert call["name"] == "get_weather", call
    assert set(call["arguments"]) == {"city"}, call
    city = call["arguments"]["city"]
    assert isinstance(city, str) and len(city) <= 24, call
    return city


# -- the OpenAI SDK (main venv) ------------------------------------------------------------


def test_openai_tools_then_the_answer(eco_client, model):
    ask = [{"role": "user", "content": TOOL_PROMPT}]
    reply = eco_client.chat.completions.create(model=model, messages=ask, tools=[GET_WEATHER],
                                               tool_choice="required", seed=SEED,
                                               max_tokens=MAX_TOKENS)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) >= 1
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id
    city = check_get_weather({"name": call.function.name,
                              "arguments": json.loads(call.function.arguments)})
    # The assistant message goes back as the SDK returned it (the usual idiom),
    # then the result as a tool message; tool_choice "none" asks for text.
    answer = eco_client.chat.completions.create(
        model=model, messages=[*ask, choice.message,
                               {"role": "tool", "tool_call_id": call.id,
                                "content": f"Sunny in {city}, 21 degrees."}],
        tools=[GET_WEATHER], tool_choice="none", seed=SEED, max_tokens=40)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert isinstance(answer.choices[0].message.content, str)
    assert not answer.choices[0].message.tool_calls


def test_openai_stream_helper_tool_call(eco_client, model):
    body = dict(model=model, messages=[{"role": "user", "content": TOOL_PROMPT}],
                tools=[GET_WEATHER], seed=SEED, max_tokens=MAX_TOKENS,
                tool_choice={"type": "function", "function": {"name": "get_weather"}})
    with eco_client.chat.completions.stream(**body) as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    assert len(done) == 1 and done[0].name == "get_weather"
    check_get_weather({"name": done[0].name, "arguments": json.loads(done[0].arguments)})
    call = final.choices[0].message.tool_calls[0]
    assert final.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, call.function.arguments) == ("get_weather", done[0].arguments)
    # The same seed and body, not streamed: the same call.
    whole = eco_client.chat.completions.create(**body).choices[0].message.tool_calls[0]
    assert whole.function.arguments == done[0].arguments


def test_openai_pydantic_function_tool_forced(eco_client, model):
    reply = eco_client.chat.completions.parse(
        model=model, messages=[{"role": "user", "content": PROMPT}],
        # The tool's description fills most of the demo model's 1,024-token window.
        tools=[openai.pydantic_function_tool(Weather)], seed=SEED, max_tokens=200,
        tool_choice={"type": "function", "function": {"name": "Weather"}})
    call = reply.choices[0].message.tool_calls[0]
    assert call.function.name == "Weather"
    weather = call.function.parsed_arguments
    assert isinstance(weather, Weather)
    assert isinstance(weather.when, datetime) and isinstance(weather.id, UUID)
    assert type(weather.celsius) is int and isinstance(weather.city, str)


def test_openai_n_two_streamed_and_not(eco_client, model):
    """n=2, as SDK users send it: two choices, and the stream's two indices
    each finish once (issue 30: GGUF too)."""
    ask = [{"role": "user", "content": PROMPT}]
    reply = eco_client.chat.completions.create(model=model, messages=ask, n=2, max_tokens=8,
                                               seed=SEED)
    assert [c.index for c in reply.choices] == [0, 1]
    finished = [c.index for chunk in eco_client.chat.completions.create(
        model=model, messages=ask, n=2, max_tokens=8, seed=SEED, stream=True)
        for c in chunk.choices if c.finish_reason]
    assert sorted(finished) == [0, 1]


def test_openai_vllm_structured_outputs(eco_client, model):
    """A vLLM client's extra_body: the answer is one of the choices."""
    reply = eco_client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], seed=SEED,
        extra_body={"structured_outputs": {"choice": ["sunny", "rainy", "windy"]}})
    assert reply.choices[0].message.content in ("sunny", "rainy", "windy")


def test_langchain_n_and_vllm_choice(eco_stack, model):
    assert len(run_path(eco_stack, model, "langchain", "n_choices")["texts"]) == 2
    output = run_path(eco_stack, model, "langchain", "vllm_choice")
    assert output["text"] in output["choices"]


def test_openai_parse_response_format(eco_client, model):
    reply = eco_client.chat.completions.parse(
        model=model, messages=[{"role": "user", "content": PROMPT}], response_format=Weather,
        seed=SEED, max_tokens=MAX_TOKENS)
    assert reply.choices[0].finish_reason == "stop"
    weather = reply.choices[0].message.parsed
    assert isinstance(weather, Weather)
    assert isinstance(weather.when, datetime) and isinstance(weather.id, UUID)
    assert type(weather.celsius) is int and -100 < weather.celsius < 100


# -- the libraries, each in its own venv ---------------------------------------------------


@pytest.mark.parametrize(("library", "path"), [
    ("langchain", "function_calling"), ("langchain", "json_schema"),
    ("instructor", "tools"), ("instructor", "json_schema"),
    ("pydantic_ai", "native_output"), ("llamaindex", "structured_predict"),
])
def test_structured_output(eco_stack, model, library, path):
    check_weather(run_path(eco_stack, model, library, path)["output"])


def test_pydantic_ai_output_is_its_final_result_tool(eco_stack, model):
    report = run_path(eco_stack, model, "pydantic_ai", "output")
    check_weather(report["output"])
    # The output is the first final_result call (the demo model, trained on tool
    # turns, may make more than one when parallel calls are allowed).
    names = [c["name"] for c in report["tool_calls"]]
    assert names and set(names) == {"final_result"}, names
    arguments, fields = report["tool_calls"][0]["arguments"], report["output"]["fields"]
    # pydantic normalises what it parses (a UUID's hex digits to lower case).
    assert arguments.keys() == fields.keys()
    assert UUID(arguments["id"]) == UUID(fields["id"])
    assert {k: v for k, v in arguments.items() if k not in ("id", "when")} == \
        {k: v for k, v in fields.items() if k not in ("id", "when")}


def test_langchain_json_mode(eco_stack, model):
    """json_mode sends no schema, so only "one JSON object" is guaranteed: the
    raw document is an object (or, cut short by max_tokens, the start of one),
    and LangChain either parsed a Weather from it or says why not."""
    report = run_path(eco_stack, model, "langchain", "json_mode")
    if report["finish_reason"] == "length":
        assert is_json_prefix(report["raw"]), report["raw"]
    else:
        assert report["finish_reason"] == "stop"
        assert isinstance(json.loads(report["raw"]), dict)
    if report["parsing_error"] is None:
        check_weather(report["output"])
    else:
        assert report["output"]["class"] == "NoneType"
        # Cut short, the openai SDK's parse refuses it before LangChain reads it.
        assert report["parsing_error"] == ("LengthFinishReasonError"
                                           if report["finish_reason"] == "length"
                                           else "OutputParserException")


@pytest.mark.parametrize(("library", "path"), [
    ("langchain", "bind_tools"), ("llamaindex", "chat_with_tools"),
])
def test_one_tool_call(eco_stack, model, library, path):
    report = run_path(eco_stack, model, library, path)
    assert len(report["tool_calls"]) == 1, report
    check_get_weather(report["tool_calls"][0])
    if "finish_reason" in report:
        assert report["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(("library", "path", "answer"), [
    ("pydantic_ai", "tool", "str"), ("agents", "function_tool", "str"),
    ("llamaindex", "predict_and_call", "str"),
    ("agents", "responses", "str"), ("pydantic_ai", "responses_tool", "str"),
])
def test_agent_calls_the_tool_then_answers(eco_stack, model, library, path, answer):
    """The tool call, the tool run with the model's arguments, then (for the
    agents) the final answer after the result went back."""
    report = run_path(eco_stack, model, library, path)
    assert report["tool_calls"], report
    cities = [check_get_weather(call) for call in report["tool_calls"]]
    assert report["executed"] == cities
    assert report["output"]["class"] == answer
    if "tool_outputs" in report:
        assert report["tool_outputs"] == [f"Sunny in {c}, 21 degrees." for c in cities]
    # One model turn per call at most (calls made in parallel share one),
    # then the answer after the results went back.
    if library == "agents":
        assert 2 <= report["turns"] <= len(cities) + 1, report
    if library == "pydantic_ai":
        assert 2 <= report["requests"] <= len(cities) + 1, report


# -- the Responses API: the Node SDK, the Agents SDK's default model, pydantic-ai -----------


def test_node_sdk_responses_create_and_stream(eco_stack, model):
    if not (NODE_SDK / "node_modules" / "openai").is_dir():
        pytest.fail(f"{NODE_SDK}/node_modules is missing: `make eco-venvs` installs it")
    done = subprocess.run(["node", str(NODE_SDK / "responses.mjs"), f"{eco_stack.base_url}/v1",
                           model], capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    created, streamed = report["created"], report["streamed"]
    assert created["id"].startswith("resp_") and created["status"] in ("completed", "incomplete")
    assert isinstance(created["output_text"], str)
    assert streamed["previous_response_id"] == created["id"]
    types = [e["type"] for e in report["events"]]
    assert [e["seq"] for e in report["events"]] == list(range(len(types)))
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert types[-1] == f"response.{streamed['status']}"
    assert types[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]
    [call] = report["call"]
    check_get_weather({"name": call["name"], "arguments": json.loads(call["arguments"])})
    # The first turn is replayed before the streamed one's input.
    assert report["input_items"] == [{"type": "message", "role": "user"},
                                     {"type": "message", "role": "assistant"},
                                     {"type": "message", "role": "user"}]


def test_the_default_responses_models_are_used(eco_stack, model):
    """The Agents SDK's model-by-name and pydantic-ai's shorthand really went
    through /v1/responses (each turn has a resp_ id), and the Agents SDK's
    two APIs agree: the same seeded conversation renders the same prompt, so
    the Responses API run answers exactly as the chat completions one."""
    agents = run_path(eco_stack, model, "agents", "responses")
    assert all(i.startswith("resp_") for i in agents["response_ids"]), agents
    over_chat = run_path(eco_stack, model, "agents", "function_tool")
    assert agents["tool_calls"] == over_chat["tool_calls"]
    assert agents["output"] == over_chat["output"]
    shorthand = run_path(eco_stack, model, "pydantic_ai", "responses_tool")
    assert shorthand["model_class"] == "OpenAIResponsesModel"
    assert all(i.startswith("resp_") for i in shorthand["response_ids"]), shorthand


# -- Anthropic's Messages API: the anthropic SDK and langchain-anthropic --------------------


def test_anthropic_create_usage_matches_count_tokens(eco_stack, model):
    report = run_path(eco_stack, model, "anthropic", "create")
    assert report["cls"] == "Message" and report["id"].startswith("msg_")
    assert report["role"] == "assistant" and report["text"].strip(), report
    assert report["stop_reason"] in ("end_turn", "max_tokens")
    usage = report["usage"]
    # input_tokens leaves out what the prefix cache held (Anthropic's rule).
    assert report["count"] == usage["input_tokens"] + usage["cache_read_input_tokens"]
    assert report["count"] == usage["input_tokens"] or usage["cache_read_input_tokens"] > 0
    assert 0 < usage["output_tokens"] <= 64
    assert report["request_id"]


def test_anthropic_stream_is_the_seeded_message(eco_stack, model):
    report = run_path(eco_stack, model, "anthropic", "stream")
    assert report["whole"].strip(), report
    assert report["streamed"] == report["final"] == report["whole"]
    assert report["final_stop"] == report["whole_stop"]
    assert report["final_usage"]["output_tokens"] == report["whole_usage"]["output_tokens"]


def test_anthropic_forced_tool_then_its_result(eco_stack, model):
    report = run_path(eco_stack, model, "anthropic", "tools")
    assert report["stop_reason"] == "tool_use" and report["blocks"] == ["tool_use"], report
    tool = report["tool"]
    assert tool["id"].startswith("toolu_")
    check_get_weather({"name": tool["name"], "arguments": tool["input"]})
    assert report["answer_stop"] in ("end_turn", "max_tokens", "tool_use"), report
    assert report["answer_blocks"], report


def test_anthropic_errors_are_the_sdk_classes(eco_stack, model):
    report = run_path(eco_stack, model, "anthropic", "errors")
    expected = {"no_max_tokens": ("BadRequestError", 400, "invalid_request_error", "max_tokens"),
                "unknown_model": ("NotFoundError", 404, "not_found_error", "no-such-model"),
                # A budget past max_tokens (the demo model has no reasoning
                # format, but the budget is checked all the same).
                "thinking": ("BadRequestError", 400, "invalid_request_error",
                             "'thinking.budget_tokens'"),
                "bad_role": ("BadRequestError", 400, "invalid_request_error",
                             "messages[0].role")}
    for name, (cls, status, kind, named) in expected.items():
        got = report[name]
        assert got is not None, f"{name} was answered"
        assert (got["class"], got["status"], got["type"]) == (cls, status, kind), got
        assert named in got["message"], got


def test_langchain_anthropic_bind_tools(eco_stack, model):
    report = run_path(eco_stack, model, "anthropic", "langchain_bind_tools")
    assert len(report["tool_calls"]) == 1, report
    check_get_weather(report["tool_calls"][0])
    assert report["stop_reason"] == "tool_use"


def test_langchain_anthropic_structured_output(eco_stack, model):
    check_weather(run_path(eco_stack, model, "anthropic", "langchain_structured")["output"])


# -- reasoning_content: LangChain (ChatDeepSeek) and LiteLLM --------------------------------


@pytest.fixture(scope="module")
def reasoning_stack(tmp_path_factory):
    """A DeepSeek R1-style model (tests/format_models.py), whose prompt opens
    its reasoning block: the budget closes it."""
    from tests import format_models

    stack = format_models.serve(tmp_path_factory, "eco-reasoning")
    try:
        yield stack
    finally:
        stack.stop()


@pytest.mark.parametrize("path", ["langchain_deepseek", "langchain_stream", "litellm",
                                  "litellm_stream"])
def test_libraries_read_reasoning_content(reasoning_stack, path):
    report = run_path(reasoning_stack, "tiny-r1", "reasoning", path)
    assert isinstance(report["reasoning"], str) and report["reasoning"], report
    assert "<think>" not in report["content"] and "</think>" not in report["content"]
    assert "</think>" not in report["reasoning"]
    if "reasoning_tokens" in report:
        assert report["reasoning_tokens"] >= 8


def test_anthropic_thinking_blocks_of_a_reasoning_model(reasoning_stack):
    report = run_path(reasoning_stack, "tiny-r1", "anthropic", "thinking")
    assert report["blocks"][0] == "ThinkingBlock", report
    assert report["final_kinds"] == report["kinds"]
    assert report["thinking"] and report["streamed_thinking"] == report["thinking"]
    assert "</think>" not in report["thinking"] + report["text"]
    assert report["final_text"] == report["text"]
