"""A request's steering and readout as plain data, which every engine applies
its own way: the transformers engine with forward hooks on its decoder layers
(engines/transformers/steering.py), the GGUF engine on llama.cpp's residual
stream (engines/gguf/steering.py).

The plan names, per layer, the one vector a row adds to the residual stream
after that block, at every position of its own tokens (prompt and generated
alike); what a row reads (ActivationSpec) and the probes it feeds are named
alongside. Nothing here is torch: vectors are float32 numpy arrays, resolved
once when the request is validated (steering/manager.py), so a plan is the
same on every engine and can key a prefix cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from service.steering.sae import SaeWeights

POST_STEERING, PRE_STEERING, UNSTEERED = "post_steering", "pre_steering", "unsteered"
LAST, PROMPT, COMPLETION, ALL, RANGE = "last", "prompt", "completion", "all", "range"


@dataclass(frozen=True)
class LayerSteering:
    """What one layer adds: Σ strength · W_dec[feature] of its SAE's features
    (and any control vectors' scaled directions), already dialed and clamped."""

    layer: int
    sae_id: str
    features: tuple[int, ...]
    strengths: tuple[float, ...]
    vector: np.ndarray = field(compare=False, repr=False)  # float32 [d_model]


@dataclass(frozen=True)
class SteeringPlan:
    layers: tuple[LayerSteering, ...]

    def vectors(self) -> dict[int, np.ndarray]:
        return {s.layer: s.vector for s in self.layers}

    @property
    def key(self) -> tuple:
        """Equal exactly when two plans add the same bytes at the same layers:
        a prefix cache keyed by it never mixes a steered prefix into another
        plan's request (nor into an unsteered one, keyed None)."""
        return tuple((s.layer, s.vector.tobytes()) for s in self.layers)


def plan_key(plan: SteeringPlan | None) -> tuple | None:
    return None if plan is None else plan.key


@dataclass(frozen=True)
class ActivationSpec:
    """What return_sae_activations asked for, checked (steering/readout.py)."""

    sae: SaeWeights
    features: tuple[int, ...] | None
    top_k: int
    positions: str  # LAST, PROMPT, COMPLETION, ALL or RANGE
    start: int = 0
    end: int = 0
    read_point: str = POST_STEERING

    @property
    def layer(self) -> int:
        return self.sae.info.layer

    def reads_prompt(self, prompt_len: int) -> bool:
        """Whether any prompt position other than the last is wanted."""
        if self.positions in (PROMPT, ALL):
            return True
        return self.positions == RANGE and self.start < prompt_len - 1
