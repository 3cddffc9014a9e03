"""The GGUF engine's greedy rows pick their token with numpy's argmax
(engines/gguf/sampling.GreedyArgmax) where the sampler chain would only ban
tokens and take the first largest logit: the same token as the real chain,
run through llama.cpp's C API on the same logits, whenever it answers (a
banned maximum included), and no answer (the chain decides) where the largest
is NaN. No model."""

from __future__ import annotations

import numpy as np
import pytest
from llama_cpp._internals import LlamaSampler

from service.engines.gguf.sampling import GreedyArgmax, row_sampler
from service.sampling import SamplingOptions
from tests.test_sampler_order import apply

N_VOCAB = 64
GREEDY = SamplingOptions(temperature=0.0)


def chain_token(logits: np.ndarray, banned: tuple[int, ...]) -> int:
    _, drawn = apply(row_sampler(GREEDY, N_VOCAB, banned, 0, history=N_VOCAB).chain, logits)
    return drawn


def rows():
    rng = np.random.default_rng(7)
    for _ in range(200):
        yield rng.normal(0.0, 2.0, N_VOCAB).astype(np.float32)
    tied = np.zeros(N_VOCAB, dtype=np.float32)
    tied[[9, 30, 41]] = 3.0  # the first of equal maxima
    yield tied
    yield np.full(N_VOCAB, -np.inf, dtype=np.float32)  # a grammar that allows nothing
    masked = np.full(N_VOCAB, -np.inf, dtype=np.float32)
    masked[[12, 50]] = [0.5, 1.5]  # a grammar mask's -inf everywhere else
    yield masked


@pytest.mark.parametrize("banned", [(), (2,), (0, 1, 2, 63)])
def test_argmax_answers_what_the_chain_draws(banned):
    pick = row_sampler(GREEDY, N_VOCAB, banned, 0, history=N_VOCAB)
    assert isinstance(pick, GreedyArgmax)
    answered = 0
    for logits in rows():
        token = pick.pick(logits)
        if token is not None:
            answered += 1
            assert token == chain_token(logits, banned)
            assert token not in banned or not np.isfinite(logits).any()
    assert answered == 203


def test_a_banned_maximum_gives_the_next_and_a_nan_is_left_to_the_chain():
    logits = np.linspace(-1.0, 1.0, N_VOCAB, dtype=np.float32)
    top = N_VOCAB - 1
    pick = row_sampler(GREEDY, N_VOCAB, (top, top - 1), 0, history=N_VOCAB)
    assert pick.pick(logits) == chain_token(logits, (top, top - 1)) == top - 2
    assert logits[top] == 1.0  # the row itself is left as it was
    with_nan = logits.copy()
    with_nan[5] = np.nan
    assert row_sampler(GREEDY, N_VOCAB, (), 0, history=N_VOCAB).pick(with_nan) is None


@pytest.mark.parametrize("options", [
    SamplingOptions(temperature=0.7),
    SamplingOptions(temperature=0.0, repetition_penalty=1.2),
    SamplingOptions(temperature=0.0, presence_penalty=0.5),
    SamplingOptions(temperature=0.0, logit_bias=((3, 5.0),)),
])
def test_anything_beyond_bans_keeps_the_chain(options):
    assert isinstance(row_sampler(options, N_VOCAB, (1,), 0, history=N_VOCAB), LlamaSampler)
