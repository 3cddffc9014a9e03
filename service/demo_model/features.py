"""What each feature of a trained demo SAE fires on, written beside it.

A feature is only useful to an operator who can tell what it means, so the
build records, for every feature, the tokens of the training text where it
fires hardest, each with the text around it, and a short list of the distinct
tokens among them. The engine serves this file through the management API
(service/steering/features.py), where the console browses it and
bench/steering_effect.py picks topic features from it.

The file is `features.json` in the SAE's directory (format
millm.sae_features.v1); any SAE directory may carry one, trained here or not.
"""

from __future__ import annotations

import json
import pathlib

FILE = "features.json"
FORMAT = "millm.sae_features.v1"
EXAMPLES = 8  # strongest positions kept per feature
POOL = 32  # positions the token summary is drawn from
LEFT, RIGHT = 10, 3  # context tokens either side of an example


def write(directory: pathlib.Path, acts, docs: list[list[int]], tokenizer) -> dict:
    """acts [tokens, d_sae] over the concatenated docs. Returns a summary for
    the build marker: features that ever fire, and the mean number active per
    token."""
    import torch

    where = [(d, p) for d, ids in enumerate(docs) for p in range(len(ids))]
    texts: dict[int, str] = {}

    def text(token_id: int) -> str:
        if token_id not in texts:
            texts[token_id] = tokenizer.decode([token_id])
        return texts[token_id]

    active = acts > 0
    density = active.float().mean(dim=0)
    k = min(POOL, acts.shape[0])
    best = torch.topk(acts, k, dim=0)
    features = []
    for f in range(acts.shape[1]):
        values, rows = best.values[:, f].tolist(), best.indices[:, f].tolist()
        hits = [(v, r) for v, r in zip(values, rows, strict=True) if v > 0]
        tokens: dict[str, dict] = {}
        for v, r in hits:
            d, p = where[r]
            entry = tokens.setdefault(text(docs[d][p]), {"token": text(docs[d][p]), "count": 0,
                                                         "max": round(v, 3)})
            entry["count"] += 1
        examples = []
        for v, r in hits[:EXAMPLES]:
            d, p = where[r]
            ids = docs[d]
            examples.append({"value": round(v, 3), "token": text(ids[p]),
                             "left": tokenizer.decode(ids[max(0, p - LEFT):p]),
                             "right": tokenizer.decode(ids[p + 1:p + 1 + RIGHT])})
        features.append({"index": f, "density": round(float(density[f]), 5),
                         "max": round(values[0], 3) if hits else 0.0,
                         "top_tokens": list(tokens.values())[:6], "examples": examples})
    alive = int(active.any(dim=0).sum())
    mean_l0 = float(active.sum(dim=1).float().mean())
    document = {"format": FORMAT, "tokens_read": int(acts.shape[0]), "features": features}
    (directory / FILE).write_text(json.dumps(document, ensure_ascii=False) + "\n")
    return {"features_alive": alive, "mean_active_per_token": round(mean_l0, 2)}
