"""GGUF models through llama-cpp-python: the same OpenAI SDK calls as the
transformers engine, names with quantization tags, context overflow, the
chat template, continuation, refusals before any load, prefix reuse,
disconnects and scoring.

A GGUF engine of its own (starting on millm-tiny-gguf:F32) serves these, so
the session stack stays on millm-tiny; the transformers answers they are
compared with come from the session stack.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest
from hypothesis import HealthCheck, given, settings

from service.demo_model.build import CONTEXT_WINDOW
from tests import harness
from tests import test_fuzz_bodies as fuzz
from tests.conftest import wait_until
from tests.http_helpers import SseStream

F32, Q8 = "millm-tiny-gguf:F32", "millm-tiny-gguf:Q8_0"
PROMPTS = [
    "Tell me a story about the river.",
    "What does the miller do in the morning?",
    "Hello!",
]
# F32 export vs the transformers engine, both in float32: llama.cpp sums in
# another order, and the two agree to about 1e-5 (measured 9.5e-6 at most).
LOGPROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    stack = harness.OwnStack(tmp_path_factory.mktemp("gguf"), MILLM_MODEL=F32)
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def gclient(gguf):
    return openai.OpenAI(base_url=f"{gguf.base_url}/v1", api_key="unused", max_retries=0,
                         timeout=60)


def post(stack, path: str, body: dict, headers: dict | None = None):
    request = urllib.request.Request(f"{stack.base_url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read()), dict(reply.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


def greedy_chat(client, model: str, content: str, **extra) -> str:
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], temperature=0,
        max_tokens=40, **extra)
    return reply.choices[0].message.content


# -- the Bar ------------------------------------------------------------------------------


def test_quantized_export_streams_a_chat_answer(gclient):
    stream = gclient.chat.completions.create(
        model=Q8, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=160,
        temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and
                c.choices[0].finish_reason]
    # Pieces arrive as they are made (steps that pile up are merged, so not one per token;
    # enough tokens that a fast machine cannot finish them all before the first read).
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 2
    assert text.strip() and finishes == ["length"]
    assert chunks[0].model == Q8 and chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == 160


def test_bare_repository_name_is_ambiguous_naming_both_tags(gclient):
    with pytest.raises(openai.BadRequestError) as caught:
        gclient.chat.completions.create(model="millm-tiny-gguf",
                                        messages=[{"role": "user", "content": "Hi"}])
    error = caught.value.body
    assert caught.value.status_code == 400 and error["code"] == "AMBIGUOUS_MODEL_NAME"
    assert F32 in error["message"] and Q8 in error["message"]
    assert error["param"] == "model"


def test_capabilities_report_the_files_own_window(gguf):
    """The export carries the checkpoint's window, and the engine serves it
    whole by default (MILLM_GGUF_CONTEXT=0)."""
    with urllib.request.urlopen(f"{gguf.base_url}/api/capabilities", timeout=30) as reply:
        assert int(json.loads(reply.read())["context_window"]) == CONTEXT_WINDOW >= 32_768


def test_prompt_longer_than_the_window_is_context_length_exceeded(gclient):
    long_prompt = "the river and the mill " * (CONTEXT_WINDOW // 4)  # past the window
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            reply = gclient.completions.create(model=F32, prompt=long_prompt, max_tokens=8,
                                               stream=stream)
            list(reply) if stream else None
        error = caught.value.body
        assert error["code"] == "context_length_exceeded", error
        numbers = [int(n) for n in __import__("re").findall(r"\d+", error["message"])]
        # available and requested
        assert CONTEXT_WINDOW in numbers and max(numbers) > CONTEXT_WINDOW


def test_unquantized_greedy_text_equals_the_transformers_engine(client, gclient):
    for prompt in PROMPTS:
        assert greedy_chat(gclient, F32, prompt) == greedy_chat(client, "millm-tiny", prompt)
    raw = "Once upon a time"
    ours = gclient.completions.create(model=F32, prompt=raw, max_tokens=30, temperature=0)
    theirs = client.completions.create(model="millm-tiny", prompt=raw, max_tokens=30,
                                       temperature=0)
    assert ours.choices[0].text == theirs.choices[0].text
    assert ours.usage.prompt_tokens == theirs.usage.prompt_tokens


def test_unquantized_log_probabilities_match_the_transformers_engine(client, gclient):
    prompt = "The miller opened the water and listened to the wheel"

    def echoed(c, model):
        reply = c.completions.create(model=model, prompt=prompt, max_tokens=1, logprobs=5,
                                     echo=True, temperature=0)
        return reply.choices[0].logprobs

    ours, theirs = echoed(gclient, F32), echoed(client, "millm-tiny")
    assert ours.tokens == theirs.tokens
    assert ours.token_logprobs[0] is None and theirs.token_logprobs[0] is None
    worst = max(abs(a - b) for a, b in zip(ours.token_logprobs[1:], theirs.token_logprobs[1:],
                                           strict=True))
    assert worst < LOGPROB_TOLERANCE, worst
    for a, b in zip(ours.top_logprobs[1:], theirs.top_logprobs[1:], strict=True):
        assert set(a) == set(b)
        assert all(abs(a[k] - b[k]) < LOGPROB_TOLERANCE for k in a)


# -- scoring against llama-cpp-python itself --------------------------------------------------


def _direct_log_probabilities(path, ids) -> np.ndarray:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=1024, n_threads=1, logits_all=True, type_k=0,
                type_v=0, verbose=False)
    try:
        llm.eval(ids)
        logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
    finally:
        llm.close()
    top = logits.max(axis=1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("model", [F32, Q8])
def test_scoring_equals_a_direct_llama_cpp_computation(gclient, model):
    quant = model.split(":")[1]
    path = harness.models_dir() / "millm-tiny-gguf" / f"millm-tiny-gguf-{quant}.gguf"
    prompt = "Every morning he opened the water"
    reply = gclient.completions.create(
        model=model, prompt=prompt, max_tokens=1, logprobs=3, echo=True, temperature=0,
        extra_body={"return_tokens_as_token_ids": True})
    lp = reply.choices[0].logprobs
    # Prompt tokens, then the scored next token.
    ids = [int(t.removeprefix("token_id:")) for t in lp.tokens]
    prompt_ids, next_id = ids[:-1], ids[-1]
    direct = _direct_log_probabilities(path, prompt_ids)
    # Echo entry p is the prediction made *before* token p (row p - 1), and
    # the first token has none.
    assert lp.token_logprobs[0] is None
    for p in range(1, len(prompt_ids)):
        assert math.isclose(lp.token_logprobs[p], direct[p - 1, prompt_ids[p]],
                            rel_tol=1e-5, abs_tol=1e-5)
    # The scored token's own entry is there: the argmax of the last row.
    assert next_id == int(np.argmax(direct[-1]))
    assert math.isclose(lp.token_logprobs[-1], direct[-1, next_id], rel_tol=1e-5,
                        abs_tol=1e-5)
    best = sorted(range(direct.shape[1]), key=lambda i: -direct[-1, i])[:3]
    assert {f"token_id:{i}" for i in best} == set(lp.top_logprobs[-1])


def test_token_id_prompts_are_scored_not_a_500(gclient, client):
    ids = client.completions.create(model="millm-tiny", prompt="the mill", max_tokens=1,
                                    logprobs=0, echo=True,
                                    extra_body={"return_tokens_as_token_ids": True})
    prompt_ids = [int(t.removeprefix("token_id:"))
                  for t in ids.choices[0].logprobs.tokens[:-1]]
    reply = gclient.completions.create(model=F32, prompt=prompt_ids, max_tokens=1, logprobs=2)
    assert reply.choices[0].logprobs.token_logprobs[0] < 0


def test_chat_scoring_with_allowed_tokens(gclient, client):
    body = dict(messages=[{"role": "user", "content": "Is the river quiet?"}], max_tokens=1,
                logprobs=True, top_logprobs=2, temperature=0,
                extra_body={"allowed_token_ids": [3, 4, 5]})
    ours = gclient.chat.completions.create(model=F32, **body)
    theirs = client.chat.completions.create(model="millm-tiny", **body)
    a, b = ours.choices[0].logprobs.content[0], theirs.choices[0].logprobs.content[0]
    assert a.token == b.token and abs(a.logprob - b.logprob) < LOGPROB_TOLERANCE
    assert len(a.top_logprobs) == 2


# -- requests ---------------------------------------------------------------------------------


def test_chat_template_kwargs_are_accepted_and_reported(gguf):
    status, body, headers = post(gguf, "/v1/chat/completions", {
        "model": F32, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
        "chat_template_kwargs": {"enable_thinking": False}})
    assert status == 200, body
    assert '"chat_template_kwargs"' in headers.get("x-millm-ignored-fields", "")


def test_a_trailing_assistant_message_is_continued(client, gclient):
    messages = [{"role": "user", "content": "Tell me a story."},
                {"role": "assistant", "content": "Once upon a time, a miller"}]
    ours = gclient.chat.completions.create(model=F32, messages=messages, temperature=0,
                                           max_tokens=20).choices[0].message.content
    theirs = client.chat.completions.create(model="millm-tiny", messages=messages,
                                            temperature=0,
                                            max_tokens=20).choices[0].message.content
    assert ours == theirs
    assert not ours.lstrip().startswith("Once upon")  # continued, not restarted


def test_stop_sequences_cut_the_text(gclient):
    def greedy(**extra):
        return gclient.completions.create(model=F32, prompt="Once upon a time", max_tokens=30,
                                          temperature=0, **extra).choices[0]

    full = greedy().text
    words = full.split()  # a build may end its text within a few words
    assert words, full
    word = words[min(3, len(words) - 1)]
    cut = greedy(stop=[word])
    assert cut.finish_reason == "stop"
    assert cut.text == full[: full.index(word)]


def test_sampling_fields_change_the_draw_and_stay_in_range(gclient):
    texts = {gclient.chat.completions.create(
        model=F32, messages=[{"role": "user", "content": "Hello!"}], max_tokens=12,
        temperature=1.5, top_p=0.95, extra_body={"top_k": 50, "min_p": 0.01}
    ).choices[0].message.content for _ in range(4)}
    assert len(texts) > 1  # sampled, not greedy


CHAT = {"messages": [{"role": "user", "content": "Hi"}]}


@pytest.mark.parametrize(("route", "body", "param", "code"), [
    ("completions", {"profile": "any", "max_tokens": 5}, "profile", "field_not_honoured"),
    ("chat", {"extra_messages": [[{"role": "user", "content": "Hi"}]], "max_tokens": 5},
     "extra_messages", "field_not_honoured"),
])
def test_unhonoured_fields_are_refused_before_any_load(gguf, route, body, param, code):
    loaded_before = _loaded(gguf)
    other = Q8 if loaded_before == F32 else F32
    path, base = (("/v1/chat/completions", CHAT) if route == "chat"
                  else ("/v1/completions", {"prompt": "Hi"}))
    status, reply, _ = post(gguf, path, {"model": other, **base, **body})
    assert status == 400 and reply["error"]["code"] == code and reply["error"]["param"] == param
    assert _loaded(gguf) == loaded_before  # nothing was loaded for it


def test_embeddings_equal_the_transformers_engine(client, gclient):
    inputs = ["the mill by the river", "Cats sleep", "Once upon a time, a miller lived"]
    ours = gclient.embeddings.create(model=F32, input=inputs)
    theirs = client.embeddings.create(model="millm-tiny", input=inputs)
    assert ours.usage.prompt_tokens == theirs.usage.prompt_tokens
    for a, b in zip(ours.data, theirs.data, strict=True):
        assert a.index == b.index and len(a.embedding) == len(b.embedding) == 64
        assert max(abs(x - y) for x, y in zip(a.embedding, b.embedding, strict=True)) < 1e-4
    # One input's vector does not depend on the others sent with it.
    alone = gclient.embeddings.create(model=F32, input=inputs[1]).data[0].embedding
    assert alone == ours.data[1].embedding


def _loaded(stack) -> str:
    with urllib.request.urlopen(f"{stack.base_url}/api/models", timeout=10) as reply:
        models = json.loads(reply.read())["data"]
    return next(m["id"] for m in models if m["state"] == "loaded")


def test_a_shared_prompt_prefix_is_reused_and_reported(gclient):
    system = {"role": "system", "content": "You are the miller of the quiet river. " * 8}
    usages = [gclient.chat.completions.create(
        model=F32, messages=[system, {"role": "user", "content": question}], max_tokens=4,
        temperature=0).usage for question in ("Who are you?", "Where do you live?")]
    assert usages[0].prompt_tokens > 60
    cached = usages[1].prompt_tokens_details.cached_tokens
    assert 60 < cached < usages[1].prompt_tokens


def test_a_disconnected_stream_frees_the_engine_at_once(gguf, gclient):
    def status():
        with urllib.request.urlopen(f"{gguf.base_url}/api/health/inference", timeout=10) as r:
            return json.loads(r.read())

    gclient.completions.create(model=F32, prompt="warm", max_tokens=1)
    before = status()["cancelled_generations_total"]
    with SseStream(gguf.base_url, "/v1/completions", timeout=30, body={
            "model": F32, "prompt": "Once upon a time", "max_tokens": 1000, "stream": True,
            "ignore_eos": True}) as reply:
        lines = reply.lines()
        assert next(line for line in lines if line.startswith("data: "))
    # The engine noticed and dropped it: nothing runs, and the next request starts at once.
    assert wait_until(lambda: status()["cancelled_generations_total"] == before + 1, 10)
    assert status()["active_generations"] == 0
    started = time.monotonic()
    gclient.completions.create(model=F32, prompt="Hello", max_tokens=2)
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("model", [F32, Q8])
def test_a_seed_reproduces_byte_identical_text(gguf, gclient, model):
    """The measurement behind honouring seed on GGUF: 20 runs of one seeded
    body, each after an unrelated request (so the context's cache differs),
    give the same bytes; another seed gives other text."""
    body = dict(model=model, messages=[{"role": "user", "content": "Tell me a story."}],
                max_tokens=32, temperature=1.2, top_p=0.95)
    texts, scopes = set(), set()
    for run in range(20):
        gclient.completions.create(model=model, prompt=f"Run {run}: the river", max_tokens=3,
                                   temperature=1.0)
        reply = gclient.chat.completions.with_raw_response.create(seed=1234, **body)
        scopes.add(reply.headers.get("x-millm-seed"))
        texts.add(reply.parse().choices[0].message.content)
    assert len(texts) == 1 and scopes == {'1234;scope="request"'}
    others = {gclient.chat.completions.create(seed=seed, **body).choices[0].message.content
              for seed in (1, 2, 3)}
    assert others - texts  # the seed is what decides the draw


# -- the same OpenAI SDK calls on both engines ------------------------------------------------

SDK_CALLS = {
    "chat with a system prompt": lambda c, m: c.chat.completions.create(
        model=m, messages=[{"role": "system", "content": "You are concise."},
                           {"role": "user", "content": "Where is the lighthouse?"}],
        temperature=0, max_completion_tokens=24),
    "two raw prompts": lambda c, m: c.completions.create(
        model=m, prompt=["The river ran", "In the morning the market"], temperature=0,
        max_tokens=12),
    "token-id prompt": lambda c, m: c.completions.create(
        model=m, prompt=[40, 41, 42, 43], temperature=0, max_tokens=8),
}


def _shape(reply) -> dict:
    body = reply.model_dump()
    return {"object": body["object"], "indexes": [c["index"] for c in body["choices"]],
            "finish": [c["finish_reason"] for c in body["choices"]],
            "texts": [c.get("text") or c["message"]["content"] for c in body["choices"]],
            "usage": {k: body["usage"][k] for k in ("prompt_tokens", "completion_tokens")}}


@pytest.mark.parametrize("name", sorted(SDK_CALLS))
def test_both_engines_answer_the_same_sdk_calls(client, gclient, name):
    ours, theirs = SDK_CALLS[name](gclient, F32), SDK_CALLS[name](client, "millm-tiny")
    assert _shape(ours) == _shape(theirs)
    assert ours.system_fingerprint.endswith(":gguf")
    assert theirs.system_fingerprint.endswith(":transformers")


def test_both_engines_stream_the_same_chat(client, gclient):
    def streamed(c, model):
        chunks = list(c.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Tell me a story."}],
            temperature=0, max_tokens=20, stream=True, stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        return text, chunks[-1].usage.completion_tokens, chunks[-1].usage.prompt_tokens

    assert streamed(gclient, F32) == streamed(client, "millm-tiny")


def test_capabilities_describe_the_gguf_engine(gguf, gclient):
    gclient.completions.create(model=F32, prompt="Hi", max_tokens=1)
    with urllib.request.urlopen(f"{gguf.base_url}/api/capabilities", timeout=10) as reply:
        caps = json.loads(reply.read())
    assert caps["engine"] == "gguf" and caps["model"] == F32
    assert caps["features"]["scoring"] is True and caps["features"]["structured_output"] is True
    honoured = {(f["field"], f["route"]): f["honoured"] for f in caps["fields"]}
    assert honoured[("seed", "chat")] and honoured[("echo", "completions")]
    assert honoured[("n", "chat")] and honoured[("response_format", "chat")]
    assert honoured[("structured_outputs", "completions")] and honoured[("grammar", "chat")]
    assert not honoured[("response_format", "completions")]


# -- generated bodies on the GGUF engine -------------------------------------------------------

GGUF_FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow,
                                            HealthCheck.function_scoped_fixture])


def _on_gguf(payload):
    if isinstance(payload, dict) and payload.get("model") == fuzz.MODEL:
        return {**payload, "model": F32}
    return payload


@GGUF_FUZZ
@given(payload=fuzz.CHAT_BODIES.map(_on_gguf), headers=fuzz.STRICT)
def test_generated_chat_bodies_never_get_a_5xx_on_gguf(gguf, payload, headers):
    fuzz.check(gguf, "/v1/chat/completions", payload, headers)


@GGUF_FUZZ
@given(payload=fuzz.COMPLETION_BODIES.map(_on_gguf), headers=fuzz.STRICT)
def test_generated_completion_bodies_never_get_a_5xx_on_gguf(gguf, payload, headers):
    fuzz.check(gguf, "/v1/completions", payload, headers)
