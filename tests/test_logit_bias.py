"""logit_bias on chat and text completions, on both engines: OpenAI's shape
and limits (refusals name `logit_bias[<id>]`), each row of a batch with its
own bias, log-probabilities that leave the bias out (vLLM's default), and
scoring mode refusing it."""

from __future__ import annotations

import concurrent.futures
import json

import grpc
import pytest

from millm.v1 import generation_pb2
from tests.grpc_helpers import chat_request, error_info
from tests.http_helpers import call

TRANSFORMERS, GGUF = "millm-tiny", "millm-tiny-gguf:Q8_0"
PROMPT = "Once upon a time"


@pytest.fixture(scope="module", params=[TRANSFORMERS, GGUF])
def served(request, stack, gguf_stack):
    return request.param, stack if request.param == TRANSFORMERS else gguf_stack


def complete(served, **body) -> dict:
    model, stack = served
    reply = call(stack.http_port, "POST", "/v1/completions",
                 {"model": model, "prompt": PROMPT, "max_tokens": 3, "temperature": 0, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()


def token_of(served, word: str) -> int:
    model, stack = served
    ids = call(stack.http_port, "POST", "/tokenize",
               {"model": model, "prompt": word, "add_special_tokens": False}).json()["tokens"]
    assert len(ids) == 1, (word, ids)
    return ids[0]


def test_a_bias_of_100_makes_the_token_the_answer(served):
    river = token_of(served, " river")
    reply = complete(served, logit_bias={str(river): 100}, temperature=1, seed=3)
    assert reply["choices"][0]["text"] == " river" * 3


def test_minus_100_keeps_the_greedy_token_out(served):
    free = complete(served, max_tokens=1)["choices"][0]["text"]
    banned = token_of(served, free)
    biased = complete(served, max_tokens=1, logit_bias={str(banned): -100})
    assert biased["choices"][0]["text"] != free


def test_each_row_of_a_batch_has_its_own_bias(served):
    words = [" river", " mill", " water"]
    ids = [token_of(served, w) for w in words]
    free = complete(served)["choices"][0]["text"]
    bodies = [{"logit_bias": {str(i): 100}} for i in ids] + [{}] * 3
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        replies = list(pool.map(lambda b: complete(served, **b), bodies))
    texts = [r["choices"][0]["text"] for r in replies]
    assert texts == [w * 3 for w in words] + [free] * 3


def test_chat_honours_it_too(served):
    model, stack = served
    river = token_of(served, " river")
    reply = call(stack.http_port, "POST", "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 2,
        "logit_bias": {str(river): 100}})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == " river river"


@pytest.mark.parametrize(("bias", "param", "code"), [
    ({"5": 100.5}, "logit_bias[5]", "invalid_parameter"),
    ({"5": -101}, "logit_bias[5]", "invalid_parameter"),
    ({"abc": 1}, "logit_bias[abc]", "invalid_parameter"),
    ({"5": 1, "05": 2}, "logit_bias[05]", "invalid_parameter"),
    ({"99999999": 1}, "logit_bias[99999999]", "invalid_parameter"),
    ({"-1": 1}, "logit_bias[-1]", "invalid_parameter"),
    ({"5": "high"}, "logit_bias", "invalid_type"),
    ({"5": True}, "logit_bias", "invalid_type"),
    ({str(i): 1 for i in range(301)}, "logit_bias", "invalid_parameter"),
])
def test_bad_biases_are_400_naming_the_entry(served, bias, param, code):
    model, stack = served
    reply = call(stack.http_port, "POST", "/v1/completions",
                 {"model": model, "prompt": PROMPT, "max_tokens": 2, "logit_bias": bias})
    error = reply.json()["error"]
    assert (reply.status_code, error["param"], error["code"]) == (400, param, code), reply.text


def test_three_hundred_entries_are_fine(served):
    complete(served, logit_bias={str(i): 0.5 for i in range(300)})


def test_scoring_mode_refuses_it(served):
    model, stack = served
    reply = call(stack.http_port, "POST", "/v1/completions", {
        "model": model, "prompt": PROMPT, "max_tokens": 1, "logprobs": 2,
        "logit_bias": {"5": 10}})
    error = reply.json()["error"]
    assert (reply.status_code, error["code"], error["param"]) == (
        400, "invalid_scoring_request", "logit_bias")


def test_logprobs_leave_the_bias_out(stack):
    """Generation log-probabilities (transformers) report the distribution the
    model gave, without the bias, as vLLM's default raw log-probabilities do."""
    free = complete((TRANSFORMERS, stack), max_tokens=2, logprobs=5)
    first = free["choices"][0]["logprobs"]["top_logprobs"][0]
    runner_up, expected = sorted(first.items(), key=lambda kv: kv[1])[-2]
    forced = token_of((TRANSFORMERS, stack), runner_up)
    biased = complete((TRANSFORMERS, stack), max_tokens=2, logprobs=5,
                      logit_bias={str(forced): 100})
    logprobs = biased["choices"][0]["logprobs"]
    assert logprobs["tokens"][0] == runner_up
    assert logprobs["token_logprobs"][0] == pytest.approx(expected, abs=1e-4)
    assert logprobs["top_logprobs"][0] == pytest.approx(first, abs=1e-4)


def test_grpc_takes_the_map(generation_stub):
    free = list(generation_stub.Generate(chat_request(max_tokens=2), timeout=60))
    request = chat_request(max_tokens=2)
    request.sampling.logit_bias[300] = 100.0
    replies = list(generation_stub.Generate(request, timeout=60))
    ids = [t for r in replies for c in r.choices for t in c.token_ids]
    assert ids == [300, 300] != [t for r in free for c in r.choices for t in c.token_ids]
    request.sampling.logit_bias[10**9] = 1.0
    with pytest.raises(grpc.RpcError) as caught:
        list(generation_stub.Generate(request, timeout=60))
    info = error_info(caught.value)
    assert (info.reason, info.metadata["param"]) == ("invalid_parameter",
                                                     f"logit_bias[{10**9}]")
    assert generation_pb2.SamplingParams.DESCRIPTOR.fields_by_name["logit_bias"].number == 50


def test_the_openai_sdk_sends_it_streamed_and_not(stack, client):
    river = token_of((TRANSFORMERS, stack), " river")
    messages = [{"role": "user", "content": "Hello!"}]
    reply = client.chat.completions.create(model=TRANSFORMERS, messages=messages, max_tokens=3,
                                           logit_bias={str(river): 100})
    assert reply.choices[0].message.content == " river" * 3
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=TRANSFORMERS, messages=messages, max_tokens=3, logit_bias={str(river): 100},
        stream=True) if c.choices]
    assert "".join(pieces) == " river" * 3
    text = client.completions.create(model=TRANSFORMERS, prompt=PROMPT, max_tokens=3,
                                     logit_bias={str(river): 100})
    assert text.choices[0].text == " river" * 3


def test_a_grammar_mask_wins_over_the_bias(served):
    """+100 on a word cannot push it into a JSON document: the response_format
    mask still excludes it where the grammar does."""
    model, stack = served
    river = token_of(served, " river")
    reply = call(stack.http_port, "POST", "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": "Give me JSON."}],
        "max_tokens": 24, "temperature": 0, "response_format": {"type": "json_object"},
        "logit_bias": {str(river): 100}})
    assert reply.status_code == 200, reply.text
    content = reply.json()["choices"][0]["message"]["content"]
    assert content.lstrip().startswith("{")
    if reply.json()["choices"][0]["finish_reason"] == "stop":
        json.loads(content)


def test_every_choice_of_n_carries_the_bias(served):
    river = token_of(served, " river")
    reply = complete(served, n=3, temperature=1, seed=5, logit_bias={str(river): 100})
    assert [c["text"] for c in reply["choices"]] == [" river" * 3] * 3
