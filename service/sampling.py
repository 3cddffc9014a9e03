"""Turning one decode step's logits into next tokens, one row per choice.

Each row carries its own options and its own torch.Generator, so rows that
share a forward pass never share randomness: a seeded row draws the same
numbers whatever else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


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


def filter_logits(logits: torch.Tensor, options: SamplingOptions) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p truncation (1-D logits)."""
    logits = logits / options.temperature
    if options.top_k > 0 and options.top_k < logits.shape[-1]:
        kth = torch.topk(logits, options.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if options.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token once the mass before it already reaches top_p; the most
        # likely token always stays.
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= options.top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if options.min_p > 0.0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < options.min_p * probs.max(), float("-inf"))
    return logits


def choose_tokens(
    logits: torch.Tensor,
    options: list[SamplingOptions],
    generators: list[torch.Generator],
) -> list[int]:
    """One next token per row of `logits` [rows, vocab] (already penalised and masked).

    Greedy rows share one argmax; a sampled row draws from its own generator.
    """
    tokens = torch.argmax(logits, dim=-1).tolist()
    for row, opts in enumerate(options):
        if not opts.greedy:
            probs = torch.softmax(filter_logits(logits[row], opts), dim=-1)
            tokens[row] = int(torch.multinomial(probs, 1, generator=generators[row]))
    return tokens
