"""The transformers engine's way of applying a steering plan
(steering/plan.py): one forward hook per decoder layer, and the per-row state
each forward pass hands those hooks.

Nothing here is global steering. Before a forward pass the batch code says,
for that pass only, what each row of the batch gets at each layer (edits,
then a delta; per column where a condition changes within the pass: `build`)
and which rows record activations (`applying`); outside such a pass every hook is
inert, which is how reading passes (scoring, embeddings) run unsteered while
steered generations share the same model. The model thread runs one forward
pass at a time, so one `current` slot is enough.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import torch

from service.steering.conditions import Replayed, RowConditions
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
class EditPass:
    """The j-th edit (plan.Edit) of every row that has one at a layer, applied
    together: rows [m] of the batch, their edits' tensors, and which of the
    pass's columns each applies to (None: all)."""

    rows: torch.Tensor  # long [m]
    read: torch.Tensor  # [m, d]
    bias: torch.Tensor  # [m]
    target: torch.Tensor  # [m]
    above: torch.Tensor  # [m]
    move: torch.Tensor  # [m, d]
    mask: torch.Tensor | None = None  # [m, columns]

    def apply(self, hidden: torch.Tensor) -> torch.Tensor:
        h = hidden[self.rows]
        reading = torch.einsum("mcd,md->mc", h, self.read) + self.bias[:, None]
        shift = torch.where(reading > self.above[:, None], self.target[:, None] - reading,
                            torch.zeros_like(reading))
        if self.mask is not None:
            shift = shift * self.mask
        return hidden.index_add(0, self.rows, shift.unsqueeze(-1) * self.move[:, None, :])


@dataclass
class ForwardSteering:
    """One forward pass's steering: layer -> deltas ([rows, d], or [rows,
    columns, d] where they differ by column), layer -> captures, layer -> the
    monitoring probes' reads (probes.MonitorRead), and layer -> edit passes."""

    deltas: dict[int, torch.Tensor]
    captures: dict[int, list[Capture]]
    monitors: dict[int, list] = field(default_factory=dict)
    edits: dict[int, list[EditPass]] = field(default_factory=dict)


# One batch row's steering in a pass: (first column, columns, plan.LayerOps per
# layer) runs, or None for a row that is not steered.
RowOps = list[tuple[int, int, dict]] | None


def row_ops(plan: SteeringPlan | None, conditions: RowConditions | Replayed | None, first: int,
            count: int) -> RowOps:
    """A row's runs over `count` columns whose first position is `first`."""
    return None if plan is None else plan.runs(conditions, first, count)


def build(per_row: list[RowOps], columns: int, runtime: SteeringRuntime
          ) -> tuple[dict[int, torch.Tensor], dict[int, list[EditPass]]]:
    """The rows' runs as the hooks' tensors: adds stacked per layer (zeros for
    rows that add nothing there) and edits as passes, in each row's order."""
    whole = all(runs is None or (len(runs) == 1 and runs[0][1] == columns) for runs in per_row)
    layers = sorted({layer for runs in per_row if runs for _, _, ops in runs for layer in ops})
    deltas, edits = {}, {}
    rows, d = len(per_row), runtime.hidden_size
    for layer in layers:
        added = [(r, a, n, ops[layer].add) for r, runs in enumerate(per_row) if runs
                 for a, n, ops in runs if layer in ops and ops[layer].add is not None]
        if added:
            shape = (rows, d) if whole else (rows, columns, d)
            stacked = torch.zeros(shape, dtype=runtime.dtype, device=runtime.device)
            for r, a, n, vector in added:
                value = torch.from_numpy(vector).to(device=runtime.device, dtype=runtime.dtype)
                if whole:
                    stacked[r] = value
                else:
                    stacked[r, a:a + n] = value
            deltas[layer] = stacked
        slots = [(r, a, n, ops[layer].edits) for r, runs in enumerate(per_row) if runs
                 for a, n, ops in runs if layer in ops and ops[layer].edits]
        passes = []
        for j in range(max((len(e) for *_, e in slots), default=0)):
            chosen = [(r, a, n, e[j]) for r, a, n, e in slots if len(e) > j]
            passes.append(_edit_pass(chosen, whole, columns, runtime))
        if passes:
            edits[layer] = passes
    return deltas, edits


def _edit_pass(chosen: list, whole: bool, columns: int, runtime: SteeringRuntime) -> EditPass:
    def stack(values):
        return torch.from_numpy(np.stack(values)).to(device=runtime.device, dtype=runtime.dtype)

    def numbers(values):
        return torch.tensor(values, device=runtime.device, dtype=runtime.dtype)

    mask = None
    if not whole:
        mask = torch.zeros((len(chosen), columns), device=runtime.device, dtype=runtime.dtype)
        for i, (_, a, n, _) in enumerate(chosen):
            mask[i, a:a + n] = 1
    edits = [e for *_, e in chosen]
    return EditPass(torch.tensor([r for r, *_ in chosen], dtype=torch.long,
                                 device=runtime.device),
                    stack([e.read for e in edits]), numbers([e.bias for e in edits]),
                    numbers([e.target for e in edits]), numbers([e.above for e in edits]),
                    stack([e.move for e in edits]), mask)


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
            passes = steering.edits.get(layer)
            captures = steering.captures.get(layer, ())
            reads = steering.monitors.get(layer)
            if delta is None and not passes and not captures and not reads:
                return None
            hidden = output[0] if isinstance(output, tuple) else output
            if reads:  # monitoring reads at pre_steering
                read_layer(hidden, reads)
            for c in captures:
                if c.recorder.spec.read_point == PRE_STEERING:
                    c.recorder.record(hidden[c.row, c.column:], c.positions, c.token_ids)
            for edit in passes or ():
                hidden = edit.apply(hidden)
            if delta is not None:
                delta = delta.to(hidden.dtype)
                hidden = hidden + (delta.unsqueeze(1) if delta.dim() == 2 else delta)
            for c in captures:
                if c.recorder.spec.read_point != PRE_STEERING:
                    c.recorder.record(hidden[c.row, c.column:], c.positions, c.token_ids)
            if delta is None and not passes:
                return None
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        return hook
