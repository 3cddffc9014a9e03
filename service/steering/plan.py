"""A request's steering and readout as plain data, which every engine applies
its own way: the transformers engine with forward hooks on its decoder layers
(engines/transformers/steering.py), the GGUF engine on llama.cpp's residual
stream (engines/gguf/steering.py).

The plan names, per layer, what a row does to the residual stream after
that block at each position of its own tokens (prompt and generated alike):
edits that set a linear reading of it (clamp and ablate: Edit) and the one
vector it adds, each either always or while a condition holds on the row
(steering/conditions.py); what a row reads (ActivationSpec) and the probes it feeds are named
alongside. Nothing here is torch: vectors are float32 numpy arrays, resolved
once when the request is validated (steering/manager.py), so a plan is the
same on every engine and can key a prefix cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from service.steering.conditions import Condition

if TYPE_CHECKING:
    from service.steering.sae import SaeWeights

POST_STEERING, PRE_STEERING, UNSTEERED = "post_steering", "pre_steering", "unsteered"
LAST, PROMPT, COMPLETION, ALL, RANGE = "last", "prompt", "completion", "all", "range"


ADD, CLAMP, ABLATE = "add", "clamp", "ablate"
MODES = (ADD, CLAMP, ABLATE)


@dataclass(frozen=True)
class Edit:
    """A linear reading of the residual set to a target: r = x·read + bias;
    where r > above, x moves by (target - r) · move. `move` is the direction
    the entry moves along, divided by its reading of that direction and times
    the dial, so at dial 1 the reading lands exactly on `target` (clamp), or
    drops to it from above (ablate: `above` is where the feature starts to
    fire). Both engines apply it as written (steering at a layer: each edit
    in order, then the added vector)."""

    read: np.ndarray = field(compare=False, repr=False)  # float32 [d_model]
    bias: float
    target: float
    above: float  # -inf: always
    move: np.ndarray = field(compare=False, repr=False)  # float32 [d_model]

    @property
    def key(self) -> tuple:
        return (self.read.tobytes(), self.bias, self.target, self.above, self.move.tobytes())


@dataclass(frozen=True)
class LayerSteering:
    """What one layer does: its edits (clamp, ablate), then adds Σ strength ·
    W_dec[feature] of its SAE's features and any control vectors' scaled
    directions, already dialed and clamped (`vector`, None when nothing adds)."""

    layer: int
    sae_id: str
    features: tuple[int, ...]
    strengths: tuple[float, ...]
    vector: np.ndarray | None = field(compare=False, repr=False)  # float32 [d_model]
    edits: tuple[Edit, ...] = ()

    @property
    def key(self) -> tuple:
        return (self.layer, None if self.vector is None else self.vector.tobytes(),
                tuple(e.key for e in self.edits))


@dataclass(frozen=True)
class ScoreRule:
    """A scored condition bound to the SAE attached now: Σ weight · activation
    over `features` of `sae`, read at `layer` before its steering; it holds
    where the score is above `threshold` (a feature condition) or reaches it
    (`inclusive`: a probe, as monitoring fires)."""

    layer: int
    sae: SaeWeights = field(compare=False, repr=False)
    features: tuple[tuple[int, float], ...]
    threshold: float
    inclusive: bool
    sae_id: str

    def holds(self, hidden) -> list[bool]:
        """Per row of residual vectors hidden [rows, d] (a torch tensor)."""
        acts = self.sae.encode(hidden)
        index = [f for f, _ in self.features]
        weights = acts.new_tensor([w for _, w in self.features])
        score = acts[:, index] @ weights
        hit = score >= self.threshold if self.inclusive else score > self.threshold
        return hit.tolist()


@dataclass(frozen=True)
class _ReadAt:
    layer: int
    read_point: str = PRE_STEERING


class ConditionReader:
    """Reads a scored condition at the last position an engine hands it (its
    capture interface: `spec.layer`, `spec.read_point`, `record`), and tells
    `sink(index, holds)`: a row's RowConditions.read, or a prompt group's."""

    def __init__(self, rule: ScoreRule, index: int, sink):
        self.rule, self.index, self.sink = rule, index, sink
        self.spec = _ReadAt(rule.layer)

    def record(self, hidden, positions, token_ids) -> None:
        self.sink(self.index, self.rule.holds(hidden[-1:])[0])


def condition_readers(plan: SteeringPlan | None, sink) -> tuple[ConditionReader, ...]:
    if plan is None:
        return ()
    return tuple(ConditionReader(rule, i, sink) for i, rule in enumerate(plan.rules)
                 if rule is not None)


@dataclass(frozen=True)
class LayerOps:
    """One layer's steering at one position, conditions resolved."""

    add: np.ndarray | None
    edits: tuple[Edit, ...]


