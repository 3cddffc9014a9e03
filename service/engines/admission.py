"""Fair admission, the one rule both engines admit by.

The limits (SchedulerLimits) are the operator's settings: MILLM_MAX_BATCH,
MILLM_MAX_QUEUED, MILLM_BATCHING, MILLM_MAX_ROWS_PER_REQUEST and
MILLM_ADMISSION_AGING_S. Each engine has its own notion of room (the
transformers engine counts rows against max_batch; the GGUF engine counts
slots and KV cells), but which waiting request may start a part, and when
nothing may pass one, is decided here once (FairTurns):

- Requests are tried oldest first.
- One request holds at most its share of the running rows
  (`rows_per_request`: MILLM_MAX_ROWS_PER_REQUEST, or half the batch); a
  larger n, or many prompts, run in parts as its own rows finish, so the rest
  of the batch stays open to others.
- A request that does not fit yet lets later ones pass it, but only for
  `aging_s`: once it has waited that long holding no rows, nothing passes it
  until it has started, so a large request is never starved by small ones.
- Serial batching: one request at a time, holding as many rows as it has.
- Priority (a request's `priority`, vLLM's field; a batch's lines run at 1):
  the order above is by priority first, lower first, then by age, so a
  waiting request is never passed by one of a higher value, aging included.
  A request above 0 is background work: background rows together never
  take the last `priority_reserve` rows of the batch (MILLM_PRIORITY_RESERVE),
  so a request at 0 or below arriving beside a full batch of background work
  starts at the next step instead of waiting for a background row to end;
  the background uses the rest. (Nothing running is stopped for it: a
  second interactive request beside a full batch waits for a row.)
"""

from __future__ import annotations

import collections
import time
from collections.abc import Container, Iterator
from dataclasses import dataclass, field

from service.generation.job import GenerationJob


@dataclass
class SchedulerLimits:
    max_batch: int = 64  # running rows
    max_queued: int = 256  # waiting requests
    serial: bool = False  # one request at a time (for comparison benchmarks)
    max_rows_per_request: int = 0  # rows one request holds at once; 0: half of the batch
    aging_s: float = 5.0  # how long later requests may pass one that does not fit
    stall_s: float = 30.0  # a reader that takes nothing this long is cancelled (job.py)
    prefill_chunk: int = 512  # prompt tokens computed per turn at most (transformers/prefill.py)
    priority_reserve: int = 1  # rows background work (priority > 0) leaves free

    def rows_per_request(self, batch: int) -> int:
        """Rows one request may hold at once in a batch of `batch` rows."""
        if self.serial:
            return batch
        return self.max_rows_per_request or max(1, batch // 2)

    @property
    def request_rows(self) -> int:
        """Rows one request may hold at once in a batch of max_batch rows."""
        return self.rows_per_request(self.max_batch)


@dataclass
class Waiting:
    """A queued request and its parts not yet started (each engine's own kind of part)."""

    job: GenerationJob
    groups: collections.deque = field(default_factory=collections.deque)
    since: float = field(default_factory=time.monotonic)


class FairTurns:
    """One admission pass over the waiting requests (the module docstring's rule).

    `held` counts the rows each running request holds (by id(job)) and is kept
    up to date through took(); `running` holds the ids of the requests already
    started (serial batching admits no other while any runs)."""

    def __init__(self, limits: SchedulerLimits, share: int, held: collections.Counter,
                 running: Container[int], *, capacity: int | None = None,
                 background: int = 0):
        self.limits, self.share, self.held, self.running = limits, share, held, running
        self.now = time.monotonic()
        # Rows background work may hold together (the batch less the reserve),
        # and the rows it holds now.
        self.background_cap = max(0, (capacity or limits.max_batch) - limits.priority_reserve)
        self.background = background

    def order(self, waiting: collections.deque) -> Iterator[Waiting]:
        """The waiting requests in the order they may start parts. The caller
        starts what it can of each before asking for the next: one that still
        has parts then, holds no rows, and has waited `aging_s` ends the pass."""
        entries = list(waiting)
        if any(e.job.spec.priority for e in entries):
            entries.sort(key=lambda e: e.job.spec.priority)  # stable: oldest first within
        for entry in entries:
            if self.limits.serial and self.running and id(entry.job) not in self.running:
                return  # serial: another request runs
            yield entry
            if (entry.groups and entry.job.outcome is None and not self.held[id(entry.job)]
                    and self.now - entry.since >= self.limits.aging_s):
                return  # it has waited long enough: rows now free up for it alone

    def allows(self, job: GenerationJob, rows: int, room: bool = True) -> bool:
        """Whether `job` may start a part of `rows` rows now: there is `room`
        for it and it stays within its share (a request holding nothing may
        always start one part). Serial batching asks neither."""
        if self.limits.serial:
            return True
        if job.spec.priority > 0 and self.background + rows > self.background_cap:
            return False
        held = self.held[id(job)]
        return room and (not held or held + rows <= self.share)

    def took(self, job: GenerationJob, rows: int) -> None:
        self.held[id(job)] += rows
        if job.spec.priority > 0:
            self.background += rows


def background_rows(jobs) -> int:
    """Rows of background work (priority above 0) among the running rows'
    jobs (one entry per row)."""
    return sum(1 for job in jobs if job.spec.priority > 0)
