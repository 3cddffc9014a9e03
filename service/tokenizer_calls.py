"""Where work that uses an engine's tokenizer runs: on the event loop or in a
worker thread.

Tokenizing a short request takes a few tens of microseconds (the segment
cache holds a long system prompt already), while a hop to a worker thread and
back costs about 0.35 ms of latency on a busy engine core, several times the
work. So text up to INLINE_TEXT_CHARS runs on the loop: under a millisecond
even with nothing cached (about 0.2 us a character on a slow core).

Two things send it to a thread anyway. Longer text, so the loop never stalls
on one request. And any tokenizer work already running in a worker thread:
an engine serialises its tokenizer behind a lock (a Hugging Face tokenizer is
not safe to share between threads), so a short call made on the loop then
would hold the loop, and every stream it serves, until the long one finished.
Every tokenizer call of the engine's data plane goes through one
TokenizerCalls, so it knows which are in threads.
"""

from __future__ import annotations

import asyncio
import contextlib

INLINE_TEXT_CHARS = 4096


class TokenizerCalls:
    def __init__(self) -> None:
        self.in_threads = 0  # read and changed on the event loop only

    async def run(self, chars: int | None, fn, *args):
        """fn(*args), a call that uses the tokenizer on text of `chars`
        characters (None: of a size not known here, so in a thread)."""
        if chars is not None and chars <= INLINE_TEXT_CHARS and not self.in_threads:
            return fn(*args)
        loop = asyncio.get_running_loop()

        def in_thread():
            try:
                return fn(*args)
            finally:
                # Counted until the thread is done with the tokenizer, even
                # when the caller was cancelled and stopped waiting before.
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(self._left)

        self.in_threads += 1
        return await asyncio.to_thread(in_thread)

    def _left(self) -> None:
        self.in_threads -= 1
