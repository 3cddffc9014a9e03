"""What both engines' model threads share: a read of the model handed to the
thread (ModelCall), the answer to whatever is still queued when a thread
stops (answer_unrun), and the news that a thread died (report_death, heard by
the server, which stops serving and exits for its supervisor to restart it).

Each engine owns exactly one model thread, because neither torch's caches nor
llama.cpp's contexts may be touched from two threads; everything that reads
the model (generation steps, scoring, embeddings, attaching an SAE) runs
there, and its result comes back to the caller's event loop.
"""

from __future__ import annotations

import asyncio
import queue
from dataclasses import dataclass

from service.errors import EngineError


@dataclass
class ModelCall:
    """Work that reads the model without generating (scoring, embeddings): run
    on the model thread between decode steps, its result handed back to the
    caller's event loop."""

    fn: object  # fn(ctx) -> result
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop

    def run(self, ctx) -> None:
        try:
            result, error = self.fn(ctx), None
        except BaseException as exc:  # handed to the caller, who decides what it means
            result, error = None, exc
        self.loop.call_soon_threadsafe(self._settle, result, error)

    def _settle(self, result, error) -> None:
        if self.future.cancelled():
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(result)


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
            item.loop.call_soon_threadsafe(item._settle, None, error)
        elif item is not None:
            item.fail_from_thread(error)


_death_listeners: list = []


def on_death(callback) -> None:
    """Call `callback()` (from the dying thread) when a model thread dies."""
    _death_listeners.append(callback)


def report_death() -> None:
    for callback in list(_death_listeners):
        callback()
