"""The model thread: a queue, iteration-level admission, and the lanes.

Every turn of the loop (1) takes new jobs from the inbox, (2) drops rows and
queued jobs whose caller left, (3) admits waiting prompt groups while the
running batch has room, (4) computes at most `prefill_chunk` prompt tokens of
the admitted prompts (prefill.py: a long prompt takes several turns), handing
those complete to a lane, and (5) runs one decode step for every lane. A new
request therefore joins within a step or a few and a finished one leaves at
once, as in vLLM and TGI, and a long prompt never holds the running streams
for more than one chunk's forward pass per token.

All unseeded rows share one lane, whatever their sampling parameters, stop
sequences or lengths. A seeded group gets a lane of its own and never reads
the prefix cache, so its forward passes hold nothing but its own rows: its
text depends on the request alone, which is what SEED_SCOPE_REQUEST promises.

Admission is fair rather than first-in-first-out, by the rule both engines
share (engines/admission.py): one request holds at most
`max_rows_per_request` rows at once, so a larger n, or many prompts, run in
parts (here a group's rows split, each part prefilled from the prefix cache
the first one filled) as its own rows finish; a request that does not fit the
free rows yet lets later ones pass it, but only for `aging_s`.

The thread is supervised. A part whose prefill fails is retried alone when it
was prefilled with others, so only the part that cannot run fails (503
insufficient_memory for an out-of-memory error). A row whose bookkeeping fails
fails its own request. A failure in shared batch state (a decode step, new rows
joining a lane, anything else in a turn) fails the rows of that batch with 503
engine_failure, resets it, and the thread keeps serving the waiting requests.
If the thread dies anyway, every waiting and running request is answered 503
engine_failure, submit() refuses new work, and model_thread.report_death()
tells the server, which reports NOT_SERVING and exits non-zero for its
supervisor to restart it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading

import torch

from service.engines import faults
from service.engines.admission import FairTurns, SchedulerLimits, Waiting, background_rows
from service.engines.base import EngineStatus
from service.engines.model_thread import (
    Inbox,
    failure_of,
    own_torch_threads,
    report_death,
    run_one_chunk,
)
from service.engines.transformers.admission import split_parts
from service.engines.transformers.batch import GroupProgress, ModelContext, Prefilled, Row
from service.engines.transformers.delivery import step_posts
from service.engines.transformers.lane import Lane
from service.engines.transformers.prefill import Prefills
from service.engines.transformers.prefix_cache import PrefixCache
from service.errors import (
    EngineError,
    batch_reset,
    internal_error,
    thread_died,
)
from service.generation.job import GenerationJob, GroupFailed

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, ctx: ModelContext, limits: SchedulerLimits, prefix_cache: PrefixCache):
        self.ctx, self.limits, self.prefix_cache = ctx, limits, prefix_cache
        self.backend = "transformers/" + ("serial" if limits.serial else "continuous-batching")
        # Jobs and reads (scoring, embeddings, attaching an SAE) in, from the
        # event loop (engines/model_thread.py); the jobs wait here until admitted.
        self._inbox = Inbox(limits.max_queued)
        self._waiting: collections.deque[Waiting] = collections.deque()
        self._shared = Lane(ctx)
        self._isolated: list[Lane] = []
        # Admitted prompts being computed (a lone part that fails fails its request).
        self._prefills = Prefills(ctx, prefix_cache, limits,
                                  lambda job, exc: self._fail(job, failure_of(exc)))
        self._groups_left: dict[int, int] = {}  # id(job) -> groups not yet done, once admitted
        self._lock = threading.Lock()
        self._generated = self._completed = self._cancelled = self._failed = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="millm-model", daemon=True)

    # -- called from the event loop ---------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._inbox.close()
        self._thread.join(timeout=10)

    def submit(self, job: GenerationJob) -> None:
        # Its piles() count the parts' GroupDones.
        self._inbox.submit(job, len(split_parts(job.spec.groups, self.limits.request_rows)))

    def call(self, fn) -> asyncio.Future:
        """Run fn(ctx) on the model thread; await the returned future."""
        return self._inbox.call(fn)

    def status(self) -> EngineStatus:
        with self._lock:
            lanes = [self._shared, *self._isolated]
            held = [lane.kv_tokens() for lane in lanes]
            return EngineStatus(
                backend=self.backend,
                active_generations=len(self._groups_left),
                queued_requests=self._inbox.queued,
                generated_tokens_total=self._generated,
                completed_generations_total=self._completed,
                cancelled_generations_total=self._cancelled,
                failed_generations_total=self._failed,
                running_rows=self._running_rows(),
                lanes=sum(1 for lane in lanes if lane.rows),
                max_batch=self.limits.max_batch,
                max_queued=self.limits.max_queued,
                kv_tokens_in_use=sum(h for h, _ in held),
                kv_padding_tokens=sum(p for _, p in held),
                prefix_cache_tokens=self.prefix_cache.cached_tokens,
                prefix_cache_hit_tokens_total=self.prefix_cache.hit_tokens_total,
            )

    # -- the model thread -----------------------------------------------------------------

    def _run(self) -> None:
        own_torch_threads()  # MILLM_TORCH_THREADS, on the thread that computes
        try:
            # Every tensor of every job lives on this thread, in inference mode.
            with torch.inference_mode():
                while not self._stopping:
                    try:
                        self._turn()
                    except Exception:
                        log.exception("model thread: a turn failed in shared batch state; "
                                      "failing the running rows and resetting the batch")
                        self._reset()
        except BaseException:
            log.critical("model thread died; the engine stops serving", exc_info=True)
            self._die()
            return
        for waiting in self._waiting:
            waiting.job.cancelled.set()
        self._inbox.answer_unrun()

    def _turn(self) -> None:
        self._inbox.take(self._queue_job, block=not self._waiting and not self._inbox.reads
                         and self._running_rows() == 0)
        with self._lock:
            self._drop_cancelled()
        run_one_chunk(self._inbox.reads, self.ctx)
        faults.hit("turn")
        self._admit()
        for isolated, new in self._prefills.turn():
            self._join(new, isolated)
        self._step_lanes()

    def _running_jobs(self) -> list[GenerationJob]:
        jobs = {id(r.job): r.job for lane in [self._shared, *self._isolated] for r in lane.rows}
        jobs.update((id(job), job) for p in self._prefills.items for job in p.jobs)
        return list(jobs.values())

    def _reset(self) -> None:
        """Fail every running row's request (prompts being prefilled too) and
        start from an empty batch; the waiting requests stay queued."""
        jobs = self._running_jobs()
        with self._lock:
            self._shared, self._isolated = Lane(self.ctx), []
            self._prefills.items = []
        for job in jobs:
            self._fail(job, batch_reset())

    def _die(self) -> None:
        """The thread cannot go on: answer everything, refuse new work, tell the server."""
        self._inbox.die()
        error = thread_died()
        for job in [*self._running_jobs(), *(w.job for w in self._waiting)]:
            self._fail(job, error)
        self._waiting.clear()
        self._inbox.answer_unrun(error)
        report_death()

    def _running_rows(self) -> int:
        """Rows in lanes, and rows whose prompts are being prefilled."""
        return (len(self._shared.rows) + sum(len(lane.rows) for lane in self._isolated)
                + self._prefills.rows())

    def _queue_job(self, job: GenerationJob) -> None:
        parts = split_parts(job.spec.groups, self.limits.request_rows)
        self._waiting.append(Waiting(job, collections.deque(parts)))

    def _end_job(self, job: GenerationJob, outcome: str) -> None:
        """Count a job once, when it ends: "done", "cancelled" or "failed". Lock held."""
        if job.outcome is not None:
            return
        job.outcome = outcome
        self._groups_left.pop(id(job), None)
        if outcome == "done":
            self._completed += 1
        elif outcome == "cancelled":
            self._cancelled += 1
        else:
            self._failed += 1

    def _drop_cancelled(self) -> None:
        for waiting in [w for w in self._waiting if w.job.cancelled.is_set()]:
            # The caller left while it waited: drop it without running it.
            self._waiting.remove(waiting)
            self._inbox.dequeued()
            self._end_job(waiting.job, "cancelled")
        for lane in [self._shared, *self._isolated]:
            gone = [r.job for r in lane.rows if r.job.cancelled.is_set()]
            if gone:
                lane.keep([i for i, r in enumerate(lane.rows) if not r.job.cancelled.is_set()])
                for job in gone:
                    self._end_job(job, "cancelled")
        self._isolated = [lane for lane in self._isolated if lane.rows]
        for job in self._prefills.drop_cancelled():
            self._end_job(job, "cancelled")

    def _admit(self) -> None:
        """Admit waiting parts while the batch has room, in the order and
        within the share engines/admission.py gives (FairTurns). Unseeded
        parts with nothing cached are prefilled together, up to a chunk of
        prompt tokens; a part with a cached prefix, or a seeded one, is
        prefilled on its own."""
        if not self._waiting:
            return  # every decode turn comes here: nothing to count when nothing waits
        together: list[GroupProgress] = []
        room = self.limits.max_batch - self._running_rows()
        running = [r.job for lane in [self._shared, *self._isolated] for r in lane.rows]
        for progress in (p for prefill in self._prefills.items for p in prefill.progresses):
            running += [progress.job] * progress.group.n
        held = collections.Counter(id(job) for job in running)
        turns = FairTurns(self.limits, self.limits.request_rows, held, self._groups_left,
                          background=background_rows(running))
        for waiting in turns.order(self._waiting):
            job = waiting.job
            while waiting.groups:
                group, continuation = waiting.groups[0]
                busy = self._running_rows() > 0 or together
                if not turns.allows(job, group.n, room=not busy or group.n <= room):
                    break
                waiting.groups.popleft()
                job.admitted_at = job.admitted_at or turns.now
                room -= group.n
                turns.took(job, group.n)
                with self._lock:
                    self._groups_left.setdefault(id(job), job.parts or len(job.spec.groups))
                    if not waiting.groups:
                        self._waiting.remove(waiting)
                        self._inbox.dequeued()
                try:
                    faults.hit("admit")
                    progress = GroupProgress(job, group, rows_left=group.n,
                                             continuation=continuation)
                    cached = (job.spec.seed is None and not progress.steered_or_reading
                              and self.prefix_cache.peek(group.prompt_ids))
                except Exception as exc:
                    # Out of the queue but not running: fail it here, or nothing would.
                    log.exception("a part could not be set up; its request fails alone")
                    self._fail(job, failure_of(exc))
                    break
                if job.spec.seed is not None:
                    self._prefills.start([progress], isolated=True)
                elif cached:
                    self._prefills.start([progress], isolated=False)
                else:
                    together.append(progress)
                    if (sum(len(p.group.prompt_ids) for p in together)
                            >= self.limits.prefill_chunk):
                        self._prefills.start(together, isolated=False)
                        together = []
        if together:
            self._prefills.start(together, isolated=False)

    def _join(self, new: Prefilled, isolated: bool) -> None:
        """Hand a complete prefill's first tokens out and its rows to a lane."""
        # A request that failed meanwhile (another of its parts) gets nothing more.
        new.results = [r for r in new.results if r[0].job.outcome is None]
        self._deliver(new.results)
        lane = Lane(self.ctx) if isolated else self._shared
        try:
            with self._lock:
                lane.add(new)
        except Exception:
            # The lane's shared state is in doubt: its rows and the new ones fail.
            log.exception("new rows could not join the running batch; resetting it")
            jobs = {id(r.job): r.job for r in [*lane.rows, *new.rows]}
            if not isolated:  # an isolated lane that failed to start is simply dropped
                with self._lock:
                    self._shared = Lane(self.ctx)
            for job in jobs.values():
                self._fail(job, batch_reset())
            return
        if isolated and lane.rows:
            with self._lock:
                self._isolated.append(lane)

    def _step_lanes(self) -> None:
        for lane in [self._shared, *self._isolated]:
            if not lane.rows:
                continue
            try:
                results = lane.step()
            except Exception:
                log.exception("decode step failed; failing the lane's requests, resetting it")
                jobs = {id(r.job): r.job for r in lane.rows}
                with self._lock:
                    if lane is self._shared:
                        self._shared = Lane(self.ctx)
                    else:
                        lane.rows = []
                for job in jobs.values():
                    self._fail(job, batch_reset())
                continue
            self._deliver(results)
        with self._lock:
            self._isolated = [lane for lane in self._isolated if lane.rows]

    def _deliver(self, results: list[tuple[Row, object, bool]]) -> None:
        """Post one StepOutput per job, then GroupDone for groups that finished."""
        posts, finished = step_posts(results)
        for job in posts.failed:
            self._fail(job)
        with self._lock:
            self._generated += posts.tokens
        posts.post(self.limits.stall_s)  # one wake-up of the event loop for the whole step
        for progress in finished:
            with self._lock:
                key = id(progress.job)
                if key in self._groups_left:
                    self._groups_left[key] -= 1
                    if self._groups_left[key] == 0:
                        self._end_job(progress.job, "done")

    def _fail(self, job: GenerationJob, error: EngineError | None = None) -> None:
        if job.outcome is not None:
            return
        job.post(GroupFailed(error or internal_error()))
        job.cancelled.set()  # its other rows and waiting groups leave at the next turn
        with self._lock:
            self._end_job(job, "failed")
