"""Continuous batching on the GGUF engine: several sequences in one llama.cpp context.

One llama.cpp context holds `slots` sequences (its n_seq_max) over a unified
KV cache of slots x window cells. Every step builds one llama_batch: for each
running row, the next chunk of its prompt or the token it sampled last, under
its slot's sequence id; one llama_decode computes them all, and each row draws
from its own logits at its batch index with its own sampler chain and grammar
mask (llama_sampler_sample, or for greedy rows without penalties numpy's
argmax: engines/gguf/sampling.py's GreedyArgmax). A row that finishes or whose caller left
frees its slot at once, and the next waiting prompt takes it at the next step,
as in llama.cpp's own server. (Slots, rows and the batch filling are
engines/gguf/slots.py's.)

A slot keeps the tokens its last sequence left in the cache: a new prompt
takes the free slot sharing its longest prefix with it and evaluates only the
rest (the prefix cache, reported as cached_tokens).

A seeded group runs in a lane, a context of its own (engines/gguf/lanes.py),
because what shares a context with a sequence moves the last bits of its
logits. Each step decodes the shared batch, then every lane, one after the
other on this thread: seeded rows advance beside the others, and admission
goes on while they run. Seeded and unseeded rows together never outnumber
the slots.

A request's n choices are parts of their own, sharing the prompt's cells
where they start together (engines/gguf/forks.py). Which waiting request
starts a part next is the fair-admission rule both engines share
(engines/admission.py): one request holds at most its share of the slots
(MILLM_MAX_ROWS_PER_REQUEST, by default half), one whose cells do not fit yet
lets later ones pass for MILLM_ADMISSION_AGING_S, and serial batching runs
one request at a time.
"""

from __future__ import annotations

import collections
import logging

from service.engines import faults
from service.engines.admission import FairTurns, SchedulerLimits, Waiting, background_rows
from service.engines.gguf import forks
from service.engines.gguf.lanes import Lanes
from service.engines.gguf.slot_scores import monitor_key, replay_scores
from service.engines.gguf.slots import Row, Slot, Slots, step_batch, take_token
from service.engines.gguf.steering import BatchPart
from service.engines.model_thread import out_of_memory
from service.errors import batch_reset, internal_error
from service.generation.job import ChoiceDelta, GenerationJob, GroupDone
from service.generation.step_posts import StepPosts
from service.steering.plan import plan_key
from service.text_output import ByteLevelDetokenizer, StopMatcher

log = logging.getLogger(__name__)


