"""Log-probabilities from logits, the same way on every engine.

Both engines hand this module a prompt's logits (the transformers engine from
its forward pass, the GGUF engine from llama.cpp's scoring context) and get
back the same `ScoredPrompt`, so scoring, echo and their refusals of non-finite
values cannot drift apart between engines. Nothing here runs the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from service.errors import EngineError


@dataclass(frozen=True)
class TokenTable:
    """The text of a model's tokens: bytes per id when the tokenizer is
    byte-level, else a tokenizer to decode with."""

    size: int  # ids that decode (the logits may have more columns)
    token_bytes: list[bytes] | None = None
    decoder: object = None

    def bytes_of(self, token_id: int) -> bytes:
        if self.token_bytes is not None:
            return self.token_bytes[token_id]
        return self.decoder.decode([token_id]).encode()


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    text: str
    bytes: bytes
    logprob: float | None


@dataclass(frozen=True)
class TokenScore:
    token: TokenLogprob
    top: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class ScoredPrompt:
    prompt_tokens: tuple[TokenScore, ...]  # echo only: one per prompt token
    next: TokenScore | None  # the most probable (allowed) next token


def entry(tokens: TokenTable, token_id: int, logprob: float | None) -> TokenLogprob:
    raw = tokens.bytes_of(token_id)
    return TokenLogprob(token_id, raw.decode("utf-8", errors="replace"), raw, logprob)


def non_finite() -> EngineError:
    return EngineError("non_finite_logits", "The model produced NaN or infinite logits where "
                       "they reach the answer; nothing can be reported.")


def scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits if temperature == 0 else logits / temperature


def drawn_score(tokens: TokenTable, logits: torch.Tensor, token: int, top: int) -> TokenScore:
    """A generated token's log-probability in the distribution it was drawn
    from (`logits` after penalties, masks and temperature, before top-p,
    top-k and min-p truncation), with the `top` most likely alternatives: how
    both engines report generated text."""
    lp = torch.log_softmax(logits, dim=-1)
    alternatives = ()
    if top:
        best = torch.topk(lp, top)
        alternatives = tuple(entry(tokens, int(j), float(v))
                             for v, j in zip(best.values, best.indices, strict=True))
    return TokenScore(entry(tokens, token, float(lp[token])), alternatives)


def score_position(tokens: TokenTable, logits: torch.Tensor, allowed: torch.Tensor | None,
                   top: int, chosen: int | None = None) -> TokenScore:
    """One position: normalise over the candidates (the allowed ids, or every
    decodable id), and report `chosen` (default: the most probable candidate)
    with the `top` most likely alternatives."""
    candidates = allowed if allowed is not None else torch.arange(tokens.size,
                                                                 device=logits.device)
    values = logits[candidates]
    if torch.isnan(values).any() or torch.isposinf(values).any():
        raise non_finite()
    logprobs = torch.log_softmax(values, dim=-1)
    if chosen is None:
        position = int(torch.argmax(logprobs))
        chosen = int(candidates[position])
    else:
        matches = (candidates == chosen).nonzero()
        position = int(matches[0]) if len(matches) else None
    chosen_lp = float(logprobs[position]) if position is not None else float("-inf")
    if math.isinf(chosen_lp):
        raise non_finite()  # a reported token at -inf has no meaningful answer
    k = min(top, len(candidates))
    alternatives = ()
    if k:
        best = torch.topk(logprobs, k)
        alternatives = tuple(entry(tokens, int(candidates[i]), float(v))
                             for v, i in zip(best.values, best.indices, strict=True))
        if any(math.isinf(a.logprob) for a in alternatives):
            raise non_finite()
    return TokenScore(entry(tokens, chosen, chosen_lp), alternatives)


def score_logits(tokens: TokenTable, ids: list[int], logits: torch.Tensor, *,
                 temperature: float, allowed: list[int] | None, top: int, echo: bool,
                 next_token: bool) -> ScoredPrompt:
    """A prompt's scores from its logits: row p predicts token p + 1 (with
    echo every row is there; otherwise at least the last one). Echo entry p
    comes from row p - 1, the next token from the last row."""
    logits = scaled(logits.float(), temperature)
    allowed_ids = (torch.tensor(allowed, dtype=torch.long, device=logits.device)
                   if allowed is not None else None)
    prompt_scores: tuple[TokenScore, ...] = ()
    if echo:
        first = TokenScore(entry(tokens, ids[0], None))
        prompt_scores = (first, *(
            score_position(tokens, logits[p - 1], None, top, chosen=ids[p])
            for p in range(1, len(ids))))
    nxt = score_position(tokens, logits[-1], allowed_ids, top) if next_token else None
    return ScoredPrompt(prompt_scores, nxt)


IMPOSSIBLE = -9999.0


@dataclass(frozen=True)
class StepDivergence:
    """One generated token read under two steering plans (steering_compare)."""

    token_id: int
    text: str
    logprob: float  # under the request's steering
    unsteered_logprob: float
    kl: float  # KL(steered || unsteered) of the next-token distributions, nats


def divergence(tokens: TokenTable, ids: list[int], start: int, steered: torch.Tensor,
               plain: torch.Tensor) -> list[StepDivergence]:
    """ids[start:] were generated after ids[:start]; `steered` and `plain`
    hold the logits of rows start - 1 .. len(ids) - 2 (each predicting the
    next id) under the two plans. Temperature 1, every decodable id."""
    a = torch.log_softmax(steered[:, :tokens.size].float(), dim=-1)
    b = torch.log_softmax(plain[:, :tokens.size].float(), dim=-1)
    if not (torch.isfinite(a).any(dim=-1).all() and torch.isfinite(b).any(dim=-1).all()):
        raise non_finite()
    generated = torch.tensor(ids[start:], dtype=torch.long, device=a.device)
    rows = torch.arange(len(generated), device=a.device)
    # Terms where the steered probability is 0 add nothing (0 · log 0 = 0).
    # A token one plan rules out (-inf) reads as OpenAI's floor, -9999.
    p = a.exp()
    kl = torch.where(p > 0, p * (a - b.clamp(min=IMPOSSIBLE)), torch.zeros_like(p)).sum(dim=-1)
    out = []
    for token, lp_a, lp_b, k in zip(generated.tolist(), a[rows, generated].tolist(),
                                    b[rows, generated].tolist(), kl.tolist(), strict=True):
        text = tokens.bytes_of(token).decode("utf-8", errors="replace")
        out.append(StepDivergence(token, text, max(lp_a, IMPOSSIBLE), max(lp_b, IMPOSSIBLE),
                                  max(k, 0.0)))
    return out
