"""The transformers engine's way of applying a steering plan
(steering/plan.py): one forward hook per decoder layer, and the per-row state
each forward pass hands those hooks.

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

from service.steering.plan import PRE_STEERING, SteeringPlan
from service.steering.probes import read_layer
from service.steering.recording import ActivationRecorder


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


def plan_deltas(plan: SteeringPlan, runtime: SteeringRuntime) -> dict[int, torch.Tensor]:
    """The plan's vectors as tensors of the model's dtype and device."""
    return {layer: torch.from_numpy(vector).to(device=runtime.device, dtype=runtime.dtype)
            for layer, vector in plan.vectors().items()}


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
