"""Log-probabilities of generated text on the GGUF engine
(engines/gguf/logprobs.py): the same numbers as the transformers engine on
the F32 export, per row and per choice, streamed and not, in OpenAI's shape,
and from the distribution the token was really drawn from (after bans,
penalties and the grammar mask, before truncation).

A GGUF engine of its own on the F32 export serves these, with f32 generation
KV cells (MILLM_GGUF_KV_TYPE=f32, the exact setting); the transformers answers
they are compared with come from the session stack."""

from __future__ import annotations

import math
import re

import openai
import pytest

from tests import harness

F32, Q8 = "millm-tiny-gguf:F32", "millm-tiny-gguf:Q8_0"
# The scoring tests' tolerance (tests/test_gguf.py): with f32 cells the two
# engines differ only in summation order. (With llama.cpp's default f16 cells,
# as llama-server's, a log-probability moves by up to about 5e-3 here.)
TOLERANCE = 1e-4


def close(a: float, b: float) -> bool:
    return abs(a - b) < TOLERANCE
QUESTIONS = ["Tell me a story about the river.", "What does the miller do in the morning?"]


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    stack = harness.OwnStack(tmp_path_factory.mktemp("gguf-logprobs"), MILLM_MODEL=F32,
                             MILLM_GGUF_KV_TYPE="f32")
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def gclient(gguf):
    return openai.OpenAI(base_url=f"{gguf.base_url}/v1", api_key="unused", max_retries=0,
                         timeout=60)


def chat(c, model: str, question: str, **extra):
    return c.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                     max_tokens=12, temperature=0, logprobs=True, top_logprobs=2,
                                     **extra)


@pytest.mark.parametrize("question", QUESTIONS)
def test_generated_log_probabilities_equal_the_transformers_engine(client, gclient, question):
    ours, theirs = chat(gclient, F32, question), chat(client, "millm-tiny", question)
    assert ours.choices[0].message.content == theirs.choices[0].message.content
    a, b = ours.choices[0].logprobs.content, theirs.choices[0].logprobs.content
    assert len(a) == len(b) == ours.usage.completion_tokens
    for x, y in zip(a, b, strict=True):
        assert x.token == y.token and x.bytes == y.bytes
        assert close(x.logprob, y.logprob)
        if [t.token for t in x.top_logprobs] != [t.token for t in y.top_logprobs]:
            # Two alternatives close enough for the rounding to swap them.
            assert close(x.top_logprobs[0].logprob, x.top_logprobs[1].logprob)
            continue
        for t, u in zip(x.top_logprobs, y.top_logprobs, strict=True):
            assert close(t.logprob, u.logprob)


def test_the_quantized_export_answers_in_openais_shape(gclient):
    reply = chat(gclient, Q8, QUESTIONS[0])
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    text = reply.choices[0].message.content
    assert "".join(entry.token for entry in content).startswith(text)
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        # Greedy: the drawn token is the most probable one.
        assert math.isclose(entry.logprob, entry.top_logprobs[0].logprob, abs_tol=1e-6)


def test_streamed_entries_equal_the_whole_answer(gclient):
    whole = gclient.completions.create(model=F32, prompt="Once upon a time", max_tokens=10,
                                       temperature=0, logprobs=2)
    streamed = list(gclient.completions.create(model=F32, prompt="Once upon a time",
                                               max_tokens=10, temperature=0, logprobs=2,
                                               stream=True))
    tokens, values = [], []
    for chunk in streamed:
        for choice in chunk.choices:
            if choice.logprobs is not None:
                tokens += choice.logprobs.tokens
                values += choice.logprobs.token_logprobs
    assert tokens == whole.choices[0].logprobs.tokens
    assert values == pytest.approx(whole.choices[0].logprobs.token_logprobs, abs=1e-6)


def test_each_choice_has_its_own_entries(gclient):
    reply = gclient.chat.completions.create(
        model=F32, messages=[{"role": "user", "content": QUESTIONS[1]}], max_tokens=8,
        temperature=1.0, n=3, seed=7, logprobs=True, top_logprobs=1)
    assert len(reply.choices) == 3
    for choice in reply.choices:
        content = choice.logprobs.content
        assert "".join(e.token for e in content).startswith(choice.message.content)
        assert all(e.logprob <= 0 for e in content)


def test_a_penalised_draw_is_reported_from_the_penalised_distribution(gclient):
    """Greedy under a strong frequency penalty picks the best token after the
    penalty: reported without it, a repeated token's entry would show another
    token as more probable than the one drawn (the test can fail)."""
    reply = gclient.completions.create(model=F32, prompt="the the the the", max_tokens=24,
                                       temperature=0, frequency_penalty=2.0, logprobs=1)
    lp = reply.choices[0].logprobs
    for drawn, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert math.isclose(value, max(top.values()), abs_tol=1e-6), (drawn, top)
        assert drawn in top


def test_a_constrained_draw_is_reported_under_its_mask(gclient):
    """A choice under a regex: every reported alternative is a token the
    pattern allows, so the drawn token is the best of them."""
    reply = gclient.chat.completions.create(
        model=F32, messages=[{"role": "user", "content": QUESTIONS[0]}], max_tokens=48,
        temperature=0, logprobs=True, top_logprobs=1,
        extra_body={"structured_outputs": {"regex": "[a-z]{3,6}( [a-z]{3,6}){2}"}})
    content = reply.choices[0].logprobs.content
    assert content
    for entry in content:
        assert math.isclose(entry.logprob, entry.top_logprobs[0].logprob, abs_tol=1e-6)
        # (The end token's own entry has no text: it adds none.)
        assert entry.token in (entry.top_logprobs[0].token, "")
    assert re.fullmatch("[a-z]{3,6}( [a-z]{3,6}){2}", reply.choices[0].message.content)
