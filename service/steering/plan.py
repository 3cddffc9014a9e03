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
    _reduced: list = field(default_factory=list, compare=False, repr=False)

    def holds(self, x: np.ndarray) -> bool:
        """Whether it holds on one residual vector x [d] (float32). A row is
        read at every step, so only its own features are encoded (a topk
        SAE's k-th largest decides, so there the whole encoder runs)."""
        if not self._reduced:
            self._reduced.append(self._reduce())
        reduced = self._reduced[0]
        if isinstance(reduced, tuple) and len(reduced) == 5:  # one feature: plain floats
            read, bias, fires, weight, _ = reduced
            pre = float(x @ read) + bias
            score = weight * pre if pre > fires and pre > 0 else 0.0
        elif reduced is None:
            import torch

            acts = self.sae.encode(torch.from_numpy(x[None]))[0]
            score = float(sum(float(acts[f]) * w for f, w in self.features))
        else:
            read, bias, fires, weights = reduced
            pre = x @ read + bias
            score = float(np.where(pre > fires, np.maximum(pre, 0), 0) @ weights)
        return score >= self.threshold if self.inclusive else score > self.threshold

    def _reduce(self):
        """(encoder columns, biases, where each fires, weights) of its features."""
        sae = self.sae
        if sae.info.k:
            return None
        index = [f for f, _ in self.features]
        read = sae.W_enc[:, index].double().cpu()
        bias = sae.b_enc[index].double().cpu()
        if sae.info.apply_b_dec_to_input:
            bias = bias - sae.b_dec.double().cpu() @ read
        fires = (sae.threshold[index].double().cpu() if sae.threshold is not None
                 else bias.new_zeros(len(index)))
        if len(index) == 1:
            return (read[:, 0].float().numpy(), float(bias[0]), float(fires[0]),
                    self.features[0][1], 1)
        return (read.float().numpy(), bias.float().numpy(), fires.float().numpy(),
                np.array([w for _, w in self.features], dtype=np.float32))


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
        last = hidden[-1]
        if not isinstance(last, np.ndarray):  # a torch tensor, maybe on a device
            last = last.float().cpu().numpy()
        self.sink(self.index, self.rule.holds(last))


def condition_readers(plan: SteeringPlan | None, sink) -> tuple[ConditionReader, ...]:
    if plan is None:
        return ()
    return tuple(ConditionReader(rule, i, sink) for i, rule in enumerate(plan.rules)
                 if rule is not None)


@dataclass(frozen=True)
class LayerOps:
    """One layer's steering at one position, conditions resolved; the edits
    also stacked (reads, moves [m, d]; args [m, 3]: bias, target, above) for
    an engine that copies them whole."""

    add: np.ndarray | None
    edits: tuple[Edit, ...]
    reads: np.ndarray | None = field(default=None, compare=False, repr=False)
    moves: np.ndarray | None = field(default=None, compare=False, repr=False)
    args: np.ndarray | None = field(default=None, compare=False, repr=False)

    @staticmethod
    def of(add: np.ndarray | None, edits: tuple[Edit, ...]) -> LayerOps:
        if not edits:
            return LayerOps(add, edits)
        return LayerOps(add, edits, np.stack([e.read for e in edits]),
                        np.stack([e.move for e in edits]),
                        np.array([(e.bias, e.target, e.above) for e in edits], dtype=np.float32))


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
                out[layer] = LayerOps.of(add, edits)
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
