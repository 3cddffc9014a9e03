"""OpenAI's logit_bias: the rules of the map a request sends (token id ->
value added to that token's logit before the draw).

The values are checked with the other sampling parameters, before any model
work (checked_logit_bias); the ids once the vocabulary is known
(check_logit_bias_ids). Scoring mode refuses the field (requests/checks.py):
its answer is the model's own most probable token. Each failure names the
entry, `logit_bias[<id>]`, or the field for too many entries.
"""

from __future__ import annotations

import math

from service.errors import invalid_parameter

MAX_ENTRIES = 300
LIMIT = 100.0


def checked_logit_bias(bias: dict[int, float] | None) -> tuple[tuple[int, float], ...]:
    """The map as sorted (id, value) pairs, for SamplingOptions."""
    bias = bias or {}
    if len(bias) > MAX_ENTRIES:
        raise invalid_parameter("logit_bias", f"'logit_bias' takes at most {MAX_ENTRIES} "
                                f"entries; got {len(bias)}.")
    for token, value in bias.items():
        if not math.isfinite(value) or not -LIMIT <= value <= LIMIT:
            where = f"logit_bias[{token}]"
            raise invalid_parameter(where, f"'{where}' must be a number from {-LIMIT:g} to "
                                    f"{LIMIT:g}; got {value:g}.")
    return tuple(sorted((int(t), float(v)) for t, v in bias.items()))


def check_logit_bias_ids(bias: dict[int, float] | None, vocab_size: int) -> None:
    for token in sorted(bias or {}):
        if not 0 <= token < vocab_size:
            where = f"logit_bias[{token}]"
            raise invalid_parameter(where, f"'{where}': token id {token} is outside the "
                                    f"vocabulary (0-{vocab_size - 1}).")
