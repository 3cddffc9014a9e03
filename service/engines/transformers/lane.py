"""A lane: rows decoded together, one forward pass per step, over one KV cache.

The cache is padded on the left so that rows of different lengths line up:
row r's real tokens occupy the last `length_r` columns, an attention mask hides
the padding, and explicit position ids give each row its own positions. A row
joins a lane after its own prefill (left-padding whichever side is shorter) and
leaves it as soon as it finishes or its caller goes away; columns that no
remaining row uses are trimmed. What each layer's cache holds, and how it is
padded, selected and trimmed, is engines/transformers/kv.py's.
"""

from __future__ import annotations

import torch

from service.engines import faults
from service.engines.transformers import kv
from service.engines.transformers.batch import (
    ModelContext,
    Prefilled,
    Row,
    _steered,
    join_penalty_state,
    sample,
)
from service.engines.transformers.decode_mask import decode_mask
from service.engines.transformers.steering import Capture, ForwardSteering, build, row_ops
from service.generation.job import ChoiceDelta
from service.steering.probes import add_reads


class Lane:
    """Rows decoded together over one left-padded KV cache."""

    def __init__(self, ctx: ModelContext):
        self.ctx = ctx
        self.rows: list[Row] = []
        self.cache = None
        self.mask: torch.Tensor | None = None  # [rows, columns], 1 = real token
        self.positions: torch.Tensor | None = None  # [rows] next position id
        # Token counts, kept only while a row has a penalty (batch.penalty_state).
        self.counts: torch.Tensor | None = None
        self.seen: torch.Tensor | None = None
        self._stacked: tuple = ({}, {})
        self._stacked_for: tuple = ()

    @property
    def kv_columns(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]

    def kv_tokens(self) -> tuple[int, int]:
        """(token slots held, of which padding)."""
        if self.mask is None:
            return 0, 0
        held = self.mask.numel()
        return held, held - int(self.mask.sum())

    def add(self, new: Prefilled) -> None:
        if not new.rows:
            return
        faults.hit("merge")
        positions = new.mask.sum(dim=1)
        if not self.rows:
            self.rows, self.cache, self.mask = list(new.rows), new.cache, new.mask
            self.positions, self.counts, self.seen = positions, new.counts, new.seen
            return
        width = max(self.kv_columns, new.mask.shape[1])
        grow_old, grow_new = width - self.kv_columns, width - new.mask.shape[1]
        kv.append_rows(self.cache, new.cache, grow_old, grow_new)
        self.mask = torch.cat([kv.pad_left(self.mask, grow_old, 1),
                               kv.pad_left(new.mask, grow_new, 1)])
        self.positions = torch.cat([self.positions, positions])
        self.counts, self.seen = join_penalty_state(
            self.ctx, (self.counts, self.seen), len(self.rows), (new.counts, new.seen),
            len(new.rows))
        self.rows.extend(new.rows)

    def keep(self, keep: list[int]) -> None:
        """Keep only these rows; drop everything the others held."""
        if len(keep) == len(self.rows):
            return
        if not keep:
            self.rows, self.cache, self.mask = [], None, None
            self.positions = self.counts = self.seen = None
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.ctx.device)
        kv.select_rows(self.cache, index)
        self.mask, self.positions = self.mask[index], self.positions[index]
        self.rows = [self.rows[i] for i in keep]
        if self.counts is not None:
            # Kept only while some row has a penalty (batch.penalty_state).
            if any(row.penalised for row in self.rows):
                self.counts, self.seen = self.counts[index], self.seen[index]
            else:
                self.counts = self.seen = None
        # Columns that only departed rows used are padding for everyone left.
        first = int(torch.nonzero(self.mask.any(dim=0))[0])
        if first > 0:
            self.mask = self.mask[:, first:]
            kv.trim_columns(self.cache, first)

    def _steering(self) -> ForwardSteering | None:
        """The rows' own steering (built once per set of rows and of the
        conditions that hold on them) and captures."""
        ctx = self.ctx
        if ctx.steering is None or not any(r.progress.steered_or_reading for r in self.rows):
            return None
        recording = [i for i, row in enumerate(self.rows)
                     if row.progress.recorder is not None or row.progress.monitor is not None]
        positions = None
        if recording or any(r.conditions is not None for r in self.rows):
            positions = self.positions.tolist()  # one device sync, only when needed
        key = tuple((r.serial, None if r.conditions is None else r.conditions.active(
            positions[i])) for i, r in enumerate(self.rows))
        if self._stacked_for != key:
            self._stacked = build([row_ops(r.progress.plan, r.conditions,
                                           positions[i] if positions else 0, 1)
                                   for i, r in enumerate(self.rows)], 1, ctx.steering)
            self._stacked_for = key
        captures: dict[int, list[Capture]] = {}
        monitors: dict[int, list] = {}
        for i, row in enumerate(self.rows):
            for reader in row.condition_readers:
                captures.setdefault(reader.spec.layer, []).append(
                    Capture(i, 0, [positions[i]], [row.last_token], reader))
        if recording:
            for i in recording:
                progress = self.rows[i].progress
                if progress.recorder is not None:
                    captures.setdefault(progress.recorder.spec.layer, []).append(
                        Capture(i, 0, [positions[i]], [self.rows[i].last_token],
                                progress.recorder))
                add_reads(monitors, progress.monitor, i, 0, [positions[i]])
        deltas, edits = self._stacked
        return ForwardSteering(deltas, captures, monitors, edits)

    def step(self) -> list[tuple[Row, ChoiceDelta, bool]]:
        """One decode step for every row; finished rows leave the lane."""
        faults.hit("decode")
        device = self.ctx.device
        ids = torch.tensor([[r.last_token] for r in self.rows], dtype=torch.long, device=device)
        self.mask = torch.cat(
            [self.mask, torch.ones((len(self.rows), 1), dtype=torch.long, device=device)], dim=1
        )
        steering = self._steering()
        with _steered(self.ctx, steering):
            out = self.ctx.model(
                input_ids=ids,
                attention_mask=(decode_mask(self.mask) if self.ctx.ready_masks
                                else self.mask),
                position_ids=self.positions.unsqueeze(1),
                past_key_values=self.cache,
                use_cache=True,
            )
        self.positions = self.positions + 1
        results = sample(self.ctx, self.rows, out.logits[:, -1, :].float(), self.counts, self.seen)
        self.keep([i for i, (_, _, done) in enumerate(results) if not done])
        return results
