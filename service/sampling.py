"""Turning one decode step's logits into next tokens, one row per choice.

Each row carries its own options and its own torch.Generator, so rows that
share a forward pass never share randomness: a seeded row draws the same
numbers whatever else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class SamplingOptions:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # OpenAI's logit_bias: (token id, value) pairs added to the logits.
    logit_bias: tuple[tuple[int, float], ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        """Whether any repeat penalty applies (then an engine tracks which
        tokens the row has seen and generated; otherwise it need not)."""
        return (self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
                or self.repetition_penalty != 1.0)


def apply_penalties(
    logits: torch.Tensor,
    options: list[SamplingOptions],
    output_counts: torch.Tensor,
    seen: torch.Tensor,
) -> torch.Tensor:
    """Penalise repeats, each row with its own options.

    `output_counts` [rows, vocab] counts each token among the generated ones
    (OpenAI's frequency/presence penalties look only at the completion);
    `seen` marks tokens in prompt or output (the multiplicative repetition
    penalty, as in CTRL and transformers, looks at both).
    """

    def column(name: str) -> torch.Tensor:
        values = [getattr(o, name) for o in options]
        return torch.tensor(values, dtype=logits.dtype, device=logits.device).unsqueeze(1)

    if any(o.repetition_penalty != 1.0 for o in options):
        penalty = column("repetition_penalty")
        penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(seen, penalised, logits)
    if any(o.frequency_penalty != 0.0 or o.presence_penalty != 0.0 for o in options):
        logits = (
            logits
            - column("frequency_penalty") * output_counts
            - column("presence_penalty") * (output_counts > 0).to(logits.dtype)
        )
    return logits


def add_logit_bias(logits: torch.Tensor, options: list[SamplingOptions]) -> torch.Tensor:
    """Each row's logit_bias added to its logits (a new tensor when any row
    has one; `logits` itself, untouched, otherwise). A token already at -inf
    (banned, or masked by a grammar) stays there whatever its bias."""
    if not any(o.logit_bias for o in options):
        return logits
    biased = logits.clone()
    for row, opts in enumerate(options):
        if opts.logit_bias:
            ids = torch.tensor([t for t, _ in opts.logit_bias], dtype=torch.long,
                               device=logits.device)
            values = torch.tensor([v for _, v in opts.logit_bias], dtype=logits.dtype,
                                  device=logits.device)
            biased[row, ids] += values
    return biased


def filter_rows(logits: torch.Tensor, options: list[SamplingOptions]) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p truncation, each row with its
    own options (logits [rows, vocab]); truncated tokens become -inf."""

    def column(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=logits.dtype, device=logits.device).unsqueeze(1)

    vocab = logits.shape[-1]
    temperatures = [o.temperature for o in options]
    if any(t != 1.0 for t in temperatures):
        logits = logits / column(temperatures)
    elif any(0 < o.top_k < vocab for o in options):
        logits = logits.clone()  # top-k writes in place: never into the caller's logits
    for row, opts in enumerate(options):
        if 0 < opts.top_k < vocab:
            kth = torch.topk(logits[row], opts.top_k).values[-1]
            logits[row] = logits[row].masked_fill(logits[row] < kth, float("-inf"))
    if any(o.top_p < 1.0 for o in options):
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token once the mass before it already reaches top_p; the most
        # likely token always stays. Rows without top_p get a bound never reached.
        top_p = column([o.top_p if o.top_p < 1.0 else 2.0 for o in options])
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if any(o.min_p > 0.0 for o in options):
        probs = torch.softmax(logits, dim=-1)
        floor = column([o.min_p for o in options]) * probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(probs < floor, float("-inf"))
    return logits


def filter_logits(logits: torch.Tensor, options: SamplingOptions) -> torch.Tensor:
    """filter_rows for one row of 1-D logits."""
    return filter_rows(logits.unsqueeze(0), [options])[0]


class UniformDraws:
    """One row's uniform numbers in [0, 1): its generator's own sequence, drawn
    BLOCK at a time (torch fills a tensor from a CPU generator in order, so the
    numbers are the ones a draw per token would give), because a torch call
    per row per step costs more than the draw."""

    BLOCK = 64

    def __init__(self, generator: torch.Generator):
        self.generator = generator
        self._left: list[float] = []

    def next(self) -> float:
        if not self._left:
            block = torch.rand((self.BLOCK,), generator=self.generator,
                               device=self.generator.device)
            self._left = block.tolist()[::-1]
        return self._left.pop()


