"""Continuous batching on the GGUF engine: several sequences in one llama.cpp context.

One llama.cpp context holds `slots` sequences (its n_seq_max) over a unified
KV cache of slots x window cells. Every step builds one llama_batch: for each
running row, the next chunk of its prompt or the token it sampled last, under
its slot's sequence id; one llama_decode computes them all, and each row draws
from its own logits (llama_sampler_sample at its batch index) with its own
sampler chain and grammar mask. A row that finishes or whose caller left
frees its slot at once, and the next waiting prompt takes it at the next step,
as in llama.cpp's own server.

A slot keeps the tokens its last sequence left in the cache: a new prompt
takes the free slot sharing its longest prefix with it and evaluates only the
rest (the prefix cache, reported as cached_tokens).

A seeded request runs alone, from an empty slot: batch shapes change the last
bits of llama.cpp's logits, so its text would otherwise depend on what runs
beside it (what SEED_SCOPE_REQUEST promises it does not).
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field

from service.engines import faults
from service.errors import batch_reset, internal_error
from service.generation.job import (
    ChoiceDelta,
    FinishReason,
    GenerationJob,
    GroupDone,
    StepOutput,
)
from service.requests.generation import PromptGroup
from service.text_output import ByteLevelDetokenizer, StopMatcher

log = logging.getLogger(__name__)


@dataclass
class Slot:
    seq: int
    tokens: list[int] = field(default_factory=list)  # what its KV cells hold, in order
    row: Row | None = None
    used: int = 0  # step of its last use, to evict the least recent


@dataclass
class Row:
    """One prompt group (one choice: n = 1 on GGUF) while it runs."""

    job: GenerationJob
    group: PromptGroup
    slot: Slot
    sampler: object
    mask: object  # GrammarMask or None
    pending: list[int]  # tokens still to evaluate (prompt, then the last sampled one)
    cached: int
    detokenizer: ByteLevelDetokenizer
    stopper: StopMatcher
    generated: int = 0
    batch_index: int = -1  # where its logits are in this step's batch; -1: none

    @property
    def need(self) -> int:
        """Cells this row may still fill."""
        return len(self.pending) + self.group.max_tokens - self.generated


def common_prefix(a: list[int], b: tuple[int, ...], limit: int) -> int:
    same = 0
    while same < limit and a[same] == b[same]:
        same += 1
    return same


class Slots:
    """The sequences of the batch context, and which row runs in each."""

    def __init__(self, count: int, cells: int):
        self.slots = [Slot(i) for i in range(count)]
        self.cells = cells
        self.clock = 0

    @property
    def rows(self) -> list[Row]:
        return [s.row for s in self.slots if s.row is not None]

    def held(self) -> int:
        return sum(len(s.tokens) for s in self.slots)

    def idle_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.slots if s.row is None)

    def pick(self, prompt: tuple[int, ...], fresh: bool) -> tuple[Slot, int] | None:
        """The free slot to run `prompt` in, and the tokens it can keep (at
        least one prompt token is evaluated again, so its logits are fresh);
        None while every slot is busy."""
        free = [s for s in self.slots if s.row is None]
        if not free:
            return None
        if fresh:
            return min(free, key=lambda s: s.used), 0
        best = max(free, key=lambda s: (common_prefix(s.tokens, prompt, min(
            len(s.tokens), len(prompt) - 1)), -s.used))
        return best, common_prefix(best.tokens, prompt, min(len(best.tokens), len(prompt) - 1))

    def fits(self, need: int, keep: Slot, same: int) -> bool:
        """Whether a row keeping `same` cells of `keep` and filling `need` more
        fits beside what every other slot holds and the running rows may
        still write."""
        held = sum(len(s.tokens) for s in self.slots if s is not keep) + same
        growth = sum(s.row.need for s in self.slots if s.row is not None)
        return held + growth + need <= self.cells


def step_batch(rows: list[Row], capacity: int, batch) -> list[Row]:
    """Fill `batch` (a llama_batch) with each row's next tokens, prompt chunks
    cut to fit `capacity`; returns the rows whose logits this step produces."""
    batch.n_tokens = 0
    sampling = []
    room = capacity
    for row in rows:
        if room == 0:
            row.batch_index = -1
            continue
        chunk = row.pending[:room]
        start = len(row.slot.tokens)
        for offset, token in enumerate(chunk):
            j = batch.n_tokens + offset
            batch.token[j] = token
            batch.pos[j] = start + offset
            batch.n_seq_id[j] = 1
            batch.seq_id[j][0] = row.slot.seq
            batch.logits[j] = False
        batch.n_tokens += len(chunk)
        room -= len(chunk)
        row.slot.tokens.extend(chunk)
        del row.pending[:len(chunk)]
        if row.pending:
            row.batch_index = -1  # still reading its prompt
        else:
            row.batch_index = batch.n_tokens - 1
            batch.logits[row.batch_index] = True
            sampling.append(row)
    return sampling


def take_token(row: Row, token: int, eog: frozenset[int], ignore_eos: bool
               ) -> tuple[ChoiceDelta, bool]:
    """The sampled token's delta, and whether the row is done."""
    row.generated += 1
    index = row.group.first_index
    if token in eog and not ignore_eos:
        text, hit = row.stopper.push(row.detokenizer.flush())
        text = text if hit else text + row.stopper.flush()
        return ChoiceDelta(index, text, (token,), FinishReason.STOP), True
    text, hit = row.stopper.push(row.detokenizer.push(token))
    if hit:
        return ChoiceDelta(index, text, (token,), FinishReason.STOP), True
    if row.generated >= row.group.max_tokens:
        tail, hit = row.stopper.push(row.detokenizer.flush())
        text += tail if hit else tail + row.stopper.flush()
        return ChoiceDelta(index, text, (token,), FinishReason.LENGTH), True
    row.pending.append(token)
    return ChoiceDelta(index, text, (token,)), False


