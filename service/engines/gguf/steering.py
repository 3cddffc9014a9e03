"""The GGUF engine's way of applying a steering plan (steering/plan.py): per
row of a continuous batch, on llama.cpp's residual stream.

Each llama.cpp context the engine generates in gets an eval callback
(steer_cb.c, built by engines/gguf/native.py) and one `ContextSteer`: the
tables that callback reads. Before each llama_decode, `prepare` writes, for
every layer some row of the batch steers or reads, each batch token's vector
row and capture rows; the callback adds the vectors to `l_out-<il>` (the
residual stream after block il, the SAE's blocks.<il>.hook_resid_post) as
llama.cpp computes it, so the next block reads the steered stream. A row
without steering is never touched, and a step in which no row steers or
reads asks llama.cpp for no tensor at all: its graph runs in one piece, as
without the callback. After the decode, `collect` hands the copied rows to
the SAE encoder activation readout shares with the transformers engine
(steering/recording.py) and to the monitoring probes (kept, and scored
many steps at a time by `flush`, before a monitored row reports done).

llama.cpp computes the last block only for tokens whose logits are kept; a
row that reads prompt positions at the last block keeps logits for its whole
chunk (`needs_all_outputs`), so those positions exist.

Whether a model's graph names its residual stream so is found at load
(`discover`, run by steer_load.py): an architecture whose blocks are not all
reachable is served unsteerable, and steering fields are refused on it. A
slot's kept probe scores are slot_scores.py's.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np
import torch

from service.engines.gguf.slot_scores import keep_scores
from service.steering.conditions import RowConditions
from service.steering.plan import (
    PRE_STEERING,
    ActivationSpec,
    ConditionReader,
    SteeringPlan,
    condition_readers,
)
from service.steering.probes import LayerProbes, ProbeReader
from service.steering.recording import ActivationRecorder

IDLE, APPLY, DISCOVER = 0, 1, 2
# Probe reads kept before one encode scores them all: an encode per step
# would cost a tiny model more than its decode.
PROBE_BATCH = 256
_i32p = ctypes.POINTER(ctypes.c_int32)
_f32p = ctypes.POINTER(ctypes.c_float)
_u8p = ctypes.POINTER(ctypes.c_uint8)


class _State(ctypes.Structure):
    """steer_cb.c's millm_steer, field for field."""

    _fields_ = [("n_embd", ctypes.c_int32), ("n_layer", ctypes.c_int32),
                ("mode", ctypes.c_int32), ("n_tokens", ctypes.c_int32),
                ("n_outputs", ctypes.c_int32), ("cap", ctypes.c_int32),
                ("errors", ctypes.c_int32), ("applied", ctypes.c_int32),
                ("out_tokens", _i32p), ("layer_on", _u8p), ("vectors", _f32p),
                ("token_vector", _i32p), ("token_pre", _i32p), ("token_post", _i32p),
                ("pre_buf", _f32p), ("post_buf", _f32p), ("seen", _u8p),
                ("token_edit", _i32p), ("token_edits", _i32p), ("edit_read", _f32p),
                ("edit_move", _f32p), ("edit_args", _f32p)]


def _ptr(array: np.ndarray, kind):
    return array.ctypes.data_as(kind)


def _outputs(logits, n_tokens: int) -> list[int]:
    """The batch indices whose logits are kept, from the batch's flags (a
    ctypes int8 pointer, or a list): read flag by flag for a decode step's
    few tokens, where a numpy view of the pointer costs more than the loop."""
    if isinstance(logits, list) or n_tokens <= 64:
        return [i for i in range(n_tokens) if logits[i]]
    return np.flatnonzero(np.ctypeslib.as_array(logits, shape=(n_tokens,))).tolist()


