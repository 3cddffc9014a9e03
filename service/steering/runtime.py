"""Steering on the model thread: one forward hook per attached SAE's layer,
and the per-row state each forward pass hands those hooks.

Nothing here is global steering. Before a forward pass the batch code says,
for that pass only, which delta each row of the batch gets at each layer and
which rows record activations (`applying`); outside such a pass every hook is
inert, which is how reading passes (scoring, embeddings) run unsteered while
steered generations share the same model. The model thread runs one forward
pass at a time, so one `current` slot is enough.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from service.steering.probes import read_layer
from service.steering.sae import SaeWeights

POST_STEERING, PRE_STEERING, UNSTEERED = "post_steering", "pre_steering", "unsteered"
LAST, PROMPT, COMPLETION, ALL, RANGE = "last", "prompt", "completion", "all", "range"


@dataclass(frozen=True)
class LayerSteering:
    layer: int
    sae: SaeWeights
    features: tuple[int, ...]
    strengths: tuple[float, ...]


@dataclass(frozen=True)
class SteeringPlan:
    """A request's resolved steering: features and strengths per layer, each
    already dialed and clamped. Built when the request is validated; turned
    into tensors on the model thread."""

    layers: tuple[LayerSteering, ...]

    def deltas(self) -> dict[int, torch.Tensor]:
        return {s.layer: s.sae.direction(list(s.features), list(s.strengths))
                for s in self.layers}


@dataclass(frozen=True)
class ActivationSpec:
    """What return_sae_activations asked for, checked."""

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


@dataclass
class ActivationRecorder:
    """One row's activations at one SAE's layer, kept as they are read."""

    spec: ActivationSpec
    prompt_len: int
    # (position, token id, ((feature index, value), ...)) in position order.
    entries: list = field(default_factory=list)

    def wanted(self, position: int) -> bool:
        kind = self.spec.positions
        if kind in (LAST, ALL):
            return True
        if kind == PROMPT:
            return position < self.prompt_len
        if kind == COMPLETION:
            return position >= self.prompt_len
        return self.spec.start <= position < self.spec.end

    def record(self, hidden: torch.Tensor, positions: list[int], token_ids: list[int]) -> None:
        keep = [i for i, p in enumerate(positions) if self.wanted(p)]
        if not keep:
            return
        if self.spec.positions == LAST:
            keep = keep[-1:]
        acts = self.spec.sae.encode(hidden[keep].float())
        candidates = None
        if self.spec.features is not None:
            candidates = torch.tensor(self.spec.features, dtype=torch.long, device=acts.device)
            acts = acts[:, candidates]
        k = min(self.spec.top_k, acts.shape[1])
        best = torch.topk(acts, k, dim=1)
        rows = []
        for r, i in enumerate(keep):
            features = []
            for value, j in zip(best.values[r].tolist(), best.indices[r].tolist(), strict=True):
                # Over the whole dictionary an inactive feature says nothing;
                # features the caller named are reported even at zero.
                if candidates is None and value <= 0.0:
                    continue
                index = int(candidates[j]) if candidates is not None else int(j)
                features.append((index, float(value)))
            rows.append((positions[i], token_ids[i], tuple(features)))
        if self.spec.positions == LAST:
            self.entries = rows
        else:
            self.entries.extend(rows)


@dataclass
class Capture:
    """Rows of one forward pass that record at a layer: batch row, the first
    column holding its tokens, their absolute positions and ids."""

    row: int
    column: int
    positions: list[int]
    token_ids: list[int]
    recorder: ActivationRecorder


@dataclass
class ForwardSteering:
    """One forward pass's steering: layer -> [rows, d] deltas, layer -> captures,
    and layer -> the monitoring probes' reads (probes.MonitorRead)."""

    deltas: dict[int, torch.Tensor]
    captures: dict[int, list[Capture]]
    monitors: dict[int, list] = field(default_factory=dict)


def stack_deltas(per_row: list[dict[int, torch.Tensor] | None],
                 runtime: SteeringRuntime) -> dict[int, torch.Tensor]:
    """Per-row deltas as one [rows, d] tensor per layer (zeros for rows that
    are not steered there)."""
    layers = sorted({layer for d in per_row if d for layer in d})
    out = {}
    for layer in layers:
        stacked = torch.zeros((len(per_row), runtime.hidden_size), dtype=runtime.dtype,
                              device=runtime.device)
        for r, deltas in enumerate(per_row):
            if deltas and layer in deltas:
                stacked[r] = deltas[layer]
        out[layer] = stacked
    return out


class SteeringRuntime:
    """The hooks on one loaded model. Touched only on the model thread.

    Every decoder layer has its hook from the start, inert unless a pass
    hands it something: attaching or detaching an SAE then changes which
    requests validated afterwards can steer or read there, while a request
    already running keeps exactly the steering it was validated with."""

    def __init__(self, model, layers):
        """`layers`: the model's decoder layers, in order (found by the engine,
        engines/transformers/architecture.py)."""
        self.layers = layers
        self.hidden_size = int(model.config.get_text_config(decoder=True).hidden_size)
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.current: ForwardSteering | None = None
        self._handles = [layer.register_forward_hook(self._hook(i))
                         for i, layer in enumerate(self.layers)]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @contextlib.contextmanager
    def applying(self, steering: ForwardSteering | None):
        self.current = steering
        try:
            yield
        finally:
            self.current = None

    @contextlib.contextmanager
    def suppressed(self):
        """Every hook inert for the enclosed pass (scoring, embeddings)."""
        saved, self.current = self.current, None
        try:
            yield
        finally:
            self.current = saved

    def _hook(self, layer: int):
        def hook(module, args, output):
            steering = self.current
            if steering is None:
                return None
            delta = steering.deltas.get(layer)
            captures = steering.captures.get(layer, ())
            reads = steering.monitors.get(layer)
            if delta is None and not captures and not reads:
                return None
            hidden = output[0] if isinstance(output, tuple) else output
            if reads:  # monitoring reads at pre_steering
                read_layer(hidden, reads)
            for c in captures:
                if c.recorder.spec.read_point == PRE_STEERING:
                    c.recorder.record(hidden[c.row, c.column:], c.positions, c.token_ids)
            if delta is not None:
                hidden = hidden + delta.to(hidden.dtype).unsqueeze(1)
            for c in captures:
                if c.recorder.spec.read_point != PRE_STEERING:
                    c.recorder.record(hidden[c.row, c.column:], c.positions, c.token_ids)
            if delta is None:
                return None
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        return hook
