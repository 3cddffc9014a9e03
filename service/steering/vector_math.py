"""The two ways a steering vector is made from contrasting examples, on the
per-prompt mean residuals vector_builds.py reads.

- mean_difference (contrastive activation addition, Rimsky et al.; repeng's
  and cvector-generator's `mean`): the positives' mean minus the negatives'.
- pca: the first principal component of the pairs' differences, taken
  uncentred as cvector-generator does (centring would remove exactly the
  shift the pairs share); of two sets, the component of both sets around
  their joint mean. Its sign is chosen so positives project above negatives
  (repeng does the same), and its length is how far they do on average, so
  both methods give a vector of the size the examples differ by and
  `scale: 1` means "as far as the examples".

Also reported: the vector's norm, the separation (mean projection of
positive minus negative on the unit vector) and the agreement (the share of
pairs, or of prompts, on the expected side), to tell a vector that captures
the contrast from one that averages noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.errors import invalid_parameter

METHODS = ("mean_difference", "pca")


@dataclass(frozen=True)
class Combined:
    vector: np.ndarray  # float32 [width]
    norm: float
    separation: float
    agreement: float


def _first_component(rows: np.ndarray) -> np.ndarray:
    _, _, vt = np.linalg.svd(rows, full_matrices=False)
    return vt[0]


def combine(method: str, positives: np.ndarray, negatives: np.ndarray,
            paired: bool) -> Combined:
    """positives [n, width], negatives [m, width] (n == m when paired) in
    float64, to the vector and its statistics."""
    if paired:
        diffs = positives - negatives
        if method == "mean_difference":
            vector = diffs.mean(axis=0)
        else:
            unit = _first_component(diffs)
            along = diffs @ unit
            vector = unit * along.mean()
    else:
        if method == "mean_difference":
            vector = positives.mean(axis=0) - negatives.mean(axis=0)
        else:
            both = np.concatenate([positives, negatives])
            unit = _first_component(both - both.mean(axis=0))
            vector = unit * ((positives @ unit).mean() - (negatives @ unit).mean())
    norm = float(np.linalg.norm(vector))
    if not np.isfinite(norm) or norm < 1e-12:
        raise invalid_parameter("pairs", "The positives and negatives do not differ at this "
                                "layer (the vector is zero); nothing was saved.")
    unit = vector / norm
    pos, neg = positives @ unit, negatives @ unit
    if paired:
        agreement = float(np.mean(pos > neg))
    else:
        middle = (pos.mean() + neg.mean()) / 2
        agreement = float((np.sum(pos > middle) + np.sum(neg < middle)) / (len(pos) + len(neg)))
    vector32 = vector.astype(np.float32)
    if not np.isfinite(vector32).all():
        raise invalid_parameter("pairs", "The vector overflows float32; nothing was saved.")
    return Combined(vector32, norm, float(pos.mean() - neg.mean()), agreement)
