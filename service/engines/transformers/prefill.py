"""Chunked prefill: a prompt is computed a chunk of columns per scheduler turn.

A 20,000-token prompt computed in one forward pass holds the model thread
for as long as that pass takes, and every running stream waits that long for
its next token. So an admitted prompt becomes a `Prefill`: its groups'
prompts, left-padded to a common width as before, whose columns are fed to
the model a chunk at a time over a KV cache that grows with each chunk. The
scheduler (scheduler.py) runs at most `prefill_chunk` computed token slots
(columns x groups) of prefill per turn, then one decode step of every lane,
so a running stream gets a token every turn while a long prompt is read.
Only when the last column is computed are the first tokens sampled and the
rows handed to a lane (batch.Prefilled), exactly as a one-pass prefill did.

Which prefill goes first in a turn: the one with the least left to compute,
so a short prompt is not queued behind a long one; one that started more
than the admission aging time ago goes before those, so a long prompt is not
starved by a stream of short ones either.

A seeded group's chunks always cut its prompt at the same columns (multiples
of the chunk size, from column 0: seeded groups never read the prefix cache),
whatever else runs: its logits, and so its text, depend on the request alone.
An unseeded prefill takes what the turn has left, so its cuts vary with the
traffic, as its batch neighbours already do.

A lone unseeded prompt whose leading blocks are in the prefix cache starts
after them (cached_tokens); every full block is stored once the prompt is
complete. Per-request steering deltas apply to every chunk, and activation
captures and monitoring probes read each chunk's own columns.
"""

from __future__ import annotations

import logging
import time

import torch

from service.engines import faults
from service.engines.transformers import grouped_query, kv
from service.engines.transformers.batch import (
    GroupProgress,
    ModelContext,
    Prefilled,
    Row,
    _steered,
    penalty_state,
    sample,
)
from service.engines.transformers.decode_mask import prefix_mask
from service.engines.transformers.steering import Capture, ForwardSteering, build, row_ops
from service.steering.conditions import RowConditions
from service.steering.probes import add_reads

log = logging.getLogger(__name__)


