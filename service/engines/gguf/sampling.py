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

import ctypes
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

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


def row_sampler(options: SamplingOptions, n_vocab: int, banned: Iterable[int], seed: int,
                *, history: int):
    """A generating row's sampler: the chain, or for greedy decoding whose
    chain only bans tokens (no penalty, no logit_bias) GreedyArgmax in front
    of it."""
    banned = frozenset(int(token) for token in banned)
    chain = sampler_chain(options, n_vocab, banned, seed, history=history)
    if options.greedy and not options.penalised and not options.logit_bias:
        return GreedyArgmax(chain, n_vocab, banned)
    return chain


class GreedyArgmax:
    """The greedy chain's token without running the chain.

    llama_sampler_sample copies a row's logits into an n_vocab-entry candidate
    array before any sampler reads them: about 25 µs a token on the demo's
    8,101-token vocabulary in the serving process, a tenth of what a token
    costs there. When the chain only bans tokens and then takes the first
    largest logit, numpy's argmax over the row itself finds the same token
    (`pick`; where the largest is banned, as an end token under ignore_eos
    often is, on a copy with the bans written in). Where a NaN is the
    largest the chain decides, as before. Nothing is written to the logits."""

    def __init__(self, chain, n_vocab: int, banned: frozenset[int]):
        from llama_cpp.llama_cpp import llama_get_logits_ith

        self.chain, self.n_vocab, self.banned = chain, n_vocab, banned
        self._banned = np.fromiter(sorted(banned), dtype=np.int64, count=len(banned))
        self._logits_ith = llama_get_logits_ith
        self._row = ctypes.c_float * n_vocab
        self._view: tuple[int, np.ndarray] | None = None  # (address, the row over it)

    def pick(self, logits: np.ndarray) -> int | None:
        """The chain's token for `logits`, or None where only the chain can say."""
        token = int(logits.argmax())
        if token in self.banned:
            logits = logits.copy()
            logits[self._banned] = -np.inf
            token = int(logits.argmax())
        value = logits[token]
        return None if value != value else token

    def sample(self, ctx, index: int) -> int:
        address = ctypes.addressof(self._logits_ith(ctx.ctx, index).contents)
        if self._view is None or self._view[0] != address:
            self._view = (address, np.frombuffer(self._row.from_address(address),
                                                 dtype=np.float32))
        token = self.pick(self._view[1])
        return token if token is not None else self.chain.sample(ctx, index)
