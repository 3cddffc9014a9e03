"""A feature card's contexts from live traffic (issue 43 item 2), opt in: the
strongest positions at which each feature fired in the generations that
monitoring already reads, with the text around them.

The records beside an SAE (features.json) say what a feature fired on in
the text the SAE was built from; traffic says what it fires on in what the
server is actually asked. Monitoring already encodes every monitored token
through the probes' SAEs (probes.LayerProbes.read); when an operator turns
`keep_contexts` on for a model, that same encode also picks, per feature,
the activations above the weakest of the eight kept so far (`floor`, one
comparison over the batch's activations, so once the lists fill almost
nothing passes). A request keeps its few best candidates as positions; when
it ends, monitoring turns them into text with its token ids and offers them
here. Only single-choice generations contribute (a position must name one
row's tokens). Everything is in memory, at most eight contexts per feature,
forgotten when the switch goes off or the engine restarts: it is text users
sent, so it is never written anywhere.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

KEPT = 8  # contexts per feature
MAX_HITS = 256  # candidates one encode hands on
MAX_FOUND = 64  # candidates one request keeps
LEFT, RIGHT = 16, 4  # tokens of text around a position


@dataclass(frozen=True)
class Context:
    value: float
    token: str
    left: str
    right: str


class ContextSampler:
    """One SAE's kept contexts, and the floor a new one must beat."""

    def __init__(self, d_sae: int, device: torch.device):
        self.d_sae = d_sae
        self.floor = torch.zeros(d_sae, dtype=torch.float32, device=device)
        self._best: dict[int, list[Context]] = {}
        self._lock = threading.Lock()

    def hits(self, acts: torch.Tensor) -> list[tuple[int, int, float]]:
        """(row, feature, value) where a row's activation beats the floor
        (model thread; the floor is only a filter, read without the lock)."""
        mask = acts > self.floor
        where = mask.nonzero()[:MAX_HITS]
        if not len(where):
            return []
        values = acts[where[:, 0], where[:, 1]].tolist()
        return [(r, f, v) for (r, f), v in zip(where.tolist(), values, strict=True)]

    def offer(self, feature: int, context: Context) -> None:
        with self._lock:
            kept = self._best.setdefault(feature, [])
            if any(c.left == context.left and c.token == context.token for c in kept):
                return  # the same text again (a repeated prompt)
            kept.append(context)
            kept.sort(key=lambda c: -c.value)
            del kept[KEPT:]
            if len(kept) == KEPT:
                self.floor[feature] = kept[-1].value

    def of(self, feature: int) -> list[Context]:
        with self._lock:
            return list(self._best.get(feature, ()))

    def clear(self) -> None:
        with self._lock:
            self._best = {}
            self.floor.zero_()


def keep_best(found: list, candidate: tuple) -> None:
    """Add (value, sae_id, feature, position) to a request's candidates,
    holding at most MAX_FOUND (the weakest dropped)."""
    found.append(candidate)
    if len(found) > 2 * MAX_FOUND:
        found.sort(key=lambda c: -c[0])
        del found[MAX_FOUND:]


def resolve(found: list, ids: list[int], decode) -> list[tuple[str, int, Context]]:
    """The candidates as (sae_id, feature, context), their text read from
    `ids` (the row's prompt and generated tokens) with `decode`."""
    out = []
    for value, sae_id, feature, position in sorted(found, key=lambda c: -c[0])[:MAX_FOUND]:
        if not 0 <= position < len(ids):
            continue
        out.append((sae_id, feature, Context(
            round(float(value), 6), decode(ids[position:position + 1]),
            decode(ids[max(0, position - LEFT):position]),
            decode(ids[position + 1:position + 1 + RIGHT]))))
    return out
