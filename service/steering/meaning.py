"""Feature search by meaning (issue 43 item 1): a query matched against what
each feature is about through the served model's own embeddings, so "ocean"
finds a feature whose record says "sea" and "waves" though no word is shared.

Each feature with a record or an explanation gets a short description: its
explanation when one is set, then its strongest tokens and the text around
its two strongest positions. Descriptions and the query are embedded by the
engine that serves the model (mean-pooled last layer, what /v1/embeddings
returns), and features are ranked by cosine after the descriptions' mean is
taken out of every vector, the query's included: mean-pooled vectors share
a large common direction, and without this the same few features come first
whatever is asked ("all but the top", Mu and Viswanath). Descriptions are embedded once
per (SAE, model, descriptions) and kept, so a second query costs one
embedding; the embedding runs in batches, bounded by the embedding route's
own limit on inputs.
"""

from __future__ import annotations

import hashlib
import threading

import torch

from service.errors import invalid_parameter
from service.requests.embeddings import MAX_EMBED_INPUTS
from service.requests.params import EmbedParams
from service.steering.sae import SaeInfo
from service.steering.search import MAX_QUERY, Match

MAX_DESCRIPTION = 400  # characters a feature's description keeps
_KEPT = 8  # (SAE, model) description sets kept


def check_meaning(text: str) -> str:
    text = text.strip()
    if not text:
        raise invalid_parameter("meaning", "'meaning' must hold some text.")
    if len(text) > MAX_QUERY:
        raise invalid_parameter("meaning", f"'meaning' is at most {MAX_QUERY} characters.")
    return text


def descriptions(document: dict | None, info: SaeInfo,
                 explanations: dict[int, str]) -> dict[int, str]:
    """What each feature with a record or an explanation is about, as text."""
    records = {}
    for feature in (document or {}).get("features", ()):
        if isinstance(feature, dict) and 0 <= feature.get("index", -1) < info.d_sae:
            records[int(feature["index"])] = feature
    out = {}
    for index in sorted(set(records) | set(explanations)):
        record = records.get(index, {})
        parts = [explanations.get(index, "")]
        tokens = [str(t.get("token", "")).strip() for t in record.get("top_tokens", ())
                  if isinstance(t, dict)]
        parts.append(" ".join(t for t in tokens if t))
        for e in list(record.get("examples", ()))[:2]:
            if isinstance(e, dict):
                parts.append(f"{e.get('left', '')}{e.get('token', '')}{e.get('right', '')}")
        text = " · ".join(p.strip() for p in parts if p and p.strip())[:MAX_DESCRIPTION]
        if text:
            out[index] = text
    return out


class MeaningIndex:
    """Description vectors per (SAE, model, descriptions), the last few kept."""

    def __init__(self):
        self._kept: dict[tuple, tuple[list[int], torch.Tensor, torch.Tensor]] = {}
        self._lock = threading.Lock()

    async def search(self, inference, info: SaeInfo, described: dict[int, str], query: str,
                     model: str) -> list[Match]:
        if not described:
            return []
        digest = hashlib.sha256("\x00".join(
            f"{i}\x01{t}" for i, t in sorted(described.items())).encode()).hexdigest()
        key = (info.id, model, digest)
        with self._lock:
            kept = self._kept.get(key)
        if kept is None:
            indices = sorted(described)
            rows = []
            for start in range(0, len(indices), MAX_EMBED_INPUTS):
                batch = tuple(described[i] for i in indices[start:start + MAX_EMBED_INPUTS])
                rows.extend((await inference.embed(EmbedParams(model, batch))).vectors)
            raw = torch.tensor(rows, dtype=torch.float64)
            centre = raw.mean(dim=0)
            kept = (indices, torch.nn.functional.normalize(raw - centre, dim=1), centre)
            with self._lock:
                self._kept[key] = kept
                while len(self._kept) > _KEPT:
                    self._kept.pop(next(iter(self._kept)))
        indices, vectors, centre = kept
        q = torch.tensor((await inference.embed(EmbedParams(model, (query,)))).vectors[0],
                         dtype=torch.float64)
        cosines = (vectors @ torch.nn.functional.normalize(q - centre, dim=0)).tolist()
        matches = [Match(i, round(c, 6)) for i, c in zip(indices, cosines, strict=True)]
        return sorted(matches, key=lambda m: (-m.score, m.index))