def argmax_rows(logits: torch.Tensor) -> list[int]:
    """Each row's first highest-scoring index. On a CPU, numpy's vectorised
    argmax is about ten times torch's on a [16, vocab] float32 block."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return logits.detach().numpy().argmax(axis=-1).tolist()
    return torch.argmax(logits, dim=-1).tolist()


# Tokens per block of the two-level inverse CDF (inverse_cdf).
CDF_BLOCK = 64


def inverse_cdf(probs: torch.Tensor, points: list[float]) -> list[int]:
    """For each row of `probs` [rows, vocab] (not necessarily normalised), the
    first token where its cumulative mass exceeds points[row] times the row's
    total. A zero-probability token is never chosen: its step in the
    cumulative sum is zero, so the search passes over it.

    One row, or a device other than the CPU: one cumulative sum over the
    vocabulary, in double precision so that a draw just under 1 still targets
    less than the total. Several rows on a CPU: in numpy and in two levels,
    because a cumulative sum over every row's whole vocabulary is sequential
    and slow there (about 1 ns a token) and a torch call costs several
    microseconds on tensors this small. The sums of blocks of CDF_BLOCK
    tokens find the block; a cumulative sum within that one block finds the
    token.
    """
    rows, vocab = probs.shape
    if probs.device.type != "cpu" or rows == 1:
        cdf = torch.cumsum(probs, dim=-1, dtype=torch.float64)
        targets = torch.tensor(points, dtype=torch.float64, device=probs.device) * cdf[:, -1]
        chosen = torch.searchsorted(cdf, targets.unsqueeze(1), right=True).squeeze(1)
        return torch.clamp(chosen, max=vocab - 1).tolist()
    p = probs.detach().numpy()
    full = vocab // CDF_BLOCK
    # A product with ones: BLAS sums the blocks several times faster than .sum().
    sums = p[:, :full * CDF_BLOCK].reshape(rows, full, CDF_BLOCK) @ np.ones(CDF_BLOCK, p.dtype)
    if full * CDF_BLOCK < vocab:
        sums = np.concatenate([sums, p[:, full * CDF_BLOCK:].sum(axis=-1, keepdims=True)], 1)
    block_cdf = np.cumsum(sums, axis=-1)
    targets = np.asarray(points, dtype=p.dtype) * block_cdf[:, -1]
    # searchsorted(right=True) per row: how many cumulative sums are <= the target.
    # Rounding can put the target at the total: then the last block with mass.
    last_block = sums.shape[1] - 1 - np.argmax(sums[:, ::-1] > 0, axis=-1)
    block = np.minimum((block_cdf <= targets[:, None]).sum(axis=-1), last_block)
    before = np.where(block > 0, block_cdf[np.arange(rows), np.maximum(block - 1, 0)], 0)
    columns = block[:, None] * CDF_BLOCK + np.arange(CDF_BLOCK)
    inside = columns < vocab
    chosen = np.where(inside, p[np.arange(rows)[:, None], np.minimum(columns, vocab - 1)], 0)
    inner = (np.cumsum(chosen, axis=-1) <= (targets - before)[:, None]).sum(axis=-1)
    # Rounding (block sums and in-block sums differ in their last bits) can
    # put the target past the block's end: take the block's last token that
    # has mass then, never a masked or padding one.
    last = CDF_BLOCK - 1 - np.argmax(chosen[:, ::-1] > 0, axis=-1)
    return (block * CDF_BLOCK + np.minimum(inner, last)).tolist()


def choose_tokens(
    logits: torch.Tensor,
    options: list[SamplingOptions],
    draws: list[UniformDraws],
) -> list[int]:
    """One next token per row of `logits` [rows, vocab] (already penalised and masked).

    Greedy rows take the argmax. Sampled rows are filtered together, then each
    takes the next uniform number of its own sequence and the token where that
    number falls in its cumulative distribution (inverse-CDF sampling: the same
    distribution as torch.multinomial, at a fraction of its cost per row). A
    zero-probability token can never be chosen.
    """
    sampled = [row for row, opts in enumerate(options) if not opts.greedy]
    if len(sampled) < len(options):
        tokens = argmax_rows(logits)
        if not sampled:
            return tokens
        index = torch.tensor(sampled, dtype=torch.long, device=logits.device)
        logits = logits[index]
    else:
        tokens = [0] * len(options)  # every row samples: no argmax to take
    probs = torch.softmax(filter_rows(logits, [options[r] for r in sampled]), dim=-1)
    chosen = inverse_cdf(probs, [draws[r].next() for r in sampled])
    for row, token in zip(sampled, chosen, strict=True):
        tokens[row] = token
    return tokens
