"""Compiled grammars: cached by schema, compiled on a thread of their own,
and refused when compilation takes too long.

Compiling a grammar is CPU work in xgrammar's C++ that cannot be cancelled.
Run on asyncio's default executor, a few slow schemas would hold every one
of its threads while state-store reads and tokenization queue behind them;
so each vocabulary's compiles run one at a time on a dedicated thread. A
caller waits at most `limit_s` of that thread's time for its grammar and is
then refused (400 naming the field: `response_format_unsupported` for a
schema, `invalid_parameter` for a pattern or grammar); the
abandoned compile runs on (nothing can stop it) and its result is cached.
Pile-up is bounded: a request for a schema already compiling waits on that
same compile (a client retrying a slow schema starts nothing new), and at
most `max_pending` distinct compiles may be queued or running, past which a
request is refused with 503 `queue_full`. The limits of structured_output.py
and schema_limits.py (text size, counted repetitions) keep any one compile
short, whichever kind of constraint it is; the time limit is the backstop.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
import time

from service.errors import EngineError, model_busy
from service.structured_output import compiler_message, unsupported

COMPILE_LIMIT_S = 5.0
MAX_PENDING = 8


def _refusal(item, message: str) -> EngineError:
    """A compile past the limit: a schema's is unsupported, a pattern's or a
    grammar's an invalid parameter; either names the field."""
    if getattr(item, "is_json", True):
        return unsupported(item.param, message)
    return EngineError("invalid_parameter", message, item.param)


class _Compile:
    """One grammar being compiled: when it was asked for, when the grammar
    thread took it up, and its result."""

    def __init__(self):
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        # Running from the start: a waiter that gives up (its asyncio wrapper
        # cancelled) can never cancel the compile others wait on.
        self.future.set_running_or_notify_cancel()
        self.submitted = time.monotonic()
        self.started: float | None = None


class GrammarCache:
    """Compiled grammars by schema, for one vocabulary: a judge sending the
    same schema a million times compiles it once. Both engines build one,
    so both enforce the same subset with the same masks."""

    def __init__(self, info, capacity: int = 256, limit_s: float = COMPILE_LIMIT_S,
                 max_pending: int = MAX_PENDING):
        import xgrammar

        # xgrammar's own cache is keyed by the exact schema text; ours by the
        # canonical schema, and bounded.
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._entries: collections.OrderedDict[str, object] = collections.OrderedDict()
        self._compiling: dict[str, _Compile] = {}
        self._lock = threading.Lock()
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="grammar")
        self.capacity = capacity
        self.limit_s = limit_s
        self.max_pending = max_pending
        self.compiled_total = 0

    @classmethod
    def for_huggingface(cls, tokenizer, vocab_size: int, stop_ids: list[int],
                        **limits) -> GrammarCache:
        import xgrammar

        return cls(xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                           stop_token_ids=stop_ids), **limits)

    @classmethod
    def for_token_bytes(cls, token_bytes: list[bytes], stop_ids: list[int],
                        **limits) -> GrammarCache:
        """A vocabulary given as each token's bytes (llama.cpp's pieces);
        tokens with no bytes (control tokens) are never allowed."""
        import xgrammar

        return cls(xgrammar.TokenizerInfo(token_bytes, xgrammar.VocabType.RAW,
                                          vocab_size=len(token_bytes),
                                          stop_token_ids=stop_ids), **limits)

    def get(self, item):
        """The compiled grammar of a Constraint or a tools.ToolPlan (anything
        with a canonical `key`, the `param` a refusal names and a
        `compile(compiler)`; a Constraint also says how it is refused),
        waiting for it without a time limit (tools and
        tests off the event loop)."""
        return self._submit(item).future.result()

    async def compiled(self, item):
        """The compiled grammar, or a 400 naming the item's field when its
        compile ran past `limit_s` on the grammar thread. Time queued behind
        other compiles is not counted against it, up to `max_pending` limits
        (then the engine is busy: 503 `queue_full`)."""
        key = item.key
        with self._lock:  # compiled before: no job, no future to wait on
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        job = self._submit(item)
        waiting = asyncio.wrap_future(job.future)
        try:
            while True:
                if job.future.done():  # finished, even if past the limit: served
                    return job.future.result()
                now, started = time.monotonic(), job.started
                if started is None:
                    left = job.submitted + self.limit_s * self.max_pending - now
                    if left <= 0:
                        raise EngineError("queue_full", "The grammar compiler is busy; retry "
                                          "shortly.", details={"retry_after_s": 1})
                    left = min(left, self.limit_s)
                else:
                    left = started + self.limit_s - now
                    if left <= 0:
                        raise _refusal(item, f"The grammar for '{item.param}' took longer "
                                       f"than {self.limit_s:g} s to compile; simplify it.")
                done, _ = await asyncio.wait({waiting}, timeout=left)
                if done:
                    return waiting.result()
        finally:
            waiting.cancel()  # ends only this wait: the compile itself runs on

    def _submit(self, item) -> _Compile:
        key = item.key
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                job = _Compile()
                job.future.set_result(self._entries[key])
                return job
            job = self._compiling.get(key)
            if job is not None:
                return job  # the same schema is compiling already: wait on it
            if len(self._compiling) >= self.max_pending:
                raise EngineError("queue_full", f"{self.max_pending} grammars are compiling "
                                  "already; retry shortly.", details={"retry_after_s": 1})
            job = self._compiling[key] = _Compile()
        try:
            self._thread.submit(self._run, key, item, job)
        except RuntimeError:  # closed: its engine is shutting down
            with self._lock:
                del self._compiling[key]
            raise model_busy("The model is being unloaded; retry shortly.") from None
        return job

    def _run(self, key: str, item, job: _Compile) -> None:
        job.started = time.monotonic()
        try:
            grammar = item.compile(self._compiler)
        except Exception as exc:  # xgrammar raises plain RuntimeErrors (say, a bad pattern)
            with self._lock:
                del self._compiling[key]
            refused = getattr(item, "refused", None)
            job.future.set_exception(
                refused(compiler_message(exc)) if refused is not None else unsupported(
                    item.param, f"The schema could not be compiled into a grammar: {exc}"))
            return
        with self._lock:
            del self._compiling[key]
            self._entries[key] = grammar
            self.compiled_total += 1
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        job.future.set_result(grammar)

    def close(self) -> None:
        """Take no more compiles. Those queued (at most `max_pending`) still
        run, so whoever waits on one gets its answer."""
        self._thread.shutdown(wait=False)