@dataclass
class Waiting:
    job: GenerationJob
    groups: collections.deque


class Runner:
    """The GGUF model thread's generation work: admission into slots, one
    batched decode per step, sampling, and the events each job gets.

    `new_row_tools(spec, seed)` gives a row its (sampler chain, grammar mask);
    `counts` is the engine's counters (taken under its lock); a job whose
    reader leaves its events untaken for `stall_s` is abandoned."""

    def __init__(self, ctx, batch, n_batch: int, slots: Slots, eog: frozenset[int],
                 new_row_tools, token_bytes: list[bytes], counts, stall_s: float = 30.0):
        self.ctx, self.batch, self.n_batch, self.stall_s = ctx, batch, n_batch, stall_s
        self.slots, self.eog, self.new_row_tools = slots, eog, new_row_tools
        self.token_bytes, self.counts = token_bytes, counts
        self.waiting: collections.deque[Waiting] = collections.deque()
        self.groups_left: dict[int, int] = {}  # id(job) -> groups not yet done, once admitted

    # -- memory -------------------------------------------------------------------------

    def forget(self, slot: Slot, keep: int) -> None:
        """Drop the cells of `slot` from position `keep` on."""
        from llama_cpp import llama_cpp as lib

        lib.llama_memory_seq_rm(self.ctx.memory, slot.seq, keep, -1)
        del slot.tokens[keep:]

    def clear_idle(self) -> int:
        freed = 0
        for slot in self.slots.slots:
            if slot.row is None and slot.tokens:
                freed += len(slot.tokens)
                self.forget(slot, 0)
        return freed

    # -- jobs ---------------------------------------------------------------------------

    def add(self, job: GenerationJob) -> None:
        self.waiting.append(Waiting(job, collections.deque(job.spec.groups)))

    def _end(self, job: GenerationJob, outcome: str) -> None:
        if job.outcome is not None:
            return
        job.outcome = outcome
        if self.groups_left.pop(id(job), None) is not None:
            self.counts("running", -1)
        self.counts(outcome, 1)

    def drop_cancelled(self) -> None:
        for waiting in [w for w in self.waiting if w.job.cancelled.is_set()]:
            self.waiting.remove(waiting)
            self.counts("waiting", -1)
            self._end(waiting.job, "cancelled")
        for row in self.slots.rows:
            if row.job.cancelled.is_set():
                row.slot.row = None  # its cells stay: a prefix a later prompt may reuse
                self._end(row.job, "cancelled")

    def admit(self) -> None:
        while self.waiting:
            waiting = self.waiting[0]
            job, group = waiting.job, waiting.groups[0]
            running = self.slots.rows
            seeded = job.spec.seed is not None
            if any(r.job.spec.seed is not None for r in running) or (seeded and running):
                return  # a seeded group runs alone
            picked = self.slots.pick(group.prompt_ids, fresh=seeded)
            if picked is None:
                return
            slot, same = picked
            need = len(group.prompt_ids) - same + group.max_tokens
            if not self.slots.fits(need, slot, same):
                for other in self.slots.slots:  # idle prefixes give their cells back
                    if other.row is None and other is not slot and other.tokens:
                        self.forget(other, 0)
                if not self.slots.fits(need, slot, same) and running:
                    return  # waits for running rows to leave
            self.forget(slot, same)
            waiting.groups.popleft()
            if not waiting.groups:
                self.waiting.popleft()
                self.counts("waiting", -1)
            if id(job) not in self.groups_left:
                self.groups_left[id(job)] = len(job.spec.groups)
                self.counts("running", 1)
            self.counts("cache_hits", same)
            try:
                sampler, mask = self.new_row_tools(job.spec, group.row_seeds[0] & 0xFFFFFFFF)
            except Exception:
                log.exception("a row could not be set up; its request fails alone")
                self.fail_job(job, internal_error())
                continue
            self.slots.clock += 1
            slot.used = self.slots.clock
            slot.row = Row(job, group, slot, sampler, mask, list(group.prompt_ids[same:]), same,
                           ByteLevelDetokenizer(self.token_bytes), StopMatcher(job.spec.stop))
            if seeded:
                return

    # -- one step -----------------------------------------------------------------------

    def step(self) -> None:
        rows = sorted(self.slots.rows, key=lambda r: len(r.pending) > 1)  # decoding first
        sampling = step_batch(rows, self.n_batch, self.batch.batch)
        if self.batch.batch.n_tokens == 0:
            return
        try:
            faults.hit("decode")
            self.ctx.decode(self.batch)
        except Exception:
            log.exception("llama_decode failed; failing the batch's requests")
            self.fail_running(batch_reset())
            return
        per_job: dict[int, tuple[GenerationJob, list[ChoiceDelta]]] = {}
        finished: list[Row] = []
        failed: dict[int, GenerationJob] = {}
        for row in sampling:
            if id(row.job) in failed:
                continue
            try:
                faults.hit("row")
                delta, done = self._take(row)
            except Exception:
                log.exception("a row failed to take its token; its request fails alone")
                failed[id(row.job)] = row.job
                continue
            per_job.setdefault(id(row.job), (row.job, []))[1].append(delta)
            if done:
                finished.append(row)
        for job in failed.values():
            self.fail_job(job, internal_error())
        self.counts("generated", len(sampling))
        for key, (job, deltas) in per_job.items():
            if key in failed:
                continue
            job.post(StepOutput(tuple(deltas)))
            if job.stalled(self.stall_s):
                job.abandon()  # its rows leave at the next turn
        for row in finished:
            if id(row.job) in failed:
                continue
            row.slot.row = None
            row.job.post(GroupDone(row.generated, row.cached))
            key = id(row.job)
            if key in self.groups_left:
                self.groups_left[key] -= 1
                if self.groups_left[key] == 0:
                    self._end(row.job, "done")

    def _take(self, row: Row) -> tuple[ChoiceDelta, bool]:
        """Sample the row's token (under its grammar mask) and take it."""
        if row.mask is not None:
            row.mask.apply(self.ctx, row.batch_index)
        token = row.sampler.sample(self.ctx, row.batch_index)
        if row.mask is not None and not row.mask.accept(token):
            # The mask allowed only tokens the grammar accepts; the document
            # check after the choice ends refuses the output.
            log.error("grammar refused a token its own mask allowed")
        return take_token(row, token, self.eog, row.job.spec.ignore_eos)

    def fail_job(self, job: GenerationJob, error) -> None:
        """One request fails alone: its rows leave their slots (emptied: a row
        may have failed halfway through its step) and its waiting groups go."""
        job.fail_from_thread(error)
        for row in self.slots.rows:
            if row.job is job:
                row.slot.row = None
                self.forget(row.slot, 0)
        for waiting in [w for w in self.waiting if w.job is job]:
            self.waiting.remove(waiting)
            self.counts("waiting", -1)
        self._end(job, "failed")

    def fail_running(self, error) -> None:
        """Fail every running row's request and empty its slot (its cells may
        hold half a step)."""
        for row in self.slots.rows:
            row.job.fail_from_thread(error)
            row.slot.row = None
            self.forget(row.slot, 0)
            self._end(row.job, "failed")

    def fail_all(self, error) -> None:
        """The thread cannot go on: fail what runs and what waits."""
        self.fail_running(error)
        for waiting in self.waiting:
            waiting.job.fail_from_thread(error)
            self._end(waiting.job, "failed")
        self.waiting.clear()

    def stop(self) -> None:
        for waiting in self.waiting:
            waiting.job.cancelled.set()
        for row in self.slots.rows:
            row.job.cancelled.set()
