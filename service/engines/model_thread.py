"""What both engines' model threads share: the inbox they take work from
(Inbox: a job submitted with the queue-full check, a read of the model
handed to the thread as a ModelCall, the drain each turn, the request to
stop), the answer to whatever is still queued when a thread stops
(Inbox.answer_unrun), the news that a thread died (report_death, heard by the
server, which stops serving and exits for its supervisor to restart it), and
what a failure on the thread is answered (failure_of).

Each engine owns exactly one model thread, because neither torch's caches nor
llama.cpp's contexts may be touched from two threads; everything that reads
the model (generation steps, scoring, embeddings, attaching an SAE) runs
there, and its result comes back to the caller's event loop.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from service.errors import EngineError, internal_error, queue_full, thread_died

log = logging.getLogger(__name__)


def own_torch_threads() -> None:
    """Give the calling thread the process's torch thread count. Called first
    on each model thread: torch.set_num_threads (server.py) sets OpenMP's and
    MKL's counts for the thread that calls it, and a thread started later
    still computes with one thread per core; on a pinned or busy machine its
    small matmuls (an SAE encode per decode step) then wait milliseconds for
    a second thread that has no core to run on."""
    torch.set_num_threads(torch.get_num_threads())


def out_of_memory() -> EngineError:
    return EngineError("insufficient_memory", "The engine ran out of memory for this request; "
                       "retry, or send a shorter prompt or a smaller n.")


def failure_of(exc: Exception) -> EngineError:
    """What a generation part that cannot run is answered: out of memory is the
    server's state (503, retry with less), anything else the server's fault."""
    return out_of_memory() if isinstance(exc, torch.OutOfMemoryError) else internal_error()


@dataclass
class ModelCall:
    """Work that reads the model without generating (scoring, embeddings): run
    on the model thread between decode steps, its result handed back to the
    caller's event loop.

    A long read is a generator function: each `yield` ends one chunk (a
    prompt scored, a forward pass of embeddings) and its `return` value is the
    result. The thread runs one chunk per turn, between decode steps, so a
    2,048-input read never stalls the running streams for more than a chunk,
    and a caller that leaves (its future cancelled) stops it at the next one.
    """

    fn: object  # fn(ctx) -> result, or a generator function returning it
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    steps: Iterator | None = None  # a chunked read under way
    chunks: int = 0

    @property
    def abandoned(self) -> bool:
        return self.future.cancelled()

    def run(self, ctx) -> bool:
        """Run the call, or its next chunk; True once it is settled."""
        try:
            if self.steps is None:
                result = self.fn(ctx)
                if not inspect.isgenerator(result):
                    self._hand_back(result, None)
                    return True
                self.steps = result
            next(self.steps)
            self.chunks += 1
            return False
        except StopIteration as done:
            self._hand_back(done.value, None)
        except torch.OutOfMemoryError:
            log.warning("a read ran out of memory; answered insufficient_memory")
            self._hand_back(None, out_of_memory())
        except BaseException as exc:  # handed to the caller, who decides what it means
            self._hand_back(None, exc)
        return True

    def drop(self) -> None:
        """The caller left: stop a chunked read where it is."""
        if self.steps is not None:
            self.steps.close()
            log.info("a read was cancelled by its caller after %d chunks", self.chunks)

    def _hand_back(self, result, error) -> None:
        self.loop.call_soon_threadsafe(self._settle, result, error)

    def _settle(self, result, error) -> None:
        if self.future.cancelled():
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(result)


def run_one_chunk(reads: collections.deque, ctx) -> None:
    """One chunk of the oldest read still wanted; reads take turns, one chunk
    a turn of the model thread, between decode steps (both engines)."""
    while reads:
        call = reads.popleft()
        if call.abandoned:
            call.drop()
            continue
        if not call.run(ctx):
            reads.append(call)
        return


class Inbox:
    """A model thread's inbox. From the event loop: jobs (`submit`, counted
    against MILLM_MAX_QUEUED until the engine admits or drops them:
    `dequeued`), reads (`call`) and the request to stop (`close`). On the
    model thread: `take` moves what came into the engine's queue and into
    `reads` (the reads under way, one chunk a turn: run_one_chunk); `die`
    makes every later submit and call fail at once; `answer_unrun` answers
    what never ran when the thread stops."""

    def __init__(self, max_queued: int):
        self.max_queued = max_queued
        self.queued = 0  # jobs submitted and not yet admitted or dropped
        self.dead = False
        self.reads: collections.deque[ModelCall] = collections.deque()
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()

    def submit(self, job, parts: int) -> None:
        """Queue `job`, whose piles() count `parts` GroupDones; refused when
        the thread is dead or MILLM_MAX_QUEUED jobs already wait."""
        with self._lock:
            if self.dead:
                raise thread_died()
            if self.queued >= self.max_queued:
                raise queue_full(self.max_queued)
            self.queued += 1
        job.parts = parts  # before the job is queued: the thread may read it at once
        self._items.put(job)

    def call(self, fn) -> asyncio.Future:
        """Run fn(ctx) on the model thread (a ModelCall); await the returned future."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            if self.dead:
                future.set_exception(thread_died())
                return future
        self._items.put(ModelCall(fn, future, loop))
        return future

    def dequeued(self, count: int = 1) -> None:
        with self._lock:
            self.queued -= count

    def take(self, add_job: Callable[[object], None], block: bool) -> bool:
        """Move every job (to `add_job`) and read (to `reads`) that came,
        waiting for one first when `block` (the thread has nothing else to
        do); False once the thread was asked to stop."""
        try:
            item = self._items.get(block=block)
            while item is not None:
                if isinstance(item, ModelCall):
                    self.reads.append(item)
                else:
                    add_job(item)
                item = self._items.get_nowait()
            return False
        except queue.Empty:
            return True

    def close(self) -> None:
        """Ask the thread to stop (its loop sees it at its next take)."""
        self._items.put(None)

    def die(self) -> None:
        with self._lock:
            self.dead = True

    def answer_unrun(self, error: EngineError | None = None) -> None:
        """When the thread stops (an unload that ran out of patience, or its
        death), what never ran is answered rather than left waiting forever:
        the reads under way and those queued get `error` (model_busy by
        default), the queued jobs fail with it."""
        error = error or EngineError(
            "model_busy", "The model was unloaded before this request ran; retry.", "model")
        for call in self.reads:
            call.drop()
            call._hand_back(None, error)
        self.reads.clear()
        while True:
            try:
                item = self._items.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, ModelCall):
                item.drop()
                item._hand_back(None, error)
            elif item is not None:
                item.fail_from_thread(error)


_death_listeners: list = []


def on_death(callback) -> None:
    """Call `callback()` (from the dying thread) when a model thread dies."""
    _death_listeners.append(callback)


def report_death() -> None:
    for callback in list(_death_listeners):
        callback()