@dataclass
class RowSteering:
    """One row's steering and reads, for its whole life in a slot."""

    plan: SteeringPlan | None
    recorder: ActivationRecorder | None
    monitor: ProbeReader | None
    prompt_len: int
    last_layer: int
    # Set by prepare for the step: (capture kind, layer, buffer rows) to collect.
    reads: list = field(default_factory=list)
    # The plan's conditions as this row generates (RowConditions), or a
    # finished sequence's (Replayed); None when the plan has none.
    conditions: object = None

    @staticmethod
    def of(plan: SteeringPlan | None, activations: ActivationSpec | None,
           monitor: ProbeReader | None, prompt_len: int, last_layer: int
           ) -> RowSteering | None:
        if plan is None and activations is None and monitor is None:
            return None
        recorder = (ActivationRecorder(activations, prompt_len)
                    if activations is not None else None)
        conditions = (RowConditions(plan.conditions, plan.aborts)
                      if plan is not None and plan.conditional else None)
        return RowSteering(plan, recorder, monitor, prompt_len, last_layer,
                           conditions=conditions)

    @property
    def scored(self) -> bool:
        """Reads conditions from the stream: it must evaluate its own prompt."""
        return self.plan is not None and self.plan.scored

    def runs(self, first: int, count: int) -> list:
        """What the plan does at positions first..first+count-1: (offset,
        length, plan.LayerOps per layer) runs."""
        if self.plan is None:
            return []
        return self.plan.runs(self.conditions, first, count)

    def __post_init__(self):
        # Fixed for the row's life, so worked out once: (pre or post, layer,
        # what reads there) for each read, and the two questions below.
        out = []
        if self.recorder is not None:
            spec = self.recorder.spec
            out.append(("pre" if spec.read_point == PRE_STEERING else "post", spec.layer,
                        self.recorder))
        if self.monitor is not None:
            out.extend(("pre", layer.layer, layer) for layer in self.monitor.spec.layers)
        if self.conditions is not None:
            out.extend(("pre", r.spec.layer, r)
                       for r in condition_readers(self.plan, self.conditions.read))
        self.layer_reads: tuple = tuple(out)
        self.pre_reads = sum(1 for kind, _, _ in out if kind == "pre")
        self.post_reads = len(out) - self.pre_reads
        # Whether its prompt positions must be computed here (not reused): a
        # readout of them must. Probes need not: a slot keeps the scores its
        # monitored rows' positions got, and a prompt reusing its cells under
        # the same probes replays them (replay_scores).
        self.reads_prompt = (self.recorder is not None
                             and self.recorder.spec.reads_prompt(self.prompt_len))
        # Whether it reads every token of its chunk at the last block.
        self.all_outputs = any(layer == self.last_layer for _, layer, reader in out
                               if isinstance(reader, LayerProbes)) or (
            self.recorder is not None and self.recorder.spec.layer == self.last_layer
            and self.reads_prompt)

    def needs_all_outputs(self) -> bool:
        return self.all_outputs


@dataclass
class BatchPart:
    """Where one row's tokens sit in this step's batch."""

    steer: RowSteering
    start: int  # first batch index
    count: int
    first_position: int
    token_ids: list[int]
    # The slot's probe scores (Slot.scores), which this step's reads extend.
    scores: dict | None = None


