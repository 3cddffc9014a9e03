"""What both engines' model threads share: a read of the model handed to the
thread (ModelCall), the answer to whatever is still queued when a thread
stops (answer_unrun), and the news that a thread died (report_death, heard by
the server, which stops serving and exits for its supervisor to restart it),
and what a failure on the thread is answered (failure_of).

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
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from service.errors import EngineError, internal_error

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


def answer_unrun(inbox: queue.Queue, error: EngineError | None = None) -> None:
    """When a model thread stops (an unload that ran out of patience, or its
    death), what is still queued is answered rather than left waiting forever:
    reads get `error` (model_busy by default), jobs fail with it."""
    error = error or EngineError(
        "model_busy", "The model was unloaded before this request ran; retry.", "model")
    while True:
        try:
            item = inbox.get_nowait()
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
