"""Both engines keep the same candidate tokens for the same sampling options.

The transformers engine scales by the temperature before it truncates
(service.sampling.filter_logits); the GGUF engine's llama.cpp chain
(service.engines.gguf.sampling.sampler_chain) must do the same, or top-p and
min-p see another distribution and a request's possible tokens depend on the
engine. Each case applies the engine's real chain, stopped before the draw,
to one fixed logits vector through llama.cpp's C API, and compares the tokens
left with the finite entries of filter_logits. The order the GGUF engine used
before (truncation, then temperature) is built here too, to show the cases
it got wrong. No model is loaded.
"""

from __future__ import annotations

import ctypes
import itertools

import numpy as np
import pytest
import torch
from llama_cpp import llama_cpp as lib
from llama_cpp._internals import LlamaSampler

from service.engines.gguf.sampling import sampler_chain
from service.sampling import SamplingOptions, add_logit_bias, apply_penalties, filter_logits

N_VOCAB = 64
# A fixed distribution: a few likely tokens and a long tail, in no id order.
LOGITS = np.random.default_rng(20240611).normal(0.0, 2.0, N_VOCAB).astype(np.float32)
TOP = int(np.argmax(LOGITS))

TEMPERATURES = (0.5, 1.0, 1.7)
TRUNCATIONS = (
    {"top_p": 0.5},
    {"top_p": 0.9},
    {"top_k": 10},
    {"min_p": 0.1},
    {"min_p": 0.3},
    {"top_k": 20, "top_p": 0.8},
    {"top_p": 0.9, "min_p": 0.05},
    {"top_k": 12, "top_p": 0.7, "min_p": 0.2},
)
CASES = [SamplingOptions(temperature=t, **cut)
         for t, cut in itertools.product(TEMPERATURES, TRUNCATIONS)]
# Where truncating before the temperature keeps other tokens (checked below).
OLD_ORDER_DIFFERS = {
    (0.5, "top_p=0.5"), (0.5, "top_p=0.9"), (0.5, "min_p=0.1"), (0.5, "min_p=0.3"),
    (0.5, "top_k=20 top_p=0.8"), (0.5, "top_p=0.9 min_p=0.05"),
    (0.5, "top_k=12 top_p=0.7 min_p=0.2"),
    (1.7, "top_p=0.5"), (1.7, "top_p=0.9"), (1.7, "min_p=0.1"), (1.7, "min_p=0.3"),
    (1.7, "top_k=20 top_p=0.8"), (1.7, "top_p=0.9 min_p=0.05"),
    (1.7, "top_k=12 top_p=0.7 min_p=0.2"),
}


def case_id(options: SamplingOptions) -> tuple[float, str]:
    parts = [f"{name}={getattr(options, name)}" for name in ("top_k", "top_p", "min_p")
             if getattr(options, name) != getattr(SamplingOptions(), name)]
    return options.temperature, " ".join(parts)


def apply(sampler: LlamaSampler, logits: np.ndarray) -> tuple[set[int], int | None]:
    """Run the chain over a llama_token_data_array holding `logits`: the token
    ids left (llama.cpp truncates by shrinking `size`, bans by a -inf logit)
    and the drawn token, if the chain drew one."""
    data = (lib.llama_token_data * len(logits))(
        *(lib.llama_token_data(i, float(x), 0.0) for i, x in enumerate(logits)))
    array = lib.llama_token_data_array(data, len(logits), -1, False)
    lib.llama_sampler_apply(sampler.sampler, ctypes.byref(array))
    kept = {data[i].id for i in range(array.size) if np.isfinite(data[i].logit)}
    drawn = data[array.selected].id if array.selected >= 0 else None
    return kept, drawn


def transformers_kept(logits: np.ndarray, options: SamplingOptions,
                      banned: tuple[int, ...] = ()) -> set[int]:
    row = torch.from_numpy(logits.copy())
    row[list(banned)] = float("-inf")
    return set(torch.isfinite(filter_logits(row, options)).nonzero().flatten().tolist())


def old_order_chain(options: SamplingOptions) -> LlamaSampler:
    """The GGUF engine's chain before: truncation, then temperature."""
    sampler = LlamaSampler()
    if options.top_k:
        sampler.add_top_k(options.top_k)
    if options.top_p < 1.0:
        sampler.add_top_p(options.top_p, 1)
    if options.min_p > 0.0:
        sampler.add_min_p(options.min_p, 1)
    sampler.add_temp(options.temperature)
    return sampler


def chain(options: SamplingOptions, banned=(), draw=False, seed=0) -> LlamaSampler:
    return sampler_chain(options, N_VOCAB, banned, seed, history=N_VOCAB, draw=draw)


