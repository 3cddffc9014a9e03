"""The Python client (clients/python): the wrapper against a live engine, and a
fresh install without the server's dependencies."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap

import pytest

from millm.client import AsyncClient, Client, Generation, MillmError, _fold, chat_request
from millm.tools import ToolCall, ToolCallFragment, fold_tool_calls
from millm.v1 import generation_pb2, generation_service_pb2
from tests import harness
from tests.conftest import MODEL

HELLO = [{"role": "user", "content": "Hello!"}]


def test_sync_client(stack):
    with Client(stack.grpc_target, model=MODEL, timeout=30) as client:
        deltas = list(client.chat(HELLO, max_tokens=6, temperature=0, request_id="py-1"))
        assert deltas and deltas[-1].finish_reason in ("stop", "length")
        text = "".join(d.text for d in deltas)
        again = client.complete(["The river", "Cats"], max_tokens=3, temperature=0)
        assert sorted(again.texts) == [0, 1] and again.completion_tokens > 0
        # Greedy: the same request streams the same text again.
        assert text == "".join(d.text for d in client.chat(HELLO, max_tokens=6, temperature=0))
        assert [d.index for d in deltas] == [0] * len(deltas)
        scored = client.score("The river", allowed_token_ids=[40, 41], top_logprobs=2)
        assert {t.token_id for t in scored.choices[0].next.top} == {40, 41}
        vectors = client.embed(["a", "b"])
        assert len(vectors) == 2 and len(vectors[0]) == 64
        assert MODEL in client.list_models()
        assert client.capabilities().features.scoring
        with pytest.raises(MillmError) as caught:
            list(client.chat(HELLO, temperature=5))
        assert (caught.value.code, caught.value.param, caught.value.http_status) == (
            "invalid_parameter", "temperature", 400)


def test_tokenize_and_logit_bias_through_the_client(stack):
    with Client(stack.grpc_target, model=MODEL, timeout=30) as client:
        tokens = client.tokenize(HELLO, return_token_strs=True)
        assert tokens.count == len(tokens.tokens) and tokens.token_strs[0] == "<|im_start|>"
        assert client.detokenize(tokens.tokens).startswith("<|im_start|>user\nHello!")
        plain = client.tokenize("Hello!", add_special_tokens=False)
        assert plain.count < tokens.count
        generated = client.complete(["The river"], max_tokens=2)
        assert client.tokenize("The river").count == generated.prompt_tokens
        river = client.tokenize(" river", add_special_tokens=False).tokens
        forced = client.complete(["Once"], max_tokens=2, logit_bias={river[0]: 100.0})
        assert forced.texts[0] == " river river"
        with pytest.raises(MillmError) as caught:
            client.detokenize([1, 10**7])
        assert (caught.value.code, caught.value.param) == ("invalid_parameter", "tokens[1]")


def test_async_client(stack):
    async def go():
        async with AsyncClient(stack.grpc_target, model=MODEL, timeout=30) as client:
            pieces = [d.text async for d in client.chat(HELLO, max_tokens=4)]
            vectors = await client.embed("a")
            tokens = await client.tokenize("a", add_special_tokens=False)
            assert await client.detokenize(tokens.tokens) == "a"
            with pytest.raises(MillmError) as caught:
                await client.score("x", allowed_token_ids=[10**6])
            return pieces, vectors, caught.value.code

    pieces, vectors, code = asyncio.run(go())
    assert pieces and len(vectors) == 1 and code == "invalid_scoring_request"


@pytest.mark.timeout(600)
def test_installs_alone_without_torch(stack, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                    str(harness.ROOT / "clients" / "python")], check=True, timeout=500)
    script = textwrap.dedent(f"""
        import importlib.util
        from millm.client import Client
        assert importlib.util.find_spec("torch") is None, "torch must not be needed"
        with Client("{stack.grpc_target}", timeout=30) as client:
            text = "".join(d.text for d in client.chat(
                [{{"role": "user", "content": "Hello!"}}], max_tokens=5))
        print("streamed", len(text))
    """)
    done = subprocess.run([str(python), "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("streamed ")


WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_chat_request_carries_tools():
    request = chat_request(
        MODEL,
        [{"role": "user", "content": "Weather in Oslo?"},
         {"role": "assistant", "content": None, "tool_calls": [
             {"id": "call_1", "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}},
             ToolCall("call_2", "get_time", "{}")]},
         {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}],
        tools=[{"name": "get_weather", "description": "Weather now", "parameters": WEATHER},
               {"type": "function", "function": {"name": "get_time", "strict": True}}],
        tool_choice="required", parallel_tool_calls=False, max_tokens=8)
    first, second = request.tools
    assert (first.name, first.description) == ("get_weather", "Weather now")
    assert json.loads(first.parameters_json) == WEATHER and not first.HasField("strict")
    assert (second.name, second.parameters_json, second.strict) == ("get_time", "", True)
    assert request.tool_choice.mode == generation_pb2.TOOL_CHOICE_MODE_REQUIRED
    assert request.HasField("parallel_tool_calls") and not request.parallel_tool_calls
    assert request.sampling.max_tokens == 8
    user, assistant, tool = request.chat.messages
    assert user.content == "Weather in Oslo?" and not user.tool_calls and not user.tool_call_id
    assert assistant.role == generation_pb2.ROLE_ASSISTANT and assistant.content == ""
    assert [(c.id, c.name, c.arguments_json) for c in assistant.tool_calls] == [
        ("call_1", "get_weather", '{"city":"Oslo"}'), ("call_2", "get_time", "{}")]
    assert (tool.role, tool.tool_call_id, tool.content) == (generation_pb2.ROLE_TOOL,
                                                           "call_1", "12 C")


def test_chat_request_tool_choice_and_defaults():
    plain = chat_request(MODEL, HELLO)
    assert not plain.tools and not plain.HasField("tool_choice")
    assert not plain.HasField("parallel_tool_calls")
    modes = {"none": generation_pb2.TOOL_CHOICE_MODE_NONE,
             "auto": generation_pb2.TOOL_CHOICE_MODE_AUTO,
             "required": generation_pb2.TOOL_CHOICE_MODE_REQUIRED}
    for word, mode in modes.items():
        assert chat_request(MODEL, HELLO, tool_choice=word).tool_choice == (
            generation_pb2.ToolChoice(mode=mode))
    named = generation_pb2.ToolChoice(mode=generation_pb2.TOOL_CHOICE_MODE_FUNCTION,
                                      function_name="get_weather")
    assert chat_request(MODEL, HELLO, tool_choice="get_weather").tool_choice == named
    openai_shape = {"type": "function", "function": {"name": "get_weather"}}
    assert chat_request(MODEL, HELLO, tool_choice=openai_shape).tool_choice == named
    # Arguments given as a dict are sent as JSON text.
    message = {"role": "assistant", "tool_calls": [
        {"id": "c", "name": "get_weather", "arguments": {"city": "Oslo"}}]}
    sent = chat_request(MODEL, [message]).chat.messages[0].tool_calls[0]
    assert json.loads(sent.arguments_json) == {"city": "Oslo"}


def test_fold_tool_calls():
    calls = fold_tool_calls([], [ToolCallFragment(0, "call_a", "get_weather", ""),
                                 ToolCallFragment(0, "", "", '{"city":')])
    assert calls == [ToolCall("call_a", "get_weather", '{"city":')]
    calls = fold_tool_calls(calls, [ToolCallFragment(1, "call_b", "get_time", "{"),
                                    ToolCallFragment(0, "", "", '"Oslo"}'),
                                    ToolCallFragment(1, "", "", "}")])
    assert calls == [ToolCall("call_a", "get_weather", '{"city":"Oslo"}'),
                     ToolCall("call_b", "get_time", "{}")]
    assert calls[0].parsed_arguments() == {"city": "Oslo"}
    assert fold_tool_calls(calls, []) == calls
    with pytest.raises(ValueError, match="index 3"):
        fold_tool_calls(calls, [ToolCallFragment(3, "call_d", "f", "")])


def test_generation_folds_streamed_tool_calls():
    def response(*choices, **fields):
        return generation_service_pb2.GenerateResponse(choices=choices, **fields)

    def fragment(index, **fields):
        return generation_pb2.ToolCallDelta(index=index, **fields)

    stream = [
        response(generation_pb2.ChoiceDelta(index=0, text="Let me check."),
                 metadata=generation_pb2.ResponseMetadata(id="gen-1", model=MODEL)),
        response(generation_pb2.ChoiceDelta(index=0, tool_calls=[
            fragment(0, id="call_a", name="get_weather")]),
                 generation_pb2.ChoiceDelta(index=1, text="Hi", finish_reason=1)),
        response(generation_pb2.ChoiceDelta(index=0, tool_calls=[
            fragment(0, arguments='{"city":'), fragment(0, arguments='"Oslo"}')],
            finish_reason=generation_pb2.FINISH_REASON_TOOL_CALLS),
                 usage=generation_pb2.Usage(prompt_tokens=5, completion_tokens=9)),
    ]
    result = Generation()
    for r in stream:
        _fold(result, r)
    assert (result.id, result.model, result.completion_tokens) == ("gen-1", MODEL, 9)
    assert result.texts == {0: "Let me check.", 1: "Hi"}
    assert result.finish_reasons == {0: "tool_calls", 1: "stop"}
    assert result.tool_calls == {0: [ToolCall("call_a", "get_weather", '{"city":"Oslo"}')]}


def test_a_named_tool_call_through_the_client(stack):
    """The client's tool fields reach the engine, and its fold gives the
    caller one whole call whose arguments parse."""
    weather = {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
        "required": ["city"], "additionalProperties": False}}
    with Client(stack.grpc_target, model=MODEL, timeout=30) as client:
        result = Generation()
        for delta in client.chat([{"role": "user", "content": "Weather in Paris?"}],
                                 tools=[weather], tool_choice="get_weather", max_tokens=80,
                                 seed=4):
            result.add(delta)
    assert result.finish_reasons[0] == "tool_calls"
    [call] = result.tool_calls[0]
    assert call.name == "get_weather" and call.id.startswith("call_")
    assert set(json.loads(call.arguments)) == {"city"}
