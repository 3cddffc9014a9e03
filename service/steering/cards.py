"""A feature's card (issue 43): its record, the tokens its direction
promotes and suppresses, its explanation.

What a feature writes is read off its decoder row through the model's
unembedding (the "logit lens" Neuronpedia shows as positive and negative
logits): W_U · W_dec[i], the change in each token's logit per unit of the
feature, leaving out the final norm's scaling. It needs the model the SAE
reads, so a card lists tokens only when the loaded model's width is the SAE's.
"""

from __future__ import annotations

import torch

from service.errors import invalid_parameter
from service.steering.sae import SaeInfo, check_feature_index

DEFAULT_TOP_TOKENS = 10
MAX_TOP_TOKENS = 64


def check(info: SaeInfo, index: int, top_tokens: int | None) -> int:
    """The number of tokens to list, after checking the index."""
    check_feature_index(info, index, "index")
    k = DEFAULT_TOP_TOKENS if top_tokens is None else top_tokens
    if not 1 <= k <= MAX_TOP_TOKENS:
        raise invalid_parameter("top_tokens", f"'top_tokens' must be from 1 to "
                                f"{MAX_TOP_TOKENS}.")
    return k


def record_of(document: dict | None, index: int) -> dict | None:
    """The feature's entry in the SAE's features.json, if recorded."""
    for feature in (document or {}).get("features", ()):
        if isinstance(feature, dict) and feature.get("index") == index:
            return feature
    return None


def token_logits(row: torch.Tensor, unembedding: torch.Tensor, k: int
                 ) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(the k tokens the direction raises most, highest first; the k it
    lowers most, lowest first) as (token id, logit change)."""
    logits = unembedding @ row.float().to(unembedding.device)
    k = min(k, len(logits))
    top = torch.topk(logits, k)
    bottom = torch.topk(-logits, k)
    return ([(int(i), round(float(v), 6)) for v, i in zip(top.values, top.indices, strict=True)],
            [(int(i), round(-float(v), 6))
             for v, i in zip(bottom.values, bottom.indices, strict=True)])
