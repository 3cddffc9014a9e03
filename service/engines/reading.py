"""Reading the model without generating: next-token scoring, prompt
log-probabilities and embeddings. Runs on the model thread.

Every forward pass here goes through `unsteered_forward`, which switches every
attached SAE's hook off for this pass only (steering/runtime.py), so a judge's
probability or an embedding always reflects the unmodified model while
generations running beside it, in the same batch loop, stay steered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from service.errors import EngineError
from service.steering.runtime import Capture, ForwardSteering

# Temperatures in (0, MIN_TEMPERATURE) would overflow the logits.
MIN_TEMPERATURE = 0.001


def unsteered_forward(ctx, recorder=None, **inputs):
    """A forward pass with no steering on any layer; `recorder` (an
    ActivationRecorder) reads its layer's residual on the way, over every
    position of the single row."""
    if ctx.steering is None:
        return ctx.model(**inputs)
    if recorder is None:
        with ctx.steering.suppressed():
            return ctx.model(**inputs)
    ids = inputs["input_ids"][0].tolist()
    capture = Capture(0, 0, list(range(len(ids))), ids, recorder)
    # No deltas: the hooks only read.
    with ctx.steering.applying(ForwardSteering({}, {recorder.spec.layer: [capture]})):
        return ctx.model(**inputs)


def steered_forward(ctx, plan, **inputs):
    """A forward pass over one row steered by `plan` (a SteeringPlan): echo's
    prompt log-probabilities belong to a completion, which default steering
    applies to, so they are read under the same steering as its generation."""
    deltas = {layer: delta.unsqueeze(0) for layer, delta in plan.deltas().items()}
    with ctx.steering.applying(ForwardSteering(deltas, {})):
        return ctx.model(**inputs)


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


def token_bytes(ctx, token_id: int) -> bytes:
    if ctx.token_bytes is not None:
        return ctx.token_bytes[token_id]
    return ctx.decoder.decode([token_id]).encode()


def entry(ctx, token_id: int, logprob: float | None) -> TokenLogprob:
    raw = token_bytes(ctx, token_id)
    return TokenLogprob(token_id, raw.decode("utf-8", errors="replace"), raw, logprob)


def non_finite() -> EngineError:
    return EngineError("non_finite_logits", "The model produced NaN or infinite logits where "
                       "they reach the answer; nothing can be reported.")


def scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits if temperature == 0 else logits / temperature


def score_position(ctx, logits: torch.Tensor, allowed: torch.Tensor | None, top: int,
                   chosen: int | None = None) -> TokenScore:
    """One position: normalise over the candidates (the allowed ids, or every
    decodable id), and report `chosen` (default: the most probable candidate)
    with the `top` most likely alternatives."""
    candidates = allowed if allowed is not None else torch.arange(ctx.vocab_size,
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
        alternatives = tuple(entry(ctx, int(candidates[i]), float(v))
                             for v, i in zip(best.values, best.indices, strict=True))
        if any(math.isinf(a.logprob) for a in alternatives):
            raise non_finite()
    return TokenScore(entry(ctx, chosen, chosen_lp), alternatives)


def score_prompt(ctx, ids: list[int], *, temperature: float, allowed: list[int] | None,
                 top: int, echo: bool, next_token: bool, recorder=None,
                 plan=None) -> ScoredPrompt:
    """One forward pass over the prompt (reading activations into `recorder`).
    Unsteered unless `plan` is given (echo of a steered completion)."""
    device = ctx.device
    inputs = {"input_ids": torch.tensor([ids], device=device), "use_cache": False,
              "logits_to_keep": 0 if echo else 1}
    if plan is not None and ctx.steering is not None:
        out = steered_forward(ctx, plan, **inputs)
    else:
        out = unsteered_forward(ctx, recorder, **inputs)
    logits = scaled(out.logits[0].float(), temperature)
    allowed_ids = (torch.tensor(allowed, dtype=torch.long, device=device)
                   if allowed is not None else None)
    prompt_scores: tuple[TokenScore, ...] = ()
    if echo:
        first = TokenScore(entry(ctx, ids[0], None))
        prompt_scores = (first, *(
            score_position(ctx, logits[p - 1], None, top, chosen=ids[p])
            for p in range(1, len(ids))))
    nxt = score_position(ctx, logits[-1], allowed_ids, top) if next_token else None
    return ScoredPrompt(prompt_scores, nxt)


def generation_logprobs(ctx, logits: torch.Tensor, temperatures: list[float],
                        tokens: list[int], tops: list[int]) -> list[TokenScore]:
    """Per-row log-probabilities of the sampled tokens: the distribution after
    penalties, masks and temperature, before top-p/top-k/min-p truncation."""
    out = []
    for i, (token, top) in enumerate(zip(tokens, tops, strict=True)):
        lp = torch.log_softmax(scaled(logits[i], temperatures[i]), dim=-1)
        chosen = entry(ctx, token, float(lp[token]))
        alternatives = ()
        if top:
            best = torch.topk(lp, top)
            alternatives = tuple(entry(ctx, int(j), float(v))
                                 for v, j in zip(best.values, best.indices, strict=True))
        out.append(TokenScore(chosen, alternatives))
    return out


def embed(ctx, inputs: list[list[int]], batch_tokens: int = 4096) -> list[list[float]]:
    """Mean of the last hidden layer over each input's positions. Inputs are
    right-padded into few forward passes; the mask keeps padding out of both
    attention and the mean, so a vector does not depend on its neighbours."""
    device = ctx.device
    vectors: list[list[float] | None] = [None] * len(inputs)
    order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and len(inputs[order[end]]) * (end + 1 - start) <= batch_tokens:
            end += 1
        chunk = order[start:end]
        width = max(len(inputs[i]) for i in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long, device=device)
        mask = torch.zeros((len(chunk), width), dtype=torch.long, device=device)
        for row, i in enumerate(chunk):
            ids[row, :len(inputs[i])] = torch.tensor(inputs[i], device=device)
            mask[row, :len(inputs[i])] = 1
        out = unsteered_forward(ctx, input_ids=ids, attention_mask=mask, use_cache=False,
                                output_hidden_states=True, logits_to_keep=1)
        hidden = out.hidden_states[-1].float()
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        means = (hidden * weights).sum(dim=1) / weights.sum(dim=1)
        for row, i in enumerate(chunk):
            vectors[i] = means[row].tolist()
        start = end
    return vectors