class Runner:
    """The GGUF model thread's generation work: admission into slots and
    lanes, one decode per step for the shared batch and one per lane,
    sampling, and the events each job gets.

    `new_row_tools(spec, seed)` gives a row its (sampler chain, grammar mask,
    log-probability scorer);
    `lanes` opens and keeps the seeded lanes; `counts` is the engine's
    counters (taken under its lock); a job whose reader leaves its events
    untaken for `stall_s` is abandoned; `limits` are the admission settings
    (engines/admission.py), their batch being the slots."""

    def __init__(self, ctx, batch, n_batch: int, slots: Slots, lanes: Lanes,
                 eog: frozenset[int], new_row_tools, token_bytes: list[bytes], counts,
                 stall_s: float = 30.0, steerer=None, steer=None,
                 limits: SchedulerLimits | None = None):
        self.ctx, self.batch, self.n_batch, self.stall_s = ctx, batch, n_batch, stall_s
        self.limits = limits or SchedulerLimits()
        self.share = self.limits.rows_per_request(len(slots.slots))  # rows one request holds
        # engines/gguf/steering.py: the model's Steerer and the shared context's
        # tables (None where the model cannot be steered).
        self.steerer, self.steer = steerer, steer
        self.slots, self.lanes, self.eog, self.new_row_tools = slots, lanes, eog, new_row_tools
        self.token_bytes, self.counts = token_bytes, counts
        self.waiting: collections.deque[Waiting] = collections.deque()
        self.groups_left: dict[int, int] = {}  # id(job) -> parts not yet done, once admitted
        self.forks = forks.Forks()  # choices waiting for their leader's prompt

    @property
    def rows(self) -> list[Row]:
        """Every running row: the shared context's, then the lanes'."""
        return [*self.slots.rows, *self.lanes.rows]

    # -- memory -------------------------------------------------------------------------

    def forget(self, slot: Slot, keep: int) -> None:
        """Drop the cells of `slot` (a shared one) from position `keep` on."""
        from llama_cpp import llama_cpp as lib

        lib.llama_memory_seq_rm(self.ctx.memory, slot.seq, keep, -1)
        del slot.tokens[keep:]
        for table in slot.scores.values():
            del table[keep:]

    def leave(self, row: Row, keep_cells: bool) -> None:
        """The row leaves its slot; a shared slot's cells stay (a prefix a later
        prompt may reuse) only when `keep_cells`. A lane is emptied before its
        next use anyway."""
        row.slot.row = None
        if (not keep_cells or not self.slots.keep_prefixes) and not self.lanes.owns(row.slot):
            self.forget(row.slot, 0)

    def clear_idle(self) -> int:
        freed = 0
        for slot in self.slots.slots:
            if slot.row is None and slot.tokens:
                freed += len(slot.tokens)
                self.forget(slot, 0)
        return freed

    # -- jobs ---------------------------------------------------------------------------

    def add(self, job: GenerationJob) -> None:
        self.waiting.append(Waiting(job, collections.deque(forks.parts(job.spec.groups))))

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
        for row in self.rows:
            if row.job.cancelled.is_set():
                self.leave(row, keep_cells=True)
                self._end(row.job, "cancelled")

    def admit(self) -> None:
        """Start waiting parts in the order, and within the share, of the
        shared fair-admission rule (engines/admission.py) while the rows are
        fewer than the slots."""
        self.lanes.release_free()
        if not self.waiting:
            return
        held = collections.Counter(id(row.job) for row in self.rows)
        turns = FairTurns(self.limits, self.share, held, self.groups_left,
                          capacity=len(self.slots.slots),
                          background=background_rows(row.job for row in self.rows))
        for waiting in turns.order(self.waiting):
            while waiting.groups and turns.allows(waiting.job, 1):
                if len(self.rows) >= len(self.slots.slots):
                    return  # every slot runs a row
                started = self._start(waiting)
                if started is None:
                    return
                if not started:
                    break  # its cells do not fit yet (or it failed alone)
                turns.took(waiting.job, 1)

    def _start(self, waiting: Waiting) -> bool | None:
        """Start the next part of `waiting`: a seeded part in a lane of its
        own, any other in the shared slot holding the longest prefix of its
        prompt (or following a sibling choice: engines/gguf/forks.py), once
        the cells it needs fit. True: it runs; False: its cells do not fit
        beside the running rows yet, or it failed alone; None: no slot is free."""
        job, group = waiting.job, waiting.groups[0]
        seeded = job.spec.seed is not None
        slot, same = None, 0
        steer = (self.steerer.row(job.spec, job.monitor, len(group.prompt_ids))
                 if self.steerer is not None else None)
        key = plan_key(job.spec.steering)
        if job.monitor is not None:  # its prefix must come with its probes' scores
            key = (key, monitor_key(job.monitor))
        # A row that reads its prompt (activations, scored steering conditions)
        # evaluates it itself.
        leader = (None if seeded or (steer is not None and (steer.reads_prompt or steer.scored))
                  else self.forks.leader_for(job, group, self.slots.rows))
        if not seeded:
            picked = self.slots.pick(group.prompt_ids, key,
                                     fresh=steer is not None and steer.reads_prompt)
            if picked is None:
                return None
            slot, same = picked
            if leader is not None:
                same = 0  # its cells will be the leader's: it keeps none of its own
            if same and job.monitor is not None:
                self.steer.flush()  # the slot's last scores may still be unscored
                if not replay_scores(slot.scores, job.monitor, same):
                    same = 0
            need = len(group.prompt_ids) - same + group.max_tokens
            running = self.slots.rows
            if not self.slots.fits(need, slot, same):
                for other in self.slots.slots:  # idle prefixes give their cells back
                    if other.row is None and other is not slot and other.tokens:
                        self.forget(other, 0)
                if not self.slots.fits(need, slot, same) and running:
                    return False  # waits for running rows to leave
            self.forget(slot, same)
        waiting.groups.popleft()
        if not waiting.groups:
            self.waiting.remove(waiting)
            self.counts("waiting", -1)
        if id(job) not in self.groups_left:
            self.groups_left[id(job)] = job.parts or len(job.spec.groups)
            self.counts("running", 1)
        try:
            sampler, mask, scorer = self.new_row_tools(job.spec,
                                                       group.row_seeds[0] & 0xFFFFFFFF)
        except Exception:
            log.exception("a row could not be set up; its request fails alone")
            self.fail_job(job, internal_error())
            return False
        if seeded:
            try:
                slot = self.lanes.take().slot
            except Exception:
                log.exception("a seeded lane could not be opened; its request fails alone")
                self.fail_job(job, out_of_memory())
                return False
        self.counts("cache_hits", same)
        self.slots.clock += 1
        slot.used = self.slots.clock
        slot.key = key
        pending = [] if leader is not None else list(group.prompt_ids[same:])
        slot.row = Row(job, group, slot, sampler, mask, pending, same,
                       ByteLevelDetokenizer(self.token_bytes), StopMatcher(job.spec.stop),
                       steer=steer, scorer=scorer)
        if leader is not None:
            self.forks.follow(leader, slot.row)
        return True

    # -- one step -----------------------------------------------------------------------

    def step(self) -> None:
        """One decode of the shared batch, then one of each lane."""
        forks = self.forks
        rows = self.slots.rows
        if forks.followers:  # n > 1 parts waiting for their leader's prompt
            forks.orphans()
            rows = [r for r in rows if not forks.waiting(r)]
        shared = sorted(rows, key=lambda r: len(r.pending) > 1)  # decoding first
        if shared:
            self._decode(self.ctx, self.batch, self.n_batch, shared, "decode", self.steer)
        for lane in self.lanes.running():
            if lane.row is not None:  # (its request may have failed in this step)
                self._decode(lane.ctx, lane.batch, lane.n_batch, [lane.row], "seeded",
                             lane.steer)

    def _decode(self, ctx, batch, n_batch: int, rows: list[Row], point: str,
                steer=None) -> None:
        """One llama_decode of `rows` (all in `ctx`, whose steering tables are
        `steer`), then their tokens; `point` names it for engines/faults.py."""
        sampling = step_batch(rows, n_batch, batch.batch)
        if batch.batch.n_tokens == 0:
            return
        parts = steering_parts(rows, batch.batch) if steer is not None else []
        try:
            faults.hit(point)
            if parts:
                steer.prepare(parts, batch.batch.n_tokens, batch.batch.logits)
            ctx.decode(batch)
            if parts and steer.collect():
                raise RuntimeError("the steering callback met an unexpected tensor layout")
        except Exception:
            log.exception("llama_decode failed; failing the batch's requests")
            if parts:
                steer.collect()
            self.fail_rows(rows, batch_reset())
            return
        posts = StepPosts()
        finished: list[Row] = []
        for row in sampling:
            if posts.has_failed(row.job):
                continue
            try:
                faults.hit("row")
                delta, done = self._take(ctx, row)
                taken = [(row, delta, done)]
                if self.forks.followers:
                    taken += self.forks.fork(ctx, row,
                                             lambda follower: self._take(ctx, follower))
            except Exception:
                log.exception("a row failed to take its token; its request fails alone")
                posts.fail(row.job)
                continue
            for taker, delta, done in taken:
                posts.delta(row.job, delta)
                if done:
                    finished.append(taker)
        for job in posts.failed:
            self.fail_job(job, internal_error())
        self.counts("generated", posts.tokens)
        if steer is not None and any(r.steer is not None and r.steer.monitor is not None
                                     for r in finished):
            steer.flush()  # its probes' verdicts must be whole before it reports done
        ended = []
        for row in finished:
            if posts.has_failed(row.job):
                continue
            self.leave(row, keep_cells=True)
            recorder = row.steer.recorder if row.steer is not None else None
            posts.group_done(row.job, GroupDone(row.generated, row.cached, recorder))
            key = id(row.job)
            if key in self.groups_left:
                self.groups_left[key] -= 1
                if self.groups_left[key] == 0:
                    ended.append(row.job)
        # Every job's events of this step leave together: one wake of the loop.
        posts.post(self.stall_s)
        for job in ended:
            self._end(job, "done")

    def _take(self, ctx, row: Row) -> tuple[ChoiceDelta, bool]:
        """Sample the row's token (under its grammar mask) and take it."""
        if row.mask is not None:
            row.mask.apply(ctx, row.batch_index)
        token = row.sampler.sample(ctx, row.batch_index)
        score = row.scorer.score(ctx, row.batch_index, token) if row.scorer is not None else None
        if row.mask is not None and not row.mask.accept(token):
            # The mask allowed only tokens the grammar accepts; the document
            # check after the choice ends refuses the output.
            log.error("grammar refused a token its own mask allowed")
        return take_token(row, token, self.eog, row.job.spec.ignore_eos, score)

    def fail_job(self, job: GenerationJob, error) -> None:
        """One request fails alone: its rows leave their slots (emptied: a row
        may have failed halfway through its step) and its waiting groups go."""
        job.fail_from_thread(error)
        for row in self.rows:
            if row.job is job:
                self.leave(row, keep_cells=False)
        for waiting in [w for w in self.waiting if w.job is job]:
            self.waiting.remove(waiting)
            self.counts("waiting", -1)
        self._end(job, "failed")

    def fail_rows(self, rows: list[Row], error) -> None:
        """Fail the requests of these rows (a batch whose decode failed: their
        cells may hold half a step)."""
        for job in {id(r.job): r.job for r in rows}.values():
            self.fail_job(job, error)

    def fail_running(self, error) -> None:
        """Fail every running row's request and empty its slot."""
        self.fail_rows(self.rows, error)

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
        for row in self.rows:
            row.job.cancelled.set()


def steering_parts(rows: list[Row], batch) -> list[BatchPart]:
    """The steered or reading rows' places in this step's batch; a row that
    reads its chunk at the last block keeps logits for all of it."""
    parts = []
    for row in rows:
        start, count, position, ids = row.batch_span
        if row.steer is None or count == 0:
            continue
        if row.steer.needs_all_outputs():
            for j in range(start, start + count):
                batch.logits[j] = True
        parts.append(BatchPart(row.steer, start, count, position, ids,
                               row.slot.scores if row.steer.monitor is not None else None))
    return parts
