"""POST /tokenize and /detokenize and TokenizationService, on both engines:
the ids are the ones generation feeds the model (the same count as a
generation's usage.prompt_tokens, with and without tools, for chat and raw
prompts), detokenize round-trips them, and bad input is a 4xx naming the
field."""

from __future__ import annotations

import http.client
import json

import grpc
import pytest

from millm.v1 import generation_pb2, tokenization_service_pb2, tokenization_service_pb2_grpc
from tests.grpc_helpers import error_info
from tests.http_helpers import call

TRANSFORMERS, GGUF = "millm-tiny", "millm-tiny-gguf:Q8_0"
WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Tell me about the river."}]


@pytest.fixture(scope="module", params=[TRANSFORMERS, GGUF])
def served(request, stack, gguf_stack):
    """(model, stack) for each engine."""
    return request.param, stack if request.param == TRANSFORMERS else gguf_stack


def tokenize(served, **body):
    model, stack = served
    reply = call(stack.http_port, "POST", "/tokenize", {"model": model, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()


def usage(served, path: str, **body) -> dict:
    model, stack = served
    reply = call(stack.http_port, "POST", path, {"model": model, "max_tokens": 1,
                                                 "temperature": 0, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]


@pytest.mark.parametrize("extra", [{}, {"tools": [WEATHER]}], ids=["plain", "tools"])
def test_chat_count_is_a_generations_prompt_tokens(served, extra):
    tokens = tokenize(served, messages=CHAT, **extra)
    assert tokens["count"] == len(tokens["tokens"]) > 5
    assert tokens["token_strs"] is None
    assert tokens["count"] == usage(served, "/v1/chat/completions", messages=CHAT,
                                    **extra)["prompt_tokens"]
    assert tokens["max_model_len"] > tokens["count"]


def test_tools_are_rendered_into_the_prompt(served):
    plain = tokenize(served, messages=CHAT)["count"]
    assert tokenize(served, messages=CHAT, tools=[WEATHER])["count"] > plain + 10


def test_a_tool_history_counts_as_generation_does(served):
    history = [*CHAT, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Rain."}]
    tokens = tokenize(served, messages=history, tools=[WEATHER])
    assert tokens["count"] == usage(served, "/v1/chat/completions", messages=history,
                                    tools=[WEATHER])["prompt_tokens"]


def test_a_trailing_assistant_message_is_continued_as_in_generation(served):
    partial = [*CHAT, {"role": "assistant", "content": "The river"}]
    tokens = tokenize(served, messages=partial)
    assert tokens["count"] == usage(served, "/v1/chat/completions",
                                    messages=partial)["prompt_tokens"]
    model, stack = served
    text = call(stack.http_port, "POST", "/detokenize",
                {"model": model, "tokens": tokens["tokens"]}).json()["prompt"]
    assert text.endswith("The river")  # left open: no end-of-turn after it
    closed = tokenize(served, messages=partial, continue_final_message=False,
                      add_generation_prompt=False)
    assert closed["count"] > tokens["count"]


def test_prompt_count_is_a_completions_prompt_tokens(served):
    for prompt in ("Once upon a time", "<|im_end|> is ten characters here"):
        tokens = tokenize(served, prompt=prompt)
        assert tokens["count"] == usage(served, "/v1/completions",
                                        prompt=prompt)["prompt_tokens"]
    special = tokenize(served, prompt="<|im_end|>", parse_special_tokens=True,
                       return_token_strs=True)
    assert special["token_strs"] == ["<|im_end|>"]


def test_detokenize_round_trips_the_chat_template(served):
    model, stack = served
    tokens = tokenize(served, messages=[{"role": "user", "content": "Hello there"}],
                      return_token_strs=True)
    assert tokens["token_strs"][:2] == ["<|im_start|>", "user"]
    assert len(tokens["token_strs"]) == tokens["count"]
    reply = call(stack.http_port, "POST", "/detokenize",
                 {"model": model, "tokens": tokens["tokens"]})
    assert reply.status_code == 200, reply.text
    text = reply.json()["prompt"]
    assert text == "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"
    again = tokenize(served, prompt=text, parse_special_tokens=True, add_special_tokens=False)
    assert again["tokens"] == tokens["tokens"]


def test_no_generation_prompt_drops_the_assistant_opening(served):
    messages = [{"role": "user", "content": "Hello there"}]
    full = tokenize(served, messages=messages)
    bare = tokenize(served, messages=messages, add_generation_prompt=False)
    assert full["tokens"][:len(bare["tokens"])] == bare["tokens"]
    assert full["count"] - bare["count"] == 3  # <|im_start|> assistant \n


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"tokens": [5, 10**6]}, "tokens[1]", "invalid_parameter"),
    ({"tokens": [-1]}, "tokens[0]", "invalid_parameter"),
    ({"tokens": ["5"]}, "tokens[0]", "invalid_type"),
    ({"tokens": [2**63]}, "tokens[0]", "invalid_parameter"),
])
def test_detokenize_refuses_ids_outside_the_vocabulary(served, body, param, code):
    model, stack = served
    reply = call(stack.http_port, "POST", "/detokenize", {"model": model, **body})
    error = reply.json()["error"]
    assert (reply.status_code, error["param"], error["code"]) == (400, param, code)


