"""The GGUF engine's llama.cpp sampler chain, in the transformers engine's order.

A request must keep the same candidate tokens whichever engine serves it, so
the chain follows service.sampling: bans and penalties, then the request's
logit_bias, then temperature, then top-k, top-p and min-p truncation, then
the draw. (llama.cpp's own
default chain truncates before the temperature; while this engine followed
it, top-p and min-p saw the unscaled distribution, and at temperature 1.7
with top_p 0.5 the two engines kept different tokens.)

The chain is built here, apart from a loaded model, so a test can apply it to
a logits vector of its own (draw=False stops before the draw).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # service.sampling imports torch, which this module never needs
    from service.sampling import SamplingOptions


def sampler_chain(options: SamplingOptions, n_vocab: int, banned: Iterable[int], seed: int,
                  *, history: int, draw: bool = True):
    """A llama-cpp-python LlamaSampler for one generation.

    `banned` tokens get a -inf logit bias (control tokens, and the end tokens
    under ignore_eos); the request's own logit_bias follows the penalties.
    The penalties look at the last `history` tokens the chain has accepted
    (llama_sampler_sample accepts each one it picks).
    Temperature 0 draws greedily from the penalised logits, with no
    truncation, as service.sampling.choose_tokens does; otherwise the logits
    are divided by the temperature and then truncated (llama.cpp's temp
    sampler only scales when temp > 0, its top-k/top-p/min-p samplers shrink
    the candidate array; min_keep 1 matches the transformers rule that the
    most likely token always stays). Without `draw` the chain stops there.
    """
    from llama_cpp._internals import LlamaSampler

    sampler = LlamaSampler()
    bias = {int(token): float("-inf") for token in banned}
    if bias:
        sampler.add_logit_bias(n_vocab, bias)
    if options.penalised:
        sampler.add_penalties(n_vocab=n_vocab, penalty_last_n=history,
                              penalty_repeat=options.repetition_penalty,
                              penalty_freq=options.frequency_penalty,
                              penalty_present=options.presence_penalty)
    if options.logit_bias:
        # After the penalties, as service.sampling adds it; a banned token's
        # -inf stays -inf.
        sampler.add_logit_bias(n_vocab, dict(options.logit_bias))
    if options.greedy:
        if draw:
            sampler.add_greedy()
        return sampler
    sampler.add_temp(options.temperature)
    if options.top_k:
        sampler.add_top_k(options.top_k)
    if options.top_p < 1.0:
        sampler.add_top_p(options.top_p, 1)
    if options.min_p > 0.0:
        sampler.add_min_p(options.min_p, 1)
    if draw:
        sampler.add_dist(seed)
    return sampler
