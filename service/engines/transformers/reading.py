"""The transformers engine reading its model without generating: next-token
scoring, prompt log-probabilities, generation log-probabilities and
embeddings. Runs on the model thread; the scores themselves are computed from
logits by engines/scores.py, as on the GGUF engine.

Scoring and embeddings go through `unsteered_forward`, which switches every
attached SAE's hook off for this pass only (engines/transformers/steering.py), so a judge's
probability or an embedding always reflects the unmodified model while
generations running beside it, in the same batch loop, stay steered. The one
steered read is an echo's prompt log-probabilities (`steered_forward`): they
belong to a completion, which is read under that completion's steering.
"""

from __future__ import annotations

import torch

from service.engines import scores
from service.engines.scores import (
    ScoredPrompt,
    StepDivergence,
    TokenScore,
    drawn_score,
    scaled,
    score_logits,
)
from service.engines.transformers.steering import Capture, ForwardSteering, build, row_ops
from service.steering.conditions import Replayed


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


def steered_forward(ctx, plan, generated_from: int | None = None, **inputs):
    """A forward pass over one row steered by `plan` (a SteeringPlan): echo's
    prompt log-probabilities belong to a completion, which default steering
    applies to, so they are read under the same steering as its generation.
    Tokens from `generated_from` on were generated (None: none were): the
    plan's conditions hold where they held as it generated."""
    ids = inputs["input_ids"][0].tolist()
    conditions = None
    if plan.conditional:
        conditions = Replayed(plan.conditions, [ctx.tokens.bytes_of(t) for t in ids],
                              len(ids) if generated_from is None else generated_from)
    deltas, edits = build([row_ops(plan, conditions, 0, len(ids))], len(ids), ctx.steering)
    with ctx.steering.applying(ForwardSteering(deltas, {}, edits=edits)):
        return ctx.model(**inputs)


def divergence(ctx, ids: list[int], start: int, plan) -> list[StepDivergence]:
    """A completion ids[start:] under `plan` and unsteered (steering_compare):
    only the rows that predict it are kept."""
    inputs = {"input_ids": torch.tensor([ids], device=ctx.device), "use_cache": False,
              "logits_to_keep": len(ids) - start + 1}
    if plan is not None and ctx.steering is not None:
        steered = steered_forward(ctx, plan, start, **inputs).logits[0, :-1]
    else:
        steered = None
    plain = unsteered_forward(ctx, **inputs).logits[0, :-1]
    return scores.divergence(ctx.tokens, ids, start, plain if steered is None else steered,
                             plain)


def score_prompt(ctx, ids: list[int], *, temperature: float, allowed: list[int] | None,
                 top: int, echo: bool, next_token: bool, recorder=None,
                 plan=None) -> ScoredPrompt:
    """One forward pass over the prompt (reading activations into `recorder`).
    Unsteered unless `plan` is given (echo of a steered completion)."""
    inputs = {"input_ids": torch.tensor([ids], device=ctx.device), "use_cache": False,
              "logits_to_keep": 0 if echo else 1}
    if plan is not None and ctx.steering is not None:
        out = steered_forward(ctx, plan, **inputs)
    else:
        out = unsteered_forward(ctx, recorder, **inputs)
    return score_logits(ctx.tokens, ids, out.logits[0], temperature=temperature,
                        allowed=allowed, top=top, echo=echo, next_token=next_token)


def generation_logprobs(ctx, logits: torch.Tensor, temperatures: list[float],
                        tokens: list[int], tops: list[int]) -> list[TokenScore]:
    """Per-row log-probabilities of the sampled tokens: the distribution after
    penalties, masks and temperature, before top-p/top-k/min-p truncation."""
    return [drawn_score(ctx.tokens, scaled(logits[i], temperatures[i]), token, top)
            for i, (token, top) in enumerate(zip(tokens, tops, strict=True))]


def embed_chunks(ctx, inputs: list[list[int]], batch_tokens: int = 2048):
    """Mean of the last hidden layer over each input's positions. Inputs are
    right-padded into few forward passes; the mask keeps padding out of both
    attention and the mean, so a vector does not depend on its neighbours.

    A generator: it yields after each forward pass (a chunk, run between decode
    steps: engines/model_thread.py) and returns the vectors."""
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
        yield
    return vectors
