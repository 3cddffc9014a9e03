"""Unit tests of the logits pipeline: penalties and truncation, exact values."""

from __future__ import annotations

import math

import torch

from service.sampling import (
    SamplingOptions,
    UniformDraws,
    apply_penalties,
    choose_tokens,
    filter_logits,
)


def test_openai_frequency_and_presence_penalties_are_additive():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    counts = torch.tensor([[0.0, 1.0, 3.0]])
    seen = counts > 0
    out = apply_penalties(logits, [SamplingOptions(frequency_penalty=0.5, presence_penalty=0.25)],
                          counts, seen)
    assert torch.allclose(out, torch.tensor([[1.0, 2.0 - 0.5 - 0.25, 3.0 - 1.5 - 0.25]]))


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    logits = torch.tensor([[2.0, -2.0, 2.0]])
    seen = torch.tensor([[True, True, False]])
    out = apply_penalties(logits, [SamplingOptions(repetition_penalty=2.0)],
                          torch.zeros_like(logits), seen)
    assert torch.allclose(out, torch.tensor([[1.0, -4.0, 2.0]]))


def test_top_k_keeps_k_tokens():
    out = filter_logits(torch.tensor([1.0, 4.0, 3.0, 2.0]), SamplingOptions(top_k=2))
    assert torch.isinf(out[[0, 3]]).all() and torch.isfinite(out[[1, 2]]).all()


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    out = filter_logits(probs.log(), SamplingOptions(top_p=0.8))
    assert torch.isfinite(out[:2]).all() and torch.isinf(out[2:]).all()
    # The most likely token survives even a tiny top_p.
    out = filter_logits(probs.log(), SamplingOptions(top_p=1e-6))
    assert torch.isfinite(out[0]) and torch.isinf(out[1:]).all()


def test_min_p_is_relative_to_the_top_token():
    probs = torch.tensor([0.6, 0.3, 0.1])
    out = filter_logits(probs.log(), SamplingOptions(min_p=0.4))
    assert torch.isfinite(out[:2]).all() and torch.isinf(out[2])


def test_temperature_scales_logits():
    out = filter_logits(torch.tensor([1.0, 2.0]), SamplingOptions(temperature=0.5))
    assert torch.allclose(out, torch.tensor([2.0, 4.0]))


def test_greedy_rows_and_seeded_rows():
    logits = torch.tensor([[0.0, 5.0, 1.0], [1.0, 1.0, 1.0]])
    options = [SamplingOptions(temperature=0.0), SamplingOptions()]

    def draw(seed):
        gens = [UniformDraws(torch.Generator().manual_seed(0)),
                UniformDraws(torch.Generator().manual_seed(seed))]
        return [choose_tokens(logits, options, gens)[1] for _ in range(1)] + [
            choose_tokens(logits, options, gens)[1] for _ in range(20)
        ]

    assert choose_tokens(logits, options, [UniformDraws(torch.Generator())] * 2)[0] == 1
    assert draw(7) == draw(7)
    assert draw(7) != draw(8)
    assert not math.isnan(sum(draw(7)))


def test_penalties_apply_to_their_own_rows():
    logits = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    counts = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    out = apply_penalties(logits, [SamplingOptions(), SamplingOptions(frequency_penalty=1.0)],
                          counts, counts > 0)
    assert torch.allclose(out, torch.tensor([[1.0, 1.0], [0.0, 1.0]]))


def test_sampling_follows_the_distribution_and_never_picks_masked_tokens():
    probs = torch.tensor([0.5, 0.3, 0.2, 0.0])
    logits = probs.log().unsqueeze(0)  # the masked token is -inf
    generator = UniformDraws(torch.Generator().manual_seed(123))
    draws = [choose_tokens(logits.clone(), [SamplingOptions()], [generator])[0]
             for _ in range(4000)]
    freq = torch.bincount(torch.tensor(draws), minlength=4).float() / len(draws)
    assert freq[3] == 0
    assert torch.allclose(freq[:3], probs[:3], atol=0.03)


def test_rows_filter_with_their_own_options():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0], [1.0, 4.0, 3.0, 2.0]])
    from service.sampling import filter_rows

    out = filter_rows(logits, [SamplingOptions(top_k=1), SamplingOptions()])
    assert torch.isinf(out[0]).sum() == 3 and torch.isfinite(out[1]).all()


def test_uniform_draws_are_the_generators_own_sequence():
    draws = UniformDraws(torch.Generator().manual_seed(9))
    reference = torch.Generator().manual_seed(9)
    for _ in range(3 * UniformDraws.BLOCK + 5):  # across block refills
        assert draws.next() == torch.rand((), generator=reference).item()


def test_the_two_level_inverse_cdf_agrees_with_a_whole_cumulative_sum():
    from service.sampling import inverse_cdf

    generator = torch.Generator().manual_seed(4)
    vocab = 1000  # not a multiple of the block: the last block is padded
    probs = torch.softmax(torch.randn(32, vocab, generator=generator) * 3, dim=-1)
    probs[:, 64:128] = 0.0  # a whole block without mass
    probs[:, 5::7] = 0.0  # and scattered masked tokens
    points = torch.rand(32, generator=generator).tolist()
    cdf = torch.cumsum(probs.double(), dim=-1)
    expected = torch.searchsorted(
        cdf, (torch.tensor(points, dtype=torch.float64) * cdf[:, -1]).unsqueeze(1),
        right=True).squeeze(1).tolist()
    assert inverse_cdf(probs, points) == expected
    assert inverse_cdf(probs[:1], points[:1]) == expected[:1]  # one row: one level


def test_the_inverse_cdf_never_picks_a_token_without_mass():
    from service.sampling import inverse_cdf

    probs = torch.zeros(3, 200)
    probs[0, 10] = 1.0  # one token holds everything
    probs[1, [3, 70, 150]] = torch.tensor([0.2, 0.3, 0.5])  # the last block's tail is empty
    probs[2, 199] = 1e-30  # a vanishing token at the very end
    probs[2, 0] = 1.0
    for point in (0.0, 0.5, 0.999999, 1.0 - 2 ** -24):
        chosen = inverse_cdf(probs, [point] * 3)
        assert all(probs[row, token] > 0 for row, token in enumerate(chosen)), (point, chosen)
        for row in range(3):  # and one row at a time (the one-level path)
            token = inverse_cdf(probs[row:row + 1], [point])[0]
            assert probs[row, token] > 0, (point, row, token)
    assert inverse_cdf(probs, [0.999999] * 3)[:2] == [10, 150]
    # A target that rounding took to the total (a point of 1 forces it): still a
    # token with mass, though the blocks after it have none.
    assert all(probs[row, token] > 0
               for row, token in enumerate(inverse_cdf(probs, [1.0] * 3)))


def test_argmax_rows_takes_the_first_of_equal_maxima_like_torch():
    from service.sampling import argmax_rows

    logits = torch.tensor([[1.0, 3.0, 3.0], [float("-inf"), 0.0, float("-inf")], [2.0, 2.0, 2.0]])
    assert argmax_rows(logits) == torch.argmax(logits, dim=-1).tolist() == [1, 1, 0]
