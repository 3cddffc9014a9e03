"""The steering dial: how a request's λ (a number in 0-2, or off/min/max)
resolves against its steering base.

Pure functions, so the rules read as a table (tests/test_steering_intensity.py):

- A cluster (and a plain profile or the live values, which behave like a
  cluster without a declared range) scales its stored strengths by λ. Numeric
  λ is capped at the declared range's maximum (or the configured maximum);
  below the floor it is honoured, since dialing toward off always is. "min"
  and "max" are the declared bounds intersected with the [0, 2] envelope, or
  CLUSTER_INTENSITY_MIN / the configured maximum when nothing is declared.
- A circuit clamps numeric λ at both ends into its declared range intersected
  with the envelope [CIRCUIT_INTENSITY_MIN, maximum]; only an exact 0 / "off"
  goes below the floor. Without a declared range the floor is
  CIRCUIT_INTENSITY_MIN (0.0), so "min" is "off".
- 0 / "off" turns steering off for the request, whatever the base.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.errors import invalid_parameter

ENVELOPE = (0.0, 2.0)
SYMBOLS = ("off", "min", "max")
# Each member's strength after the dial, as for every steering value.
MAX_STRENGTH = 200.0


@dataclass(frozen=True)
class IntensityLimits:
    cluster_min: float = 0.5  # CLUSTER_INTENSITY_MIN
    cluster_max: float = 2.0  # CLUSTER_INTENSITY_MAX: the cap without a declared range
    circuit_min: float = 0.0  # CIRCUIT_INTENSITY_MIN
    circuit_max: float = 2.0  # CIRCUIT_INTENSITY_MAX


def parse_dial(value, param: str = "steering_intensity") -> float | str | None:
    """A request's dial as sent: None, a number in [0, 2], or a symbol."""
    if value is None:
        return None
    if isinstance(value, str):
        if value not in SYMBOLS:
            raise invalid_parameter(param, f"'{param}' must be a number from 0 to 2 or one of "
                                    f"{', '.join(SYMBOLS)}; got {value!r}.")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid_parameter(param, f"'{param}' must be a number or a string.")
    if not math.isfinite(value) or not ENVELOPE[0] <= value <= ENVELOPE[1]:
        raise invalid_parameter(param, f"'{param}' must be from {ENVELOPE[0]:g} to "
                                f"{ENVELOPE[1]:g}; got {value:g}.")
    return float(value)


def is_off(dial) -> bool:
    return dial == "off" or (isinstance(dial, float) and dial == 0.0)


def _within_envelope(low: float, high: float) -> tuple[float, float]:
    return max(low, ENVELOPE[0]), min(high, ENVELOPE[1])


def cluster_bounds(declared: tuple[float, float] | None, limits: IntensityLimits):
    if declared is None:
        return limits.cluster_min, limits.cluster_max
    low, high = _within_envelope(*declared)
    # A declared range outside the envelope leaves its nearest edge.
    return (low, high) if low <= high else (high, high)


def _resolve(dial, stored: float, low: float, high: float, clamp_floor: bool) -> float:
    if dial is None:
        # The stored dial obeys the same clamp (0 stays off).
        return stored if not clamp_floor or stored == 0 else min(max(stored, low), high)
    if is_off(dial):
        return 0.0
    if dial == "min":
        return low
    if dial == "max":
        return high
    return min(max(dial, low) if clamp_floor else dial, high)


def resolve_cluster(dial, stored: float, declared: tuple[float, float] | None,
                    limits: IntensityLimits) -> float:
    """λ for a cluster base; `stored` is its persistent dial (used when the
    request sends none). Below the floor is honoured: dialing toward off."""
    return _resolve(dial, stored, *cluster_bounds(declared, limits), clamp_floor=False)


def circuit_bounds(declared: tuple[float, float] | None, limits: IntensityLimits):
    envelope = _within_envelope(limits.circuit_min, limits.circuit_max)
    if declared is None:
        return envelope
    low, high = max(declared[0], envelope[0]), min(declared[1], envelope[1])
    # A declared range outside the envelope leaves its nearest edge.
    return (low, high) if low <= high else (high, high)


def resolve_circuit(dial, stored: float, declared: tuple[float, float] | None,
                    limits: IntensityLimits) -> float:
    """λ for a circuit base (full mode); `stored` is the circuit's own dial.
    Clamped at both ends; only an exact 0 / "off" is below the floor."""
    return _resolve(dial, stored, *circuit_bounds(declared, limits), clamp_floor=True)


def scaled(strength: float, level: float) -> float:
    """A member's strength at dial λ, re-derived from the authored strength
    (absolute, never compounding) and clamped to the steering range."""
    return max(-MAX_STRENGTH, min(MAX_STRENGTH, strength * level))