class Prefill:
    """Groups prefilled together (left-padded), a chunk of columns at a time.

    A lone unseeded group may start from cached prefix blocks; groups
    prefilled together never do, so they share one starting column.
    `isolated` (a seeded group): a lane of its own once prefilled, no cache
    read, and chunks cut at multiples of the chunk size.
    """

    def __init__(self, ctx: ModelContext, progresses: list[GroupProgress], prefix_cache,
                 isolated: bool, started: float):
        self.ctx, self.progresses, self.prefix_cache = ctx, progresses, prefix_cache
        self.isolated, self.started = isolated, started
        read_cache = not isolated
        device = ctx.device
        prompts = [p.group.prompt_ids for p in progresses]
        cached, layers = (0, [])
        if (read_cache and ctx.reuses_prefixes and len(progresses) == 1
                and not progresses[0].steered_or_reading):
            # Room behind the prefix for the rest of the prompt and the first
            # steps, so that no pass copies the prefix again.
            cached, layers = prefix_cache.lookup(prompts[0],
                                                 columns=len(prompts[0]) + kv.SPARE_COLUMNS)
            if not progresses[0].continuation:
                progresses[0].cached_tokens = cached
        self.width = width = max(len(p) for p in prompts)
        # ids and positions hold columns [first, width): a lone prompt's
        # cached columns are never fed to the model again.
        self.first = cached
        if len(prompts) == 1:  # no padding
            self.ids = torch.tensor(prompts[0][cached:], dtype=torch.long, device=device)[None]
            self.mask = torch.ones((1, width), dtype=torch.long, device=device)
            self.positions = torch.arange(cached, width, device=device)[None]
        else:
            self.ids = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
            self.mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
            self.positions = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
            for i, prompt in enumerate(prompts):
                start = width - len(prompt)
                self.ids[i, start:] = torch.tensor(prompt, dtype=torch.long, device=device)
                self.mask[i, start:] = 1
                self.positions[i, start:] = torch.arange(len(prompt), device=device)
        config = ctx.model.config
        self.cache = kv.from_prefix(config, layers, cached) if cached else kv.new_cache(config)
        self.done = cached  # columns computed (or taken from the prefix cache)
        self._deltas = None

    @property
    def jobs(self) -> list:
        return list({id(p.job): p.job for p in self.progresses}.values())

    @property
    def rows(self) -> int:
        """Batch rows it will hand to a lane (each group's n)."""
        return sum(p.group.n for p in self.progresses)

    @property
    def remaining(self) -> int:
        """Token slots (columns x groups) still to compute."""
        return (self.width - self.done) * len(self.progresses)

    def next_columns(self, budget: int, chunk: int) -> int:
        """Columns the next forward pass computes, given the turn's budget left."""
        left = self.width - self.done
        if self.isolated:
            return min(left, chunk - self.done % chunk)
        return min(left, max(1, budget // len(self.progresses)))

    def advance(self, columns: int) -> Prefilled | None:
        """Compute the next `columns` columns; once the prompt is complete,
        sample each row's first token and return the rows (else None)."""
        faults.hit("prefill")
        start, end = self.done, min(self.width, self.done + columns)
        steering = self._steering(start, end)
        with _steered(self.ctx, steering), grouped_query.multi_column(
                self.ctx.grouped_prompts and end - start > 1):
            out = self.ctx.model(
                input_ids=self.ids[:, start - self.first:end - self.first],
                attention_mask=self._mask(start, end),
                position_ids=self.positions[:, start - self.first:end - self.first],
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=1,
            )
        self.done = end
        if end < self.width:
            return None
        return self._finish(out.logits[:, -1, :].float())

    def _mask(self, start: int, end: int) -> torch.Tensor | None:
        """Groups together: their padding mask (transformers adds the causal
        rule). A lone prompt has no padding: no mask from column 0, and after
        cached columns the causal one ready-made where that is safe
        (decode_mask.py)."""
        if len(self.progresses) > 1:
            return self.mask[:, :end]
        if start and self.ctx.ready_masks:
            return prefix_mask(start, end, self.ctx.device)
        return None

    def _finish(self, last: torch.Tensor) -> Prefilled:
        ctx, device, progresses = self.ctx, self.ctx.device, self.progresses
        prompts = [p.group.prompt_ids for p in progresses]
        if ctx.reuses_prefixes:
            computed = kv.attention_kv(self.cache)
            for i, prompt in enumerate(prompts):
                if not progresses[i].steered_or_reading:
                    self.prefix_cache.store(prompt, computed, row=i,
                                            start=self.width - len(prompt))
        # One row per choice: group i's KV is repeated for its n rows.
        owner = [i for i, p in enumerate(progresses) for _ in range(p.group.n)]
        rows = [Row(ctx, p, j) for p in progresses for j in range(p.group.n)]
        index = torch.tensor(owner, dtype=torch.long, device=device)
        cache = self.cache
        if owner != list(range(len(prompts))):
            kv.select_rows(cache, index)
        logits = last[index]
        mask = self.mask[index]
        counts, seen = penalty_state(ctx, rows, [prompts[i] for i in owner])
        results = sample(ctx, rows, logits, counts, seen)
        keep = [r for r, (_, _, done) in enumerate(results) if not done]
        if len(keep) < len(rows) and keep:
            index = torch.tensor(keep, dtype=torch.long, device=device)
            kv.select_rows(cache, index)
            mask = mask[index]
            if counts is not None:
                counts, seen = counts[index], seen[index]
        self.cache = None
        return Prefilled([rows[r] for r in keep], cache, mask, counts, seen, results)

    def _steering(self, start: int, end: int) -> ForwardSteering | None:
        """Each group's own deltas, and the captures and probe reads of the
        columns [start, end) (one batch row per group; its prompt sits in the
        last columns)."""
        ctx, progresses = self.ctx, self.progresses
        if ctx.steering is None or not any(p.steered_or_reading for p in progresses):
            return None
        # Built once, unless a condition makes a chunk's columns differ.
        span = (start, end) if any(p.plan is not None and p.plan.conditional
                                   for p in progresses) else None
        if self._deltas is None or self._deltas[0] != span:
            self._deltas = (span, build(
                [self._runs(p, start, end) for p in progresses], end - start, ctx.steering))
        captures: dict[int, list[Capture]] = {}
        monitors: dict[int, list] = {}
        for i, p in enumerate(progresses):
            prompt = p.group.prompt_ids
            offset = self.width - len(prompt)  # the prompt's first column
            first = max(start, offset)
            if first >= end:
                continue  # this chunk holds only its padding
            positions = list(range(first - offset, end - offset))
            if p.recorder is not None:
                captures.setdefault(p.recorder.spec.layer, []).append(Capture(
                    i, first - start, positions, list(prompt[first - offset:end - offset]),
                    p.recorder))
            if not p.continuation:  # a request's later parts share the prompt already read
                add_reads(monitors, p.monitor, i, first - start, positions)
            if end == self.width:  # scored conditions read the prompt's last position
                for reader in p.prompt_readers:
                    captures.setdefault(reader.spec.layer, []).append(Capture(
                        i, end - 1 - start, [len(prompt) - 1], [prompt[-1]], reader))
        deltas, edits = self._deltas[1]
        return ForwardSteering(deltas, captures, monitors, edits)

    def _runs(self, progress, start: int, end: int):
        """A group's steering over columns [start, end): its prompt's
        positions where it has them, the first run reaching back over any
        padding (which no one attends to)."""
        plan = progress.plan
        if plan is None:
            return None
        if not plan.conditional:
            return row_ops(plan, None, 0, end - start)
        offset = self.width - len(progress.group.prompt_ids)
        first = max(start, offset)
        if first >= end:
            return None
        runs = row_ops(plan, RowConditions(plan.conditions), first - offset, end - first)
        shift = first - start
        return [(0 if i == 0 else a + shift, n + shift if i == 0 else n, ops)
                for i, (a, n, ops) in enumerate(runs)]


def order(prefills: list[Prefill], now: float, aging_s: float) -> list[Prefill]:
    """Who goes first this turn (module docstring): those that started
    `aging_s` ago or more, oldest first, then the rest, least left first."""
    aged = sorted((p for p in prefills if now - p.started >= aging_s), key=lambda p: p.started)
    young = sorted((p for p in prefills if now - p.started < aging_s),
                   key=lambda p: p.remaining)
    return [*aged, *young]


class Prefills:
    """The admitted prompts being computed. `items` is only ever replaced,
    never changed in place, so status() may read it from another thread.
    `fail(job, exc)` fails a request whose lone prefill raised."""

    def __init__(self, ctx: ModelContext, prefix_cache, limits, fail):
        self.ctx, self.prefix_cache, self.limits, self.fail = ctx, prefix_cache, limits, fail
        self.items: list[Prefill] = []

    def rows(self) -> int:
        return sum(p.rows for p in self.items)

    def start(self, progresses: list[GroupProgress], isolated: bool) -> None:
        """Queue admitted parts (computed from this turn on)."""
        try:
            prefill = Prefill(self.ctx, progresses, self.prefix_cache, isolated,
                              time.monotonic())
        except Exception as exc:
            self._failed(progresses, isolated, exc)
            return
        self.items = [*self.items, prefill]

    def _failed(self, progresses: list[GroupProgress], isolated: bool, exc: Exception) -> None:
        """Parts prefilled with others start again alone; a lone one fails."""
        if len(progresses) > 1:
            log.warning("a prefill of %d parts failed (%s); retrying each alone",
                        len(progresses), type(exc).__name__)
            for progress in progresses:
                self.start([progress], isolated)
            return
        log.error("prefill failed", exc_info=exc)
        self.fail(progresses[0].job, exc)

    def drop_cancelled(self) -> list:
        """Stop computing prompts nobody waits for any more; their jobs."""
        gone = [p for p in self.items if all(job.cancelled.is_set() for job in p.jobs)]
        if gone:
            self.items = [p for p in self.items if p not in gone]
        return [job for p in gone for job in p.jobs]

    def turn(self) -> list[tuple[bool, Prefilled]]:
        """Compute this turn's share, about `prefill_chunk` token slots (the
        module docstring says who goes first); (isolated, rows) of each
        prefill now complete."""
        chunk = self.limits.prefill_chunk
        budget, done = chunk, []
        for prefill in order(self.items, time.monotonic(), self.limits.aging_s):
            if budget <= 0:
                break
            columns = prefill.next_columns(budget, chunk)
            budget -= columns * len(prefill.progresses)
            try:
                new = prefill.advance(columns)
            except Exception as exc:
                self.items = [p for p in self.items if p is not prefill]
                self._failed(prefill.progresses, prefill.isolated, exc)
                continue
            if new is not None:
                self.items = [p for p in self.items if p is not prefill]
                done.append((prefill.isolated, new))
        return done