@pytest.mark.parametrize("options", CASES, ids=lambda o: "t={} {}".format(*case_id(o)))
def test_same_candidates_as_transformers(options):
    expected = transformers_kept(LOGITS, options)
    assert 1 <= len(expected) < N_VOCAB  # every case truncates something
    kept, drawn = apply(chain(options), LOGITS)
    assert drawn is None
    assert kept == expected


def test_old_order_kept_other_tokens():
    """The cases the previous chain got wrong: every one with a temperature
    other than 1 and a top-p or min-p bound (top-k alone ignores scaling)."""
    differs = {case_id(o) for o in CASES
               if apply(old_order_chain(o), LOGITS)[0] != transformers_kept(LOGITS, o)}
    assert differs == OLD_ORDER_DIFFERS
    assert (1.7, "top_p=0.5") in differs


def test_banned_tokens_never_kept():
    banned = (TOP, 5)
    for options in CASES:
        kept, _ = apply(chain(options, banned), LOGITS)
        assert kept == transformers_kept(LOGITS, options, banned)
        assert not kept & set(banned)


def test_penalties_come_before_temperature():
    options = SamplingOptions(temperature=1.7, top_p=0.6, min_p=0.1, repetition_penalty=1.3,
                              frequency_penalty=0.4, presence_penalty=0.2)
    generated = [TOP, TOP, int(np.argsort(LOGITS)[-2])]
    sampler = chain(options)
    for token in generated:
        lib.llama_sampler_accept(sampler.sampler, token)
    counts = torch.zeros(1, N_VOCAB)
    for token in generated:
        counts[0, token] += 1
    penalised = apply_penalties(torch.from_numpy(LOGITS.copy()).unsqueeze(0), [options],
                                counts, counts > 0)[0]
    kept, _ = apply(sampler, LOGITS)
    assert kept == transformers_kept(penalised.numpy(), options)
    assert kept != transformers_kept(LOGITS, options)  # the penalties changed something


def test_draws_stay_among_the_candidates():
    options = SamplingOptions(temperature=1.7, top_k=12, top_p=0.7)
    expected = transformers_kept(LOGITS, options)
    sampler = chain(options, draw=True, seed=1234)
    drawn = {apply(sampler, LOGITS)[1] for _ in range(300)}
    assert drawn <= expected
    assert len(drawn) > 1


def test_temperature_zero_is_greedy():
    options = SamplingOptions(temperature=0.0, top_k=3, top_p=0.5, min_p=0.5)
    # No truncation before the greedy pick (as choose_tokens): only the bans.
    kept, drawn = apply(chain(options), LOGITS)
    assert kept == set(range(N_VOCAB)) and drawn is None
    assert apply(chain(options, draw=True), LOGITS)[1] == TOP
    second = int(np.argsort(LOGITS)[-2])
    assert apply(chain(options, banned=(TOP,), draw=True), LOGITS)[1] == second


def test_logit_bias_follows_the_penalties_on_both_engines():
    """The request's logit_bias is added after the repetition penalty (it is
    multiplicative, so the order shows) and before temperature and
    truncation; a banned token stays banned whatever its bias."""
    second, low = int(np.argsort(LOGITS)[-2]), int(np.argsort(LOGITS)[3])
    options = SamplingOptions(temperature=1.3, top_p=0.6, repetition_penalty=1.5,
                              logit_bias=((second, 2.5), (low, 9.0), (5, 50.0)))
    generated = [second, low]
    sampler = sampler_chain(options, N_VOCAB, (5,), 0, history=N_VOCAB, draw=False)
    for token in generated:
        lib.llama_sampler_accept(sampler.sampler, token)
    counts = torch.zeros(1, N_VOCAB)
    for token in generated:
        counts[0, token] += 1
    row = apply_penalties(torch.from_numpy(LOGITS.copy()).unsqueeze(0), [options], counts,
                          counts > 0)
    row[0, 5] = float("-inf")
    biased = add_logit_bias(row, [options])[0]
    kept, _ = apply(sampler, LOGITS)
    assert kept == set(torch.isfinite(filter_logits(biased, options)).nonzero().flatten().tolist())
    assert low in kept and 5 not in kept
    # Biasing before the penalty would keep another set of tokens.
    early = LOGITS.copy()
    for token, value in options.logit_bias:
        early[token] += value
    early_row = apply_penalties(torch.from_numpy(early).unsqueeze(0), [options], counts,
                                counts > 0)[0]
    early_row[5] = float("-inf")
    assert kept != set(torch.isfinite(filter_logits(early_row, options)).nonzero().flatten()
                       .tolist())