@dataclass(frozen=True)
class SteeringPlan:
    """`layers` apply at every position; each of `conditional` applies where
    its condition (steering/conditions.py) holds on the row."""

    layers: tuple[LayerSteering, ...]
    conditional: tuple[tuple[Condition, tuple[LayerSteering, ...]], ...] = ()
    # Per conditional block: its ScoreRule (feature and probe conditions) or None.
    rules: tuple[ScoreRule | None, ...] = ()
    # Per conditional block: whether its condition ends the row (abort_when).
    aborts: tuple[bool, ...] = ()
    _ops: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def scored(self) -> bool:
        """Some condition is read from the residual stream as the row runs."""
        return any(r is not None for r in self.rules)

    @property
    def conditions(self) -> tuple[Condition, ...]:
        return tuple(c for c, _ in self.conditional)

    @property
    def plain(self) -> bool:
        """Adds only, at every position: a vector per layer says it all."""
        return not self.conditional and not any(s.edits for s in self.layers)

    def vectors(self) -> dict[int, np.ndarray]:
        """A plain plan's additions (plain)."""
        return {s.layer: s.vector for s in self.layers if s.vector is not None}

    def ops(self, active: tuple[bool, ...] = ()) -> dict[int, LayerOps]:
        """Per layer, what applies where the conditions `active` says hold
        (one flag per conditional block; () when there are none)."""
        cached = self._ops.get(active)
        if cached is not None:
            return cached
        parts: dict[int, list[LayerSteering]] = {}
        for s in self.layers:
            parts.setdefault(s.layer, []).append(s)
        for (_, layers), on in zip(self.conditional, active or (False,) * len(
                self.conditional), strict=True):
            if on:
                for s in layers:
                    parts.setdefault(s.layer, []).append(s)
        out = {}
        for layer in sorted(parts):
            adds = [s.vector for s in parts[layer] if s.vector is not None]
            add = None
            if adds:
                add = adds[0].copy() if len(adds) > 1 else adds[0]
                for v in adds[1:]:
                    add += v
            edits = tuple(e for s in parts[layer] for e in s.edits)
            if add is not None or edits:
                out[layer] = LayerOps(add, edits)
        self._ops[active] = out
        return out

    def runs(self, conditions, first: int, count: int) -> list[tuple[int, int, dict]]:
        """What applies at positions first..first+count-1 of a row whose
        conditions are `conditions` (RowConditions or Replayed; None when
        the plan has none), as runs (offset, length, ops)."""
        if conditions is None or not self.conditional:
            return [(0, count, self.ops())]
        return [(a, n, self.ops(active)) for a, n, active in conditions.runs(first, count)]

    @property
    def key(self) -> tuple:
        """Equal exactly when two plans steer the same way at the same
        layers under the same conditions: a prefix cache keyed by it never
        mixes a steered prefix into another plan's request (nor into an
        unsteered one, keyed None)."""
        return (tuple(s.key for s in self.layers),
                tuple((c, tuple(s.key for s in layers)) for c, layers in self.conditional),
                self.rules, self.aborts)


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
