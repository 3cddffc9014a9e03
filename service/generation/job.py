"""A validated generation as the engine runs it, and the events it produces.

The asyncio side (the servicer) and the model thread meet here: the model
thread posts events onto the job's mailbox with call_soon_threadsafe,
and the asyncio side sets `cancelled` when the caller goes away, which the
model thread checks before every step.

A caller that stops reading (a client that no longer reads its stream, so
gRPC's flow control blocks the servicer) would keep its row generating into
this queue and hold its model lease. The model thread asks `stalled()` as it
posts: once events have waited untaken for the stall time (MILLM_STREAM_STALL_S)
or too many have piled up, `abandon()` cancels the row and the servicer's task,
which frees the lease.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from common import grpc_limits
from service.errors import EngineError

log = logging.getLogger(__name__)

# Events a job may hold that its caller has not taken (a token's delta is one).
MAX_PENDING_EVENTS = grpc_limits.MAX_UNREAD_REPLIES

if TYPE_CHECKING:
    from service.requests.generation import ValidatedGeneration
    from service.steering.probes import ProbeReader
    from service.steering.recording import ActivationRecorder


class FinishReason:
    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"
    CONTENT_FILTER = "content_filter"  # a steering abort_when held


@dataclass(frozen=True)
class ToolCallFragment:
    """A piece of a streamed tool call (generation/tool_calls.py): the first
    of a call carries its id and name, later ones pieces of its arguments."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True)
class ChoiceDelta:
    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    # engines.scores.TokenScore per text-bearing token, when logprobs were asked for.
    logprobs: tuple = ()
    tool_calls: tuple[ToolCallFragment, ...] = ()
    # The stop sequence that ended the choice (finish_reason STOP), if one did.
    stop_sequence: str = ""
    # Reasoning text, split out of `text` (generation/reasoning.py).
    reasoning: str = ""


@dataclass(frozen=True)
class StepOutput:
    """What one decode step of one group produced."""

    deltas: tuple[ChoiceDelta, ...]


@dataclass(frozen=True)
class GroupDone:
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    recorder: ActivationRecorder | None = None  # when the group read activations


@dataclass(frozen=True)
class GroupFailed:
    error: EngineError


class Mailbox:
    """The job's events for its one reader: asyncio.Queue's unbounded
    put_nowait / get / get_nowait / empty, without the bookkeeping a queue
    with many getters and a size limit needs (this runs once a step a row)."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque = collections.deque()
        self._waiter: asyncio.Future | None = None

    def put_nowait(self, item) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)

    def get_nowait(self):
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.popleft()

    async def get(self):
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


def post_all(posts: list[tuple[GenerationJob, object]]) -> None:
    """Model thread: GenerationJob.post for many jobs' events (in order), with
    one wake of each event loop instead of one a job: a call_soon_threadsafe
    per job writes the loop's wake-up socket once a row, and each write lets
    the event loop take the GIL from the model thread mid-step."""
    by_loop: dict[int, tuple[asyncio.AbstractEventLoop, list]] = {}
    for job, event in posts:
        staged = job.stage(event)
        if staged is not None:
            loop, item = staged
            by_loop.setdefault(id(loop), (loop, []))[1].append(item)
    for loop, items in by_loop.values():
        loop.call_soon_threadsafe(_put_all, items)


def _put_all(items: list[tuple[asyncio.Queue, object]]) -> None:
    for queue, event in items:
        queue.put_nowait(event)


def join_steps(steps: list[StepOutput]) -> StepOutput:
    """One output saying what consecutive steps said, choice by choice, in one
    pass: texts and tokens joined, the last finish reason and stop sequence.

    Readers take a delta's reasoning, then its text, then its tool calls, so a
    choice whose text comes after a call (or reasoning after text) keeps
    several deltas, one per run in that order: joined into one, "Let me
    check." + call + "Done." would read as the two texts and then the call."""
    if len(steps) == 1:
        return steps[0]
    plain = _plain_run(steps)
    if plain is not None:
        return StepOutput((plain,))
    runs: dict[int, list[list[ChoiceDelta]]] = {}
    last: dict[int, int] = {}  # the latest part the choice's open run holds
    for step in steps:
        for d in step.deltas:
            choice = runs.setdefault(d.index, [])
            if not choice or _first_part(d) < last[d.index]:
                choice.append([])
                last[d.index] = -1
            choice[-1].append(d)
            last[d.index] = max(last[d.index], _part(d))
    return StepOutput(tuple(_joined(run) for choice in runs.values() for run in choice))


def _plain_run(steps: list[StepOutput]) -> ChoiceDelta | None:
    """The common join, each step one delta of the same choice with neither
    reasoning nor tool calls (one run, as the general pass would find):
    those deltas joined; None for any other shape. A streamed request's
    reader joins its piled steps every turn of the event loop."""
    first = steps[0].deltas
    if len(first) != 1:
        return None
    index = first[0].index
    deltas = []
    for step in steps:
        if len(step.deltas) != 1:
            return None
        d = step.deltas[0]
        if d.index != index or d.reasoning or d.tool_calls:
            return None
        deltas.append(d)
    return _joined(deltas)


def _first_part(d: ChoiceDelta) -> int:
    """The earliest of reasoning (0), text (1) and tool calls (2) the delta holds."""
    return 0 if d.reasoning else 1 if d.text else 2 if d.tool_calls else 3


def _part(d: ChoiceDelta) -> int:
    """The latest of reasoning (0), text (1) and tool calls (2) the delta holds."""
    return 2 if d.tool_calls else 1 if d.text else 0 if d.reasoning else -1