class ContextSteer:
    """The callback's tables for one llama.cpp context (shared, lane or reader)."""

    def __init__(self, n_embd: int, n_layer: int, capacity: int):
        self.n_embd, self.n_layer, self.cap = n_embd, n_layer, capacity
        self.state = _State(n_embd=n_embd, n_layer=n_layer, mode=IDLE, cap=capacity)
        self.out_tokens = np.zeros(capacity, dtype=np.int32)
        self.layer_on = np.zeros(n_layer, dtype=np.uint8)
        self.seen = np.zeros(n_layer, dtype=np.uint8)
        self.token_vector = np.full((n_layer, capacity), -1, dtype=np.int32)
        self.token_pre = np.full((n_layer, capacity), -1, dtype=np.int32)
        self.token_post = np.full((n_layer, capacity), -1, dtype=np.int32)
        self.vectors = np.zeros((8, n_embd), dtype=np.float32)
        self.token_edit = np.full((n_layer, capacity), -1, dtype=np.int32)
        self.token_edits = np.zeros((n_layer, capacity), dtype=np.int32)
        self.edit_read = np.zeros((4, n_embd), dtype=np.float32)
        self.edit_move = np.zeros((4, n_embd), dtype=np.float32)
        self.edit_args = np.zeros((4, 3), dtype=np.float32)
        self.pre_buf = np.zeros((8, n_embd), dtype=np.float32)
        self.post_buf = np.zeros((8, n_embd), dtype=np.float32)
        s = self.state
        s.out_tokens, s.layer_on = _ptr(self.out_tokens, _i32p), _ptr(self.layer_on, _u8p)
        s.token_vector = _ptr(self.token_vector, _i32p)
        s.token_pre, s.token_post = _ptr(self.token_pre, _i32p), _ptr(self.token_post, _i32p)
        s.seen = _ptr(self.seen, _u8p)
        s.token_edit, s.token_edits = _ptr(self.token_edit, _i32p), _ptr(self.token_edits, _i32p)
        self._point_buffers()
        self._parts: list[BatchPart] = []
        self._touched = 0  # batch tokens whose table entries may be set
        # What this decode set, so that clearing touches only that: (table
        # name, layer) pairs, and the layers asked of the callback.
        self._set: set = set()
        self._layers: set[int] = set()
        self._used = {"pre": 0, "post": 0}  # rows of each capture buffer this decode fills
        # Probe reads not scored yet: (LayerProbes, rows, ProbeReader, positions).
        self._probe_rows: list = []
        self._probe_count = 0

    @property
    def user_data(self) -> ctypes.c_void_p:
        return ctypes.c_void_p(ctypes.addressof(self.state))

    def _point_buffers(self) -> None:
        s = self.state
        s.vectors = _ptr(self.vectors, _f32p)
        s.pre_buf, s.post_buf = _ptr(self.pre_buf, _f32p), _ptr(self.post_buf, _f32p)
        s.edit_read, s.edit_move = _ptr(self.edit_read, _f32p), _ptr(self.edit_move, _f32p)
        s.edit_args = _ptr(self.edit_args, _f32p)

    def _room(self, vectors: int, pre: int, post: int, edits: int = 0) -> None:
        grown = False
        for name, rows in (("vectors", vectors), ("pre_buf", pre), ("post_buf", post),
                           ("edit_read", edits), ("edit_move", edits), ("edit_args", edits)):
            current = getattr(self, name)
            if rows > current.shape[0]:
                setattr(self, name, np.zeros((max(rows, 2 * current.shape[0]),
                                              current.shape[1]), dtype=np.float32))
                grown = True
        if grown:
            self._point_buffers()

    # -- one decode -------------------------------------------------------------------

    def prepare(self, parts: list[BatchPart], n_tokens: int, logits) -> None:
        """Fill the tables for this decode; `logits` is the batch's output flags."""
        self._clear()
        self._parts = parts
        if not parts:
            return
        self._touched = n_tokens  # set first: a failed prepare is still cleared
        vectors = pre = post = edits = 0
        planned = []
        for p in parts:
            runs = p.steer.runs(p.first_position, p.count)
            planned.append(runs)
            for _, _, ops in runs:
                vectors += sum(1 for o in ops.values() if o.add is not None)
                edits += sum(len(o.edits) for o in ops.values())
            pre += p.count * p.steer.pre_reads
            post += p.count * p.steer.post_reads
        self._room(vectors, pre, post, edits)
        v = e = pre_row = post_row = 0
        token_vector = self.token_vector
        touched, layers = self._set, self._layers
        for part, runs in zip(parts, planned, strict=True):
            start, count = part.start, part.count
            end = start + count
            for offset, length, ops in runs:
                first, last = start + offset, start + offset + length
                for layer, op in ops.items():
                    layers.add(layer)
                    if op.add is not None:
                        self.vectors[v] = op.add
                        token_vector[layer, first:last] = v
                        touched.add(("vector", layer))
                        v += 1
                    if op.edits:
                        touched.add(("edit", layer))
                        m = len(op.edits)
                        self.token_edit[layer, first:last] = e
                        self.token_edits[layer, first:last] = m
                        self.edit_read[e:e + m], self.edit_move[e:e + m] = op.reads, op.moves
                        self.edit_args[e:e + m] = op.args
                        e += m
            reads = part.steer.reads = []
            for kind, layer, reader in part.steer.layer_reads:
                table = self.token_pre if kind == "pre" else self.token_post
                first = pre_row if kind == "pre" else post_row
                if count == 1:
                    table[layer, start] = first
                else:
                    table[layer, start:end] = np.arange(first, first + count, dtype=np.int32)
                if kind == "pre":
                    pre_row += count
                else:
                    post_row += count
                touched.add((kind, layer))
                layers.add(layer)
                reads.append((kind, reader, first))
        for layer in layers:
            self.layer_on[layer] = 1
        self._used = {"pre": pre_row, "post": post_row}
        outputs = _outputs(logits, n_tokens)
        self.out_tokens[:len(outputs)] = outputs
        s = self.state
        s.n_tokens, s.n_outputs, s.errors, s.applied = n_tokens, len(outputs), 0, 0
        s.mode = APPLY
        self._touched = n_tokens

    def _clear(self) -> None:
        if self._touched:
            n = self._touched
            tables = {"vector": self.token_vector, "edit": self.token_edit,
                      "pre": self.token_pre, "post": self.token_post}
            for name, layer in self._set:
                tables[name][layer, :n] = -1
                if name == "edit":
                    self.token_edits[layer, :n] = 0
            for layer in self._layers:
                self.layer_on[layer] = 0
            self._set.clear()
            self._layers.clear()
            self._touched = 0
        self.state.mode = IDLE

    def collect(self) -> int:
        """After the decode: hand each read its rows; returns the tensors the
        callback found laid out unexpectedly (0 when all went as planned)."""
        errors = int(self.state.errors)
        if self._parts and self.state.applied != len(self._layers):
            errors += 1  # a layer planned for was never handed over
        kept: dict[str, np.ndarray] = {}  # a buffer's rows copied once for the probes
        for part in self._parts:
            positions = list(range(part.first_position, part.first_position + part.count))
            for kind, reader, first in part.steer.reads:
                buffer = self.pre_buf if kind == "pre" else self.post_buf
                if isinstance(reader, LayerProbes):  # scored later, many steps at once (flush)
                    if kind not in kept:
                        kept[kind] = buffer[:self._used[kind]].copy()
                    self._probe_rows.append((reader, kept[kind][first:first + part.count],
                                             part.steer.monitor, positions, part.scores))
                    self._probe_count += part.count
                elif isinstance(reader, ConditionReader):
                    reader.record(buffer[first:first + part.count], positions, part.token_ids)
                else:
                    reader.record(torch.from_numpy(buffer[first:first + part.count]), positions,
                                  part.token_ids)
        self._parts = []
        self._clear()
        if self._probe_count >= PROBE_BATCH:
            self.flush()
        return errors

    def flush(self) -> None:
        """Score the probe reads kept since the last flush: one SAE encode per
        probe layer. Called before a monitored row reports that it is done, so
        its verdicts are whole when its request reads them."""
        by_layer: dict[int, list] = {}  # id(LayerProbes) -> its reads
        for read in self._probe_rows:
            by_layer.setdefault(id(read[0]), []).append(read)
        self._probe_rows, self._probe_count = [], 0
        for group in by_layer.values():
            layer: LayerProbes = group[0][0]
            hidden = np.concatenate([read[1] for read in group])
            owners = ([(monitor, p) for _, _, monitor, positions, _ in group for p in positions]
                      if layer.contexts is not None else None)
            scores = layer.read(torch.from_numpy(hidden), owners)
            at = 0
            for _, rows, monitor, positions, kept in group:
                mine = scores[at:at + len(rows)]
                monitor.read(layer, positions, mine)
                if kept is not None:
                    keep_scores(kept, monitor.spec.layers.index(layer), positions, mine)
                at += len(rows)

    # -- load -------------------------------------------------------------------------

    def discover(self) -> None:
        self.seen[:] = 0
        self.state.mode = DISCOVER

    def reachable(self) -> bool:
        self.state.mode = IDLE
        return bool(self.seen.all())