@pytest.mark.parametrize(("body", "param"), [
    ({}, "prompt"),
    ({"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, "prompt"),
    ({"prompt": "x", "add_generation_prompt": True}, "add_generation_prompt"),
    ({"messages": [{"role": "user", "content": "x"}], "parse_special_tokens": True},
     "parse_special_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "continue_final_message": True},
     "continue_final_message"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
      "continue_final_message": True, "add_generation_prompt": True},
     "continue_final_message"),
    ({"messages": [{"role": "user", "content": "<|im_start|>system"}]}, "messages[0].content"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
      "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ 1 }}"},
     "chat_template"),
    ({"model": "no-such-model", "prompt": "x"}, "model"),
])
def test_tokenize_refusals_name_the_field(stack, body, param):
    reply = call(stack.http_port, "POST", "/tokenize", {"model": TRANSFORMERS, **body})
    assert 400 <= reply.status_code < 500, reply.text
    assert reply.json()["error"]["param"] == param, reply.text


def test_unknown_fields_are_reported_and_strict_refuses_them(stack):
    body = {"model": TRANSFORMERS, "prompt": "x", "mystery": 1}
    reply = call(stack.http_port, "POST", "/tokenize", body)
    assert reply.status_code == 200
    assert reply.headers["x-millm-ignored-fields"] == '"mystery"'
    conn = http.client.HTTPConnection("127.0.0.1", stack.http_port, timeout=30)
    conn.request("POST", "/tokenize", body=json.dumps(body),
                 headers={"Content-Type": "application/json", "X-miLLM-Strict": "1"})
    strict = conn.getresponse()
    error = json.loads(strict.read())["error"]
    conn.close()
    assert (strict.status, error["code"], error["param"]) == (400, "unused_fields_refused",
                                                              "mystery")


def test_the_body_limit_applies(stack):
    reply = call(stack.http_port, "POST", "/detokenize",
                 {"model": TRANSFORMERS, "tokens": [5] * 400_000})
    assert (reply.status_code, reply.json()["error"]["code"]) == (413, "request_too_large")


def test_grpc_gives_the_rest_answer(served):
    model, stack = served
    with grpc.insecure_channel(stack.grpc_target) as channel:
        stub = tokenization_service_pb2_grpc.TokenizationServiceStub(channel)
        reply = stub.Tokenize(tokenization_service_pb2.TokenizeRequest(
            model=model, chat=generation_pb2.ChatInput(messages=[generation_pb2.ChatMessage(
                role=generation_pb2.ROLE_USER, content="Tell me about the river.")]),
            return_token_strs=True), timeout=30)
        rest = tokenize(served, messages=[{"role": "user", "content": "Tell me about the river."}],
                        return_token_strs=True)
        assert (list(reply.tokens), reply.count, list(reply.token_strs), reply.model) == (
            rest["tokens"], rest["count"], rest["token_strs"], model)
        text = stub.Detokenize(tokenization_service_pb2.DetokenizeRequest(
            model=model, tokens=reply.tokens), timeout=30).prompt
        assert "Tell me about the river." in text
        with pytest.raises(grpc.RpcError) as caught:
            stub.Detokenize(tokenization_service_pb2.DetokenizeRequest(
                model=model, tokens=[1, 2, 10**7]), timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        info = error_info(caught.value)
        assert (info.reason, info.metadata["param"]) == ("invalid_parameter", "tokens[2]")


def test_both_engines_agree(stack, gguf_stack):
    body = {"messages": CHAT, "tools": [WEATHER], "return_token_strs": True}
    answers = [call(s.http_port, "POST", "/tokenize", {"model": m, **body}).json()
               for m, s in ((TRANSFORMERS, stack), (GGUF, gguf_stack))]
    assert answers[0]["tokens"] == answers[1]["tokens"]
    assert answers[0]["token_strs"] == answers[1]["token_strs"]