def _joined(ds: list[ChoiceDelta]) -> ChoiceDelta:
    if len(ds) == 1:
        return ds[0]
    finish = next((d.finish_reason for d in reversed(ds) if d.finish_reason), None)
    stop = next((d.stop_sequence for d in reversed(ds) if d.stop_sequence), "")
    return ChoiceDelta(
        ds[0].index, "".join([d.text for d in ds]),
        tuple([t for d in ds for t in d.token_ids]), finish,
        tuple([x for d in ds for x in d.logprobs]),
        tuple([c for d in ds for c in d.tool_calls]), stop,
        "".join([d.reasoning for d in ds]))


@dataclass
class GenerationJob:
    spec: ValidatedGeneration
    loop: asyncio.AbstractEventLoop
    queue: Mailbox = field(default_factory=Mailbox)
    cancelled: threading.Event = field(default_factory=threading.Event)
    completion_tokens: int = 0
    cached_tokens: int = 0
    # Set once by the model thread when the job ends: done, cancelled or failed.
    outcome: str | None = None
    recorder: ActivationRecorder | None = None  # return_sae_activations: what was read
    # How many GroupDone events end the job: its groups, or the parts the
    # scheduler split them into (set before the job is queued).
    parts: int = 0
    # The servicer's task (cancelled to free its lease when its reader stalls).
    owner: asyncio.Task | None = None
    # Written by the model thread only / by the event loop only.
    posted: int = 0
    first_posted: float = 0.0
    # When its first part joined the running batch (monotonic; 0: not yet, or
    # an engine that does not say), for the queue-time metric.
    admitted_at: float = 0.0
    taken: int = 0
    last_taken: float = 0.0
    # Monitoring: the probes' readings, written by the model thread while the
    # job runs and read once every group is done.
    monitor: ProbeReader | None = None
    # A whole-read job's steps not posted yet, and when the first and last of
    # them left the model (model thread only; spec.whole).
    held: list = field(default_factory=list)
    held_first_at: float = 0.0
    held_last_at: float = 0.0

    def __post_init__(self):
        if self.spec.monitoring is not None:
            from service.steering.probes import ProbeReader

            self.monitor = ProbeReader(self.spec.monitoring)

    def post(self, event) -> None:
        """Called from the model thread."""
        loop, (queue, event) = self.stage(event)
        loop.call_soon_threadsafe(queue.put_nowait, event)

    def stage(self, event):
        """Model thread: count `event` as posted; (its loop, what to put where)
        for the caller to deliver (post, or post_all for many jobs at once)."""
        if not self.posted:
            self.first_posted = time.monotonic()
        self.posted += 1
        return self.loop, (self.queue, event)

    def hold(self, step: StepOutput) -> None:
        """Model thread: keep a whole-read job's step for its group's end."""
        now = time.monotonic()
        if not self.held:
            self.held_first_at = now
        self.held.append(step)
        self.held_last_at = now

    def release(self) -> StepOutput:
        """Model thread: the held steps as one."""
        steps, self.held = self.held, []
        return join_steps(steps)

    def stalled(self, stall_s: float) -> bool:
        """Model thread: has the caller left events untaken too long, or too many?"""
        pending = self.posted - self.taken
        if pending > MAX_PENDING_EVENTS:
            return True
        idle = time.monotonic() - max(self.last_taken, self.first_posted)
        return pending > 0 and idle > stall_s

    def abandon(self) -> None:
        """Model thread: stop generating for a reader that stopped reading, and
        end its servicer's call (its lease goes with it)."""
        log.warning("stream_stalled request_id=%s: its reader took nothing for too long; "
                    "cancelled", self.spec.request_id)
        self.cancelled.set()
        if self.owner is not None:
            self.loop.call_soon_threadsafe(self.owner.cancel)

    def fail(self, error: EngineError) -> None:
        """End the job with `error`; called on the event loop's thread (a forced
        unload). The model thread drops the job at its next step, and piles()
        raises the error."""
        self.cancelled.set()
        self.queue.put_nowait(GroupFailed(error))

    def fail_from_thread(self, error: EngineError) -> None:
        """fail(), from a thread other than the event loop's."""
        self.cancelled.set()
        self.post(GroupFailed(error))

    async def _take(self):
        event = await self.queue.get()
        self.taken, self.last_taken = self.taken + 1, time.monotonic()
        return event

    def _take_now(self):
        event = self.queue.get_nowait()
        self.taken, self.last_taken = self.taken + 1, time.monotonic()
        return event

    async def piles(self) -> AsyncIterator[list[StepOutput]]:
        """Step outputs until every group is done, each time with every step
        that piled up while the caller was busy, so a slow reader (a loaded
        bridge) can send fewer, larger messages instead of falling further
        behind (generation/stages.py joins them). Leaving early (the caller
        is gone, or a failure) cancels the job, so the model thread drops it
        at its next step.
        """
        remaining = self.parts or len(self.spec.groups)
        held = None
        try:
            while remaining:
                event = held if held is not None else await self._take()
                held = None
                if isinstance(event, StepOutput):
                    piled = [event]
                    while not self.queue.empty():
                        following = self._take_now()
                        if not isinstance(following, StepOutput):
                            held = following
                            break
                        piled.append(following)
                    yield piled
                elif isinstance(event, GroupDone):
                    self.completion_tokens += event.completion_tokens
                    self.cached_tokens += event.cached_tokens
                    if event.recorder is not None:
                        self.recorder = event.recorder
                    remaining -= 1
                elif isinstance(event, GroupFailed):
                    raise event.error
        finally:
            if remaining:
                self.cancelled.set()
