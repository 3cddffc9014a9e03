"""Management writes that run to their end even when their caller leaves.

Why: grpc.aio cancels an RPC's task when its client gives up (a deadline).
A steering write cancelled half-way could commit to the database and skip
the snapshot update after it (this replica would disagree with the database
until the next write), or abandon the cluster write lock while its thread
still waits for it (steering/replication.py: every replica's writes would
then stall until that connection drops). A write decorated with `completes`
runs as a task of its own: a cancelled caller stops waiting for it, the
write goes on, and its change is whole or absent, in memory as in the
database. `keep` holds such tasks until they are done.
"""

from __future__ import annotations

import asyncio
import functools
import logging

log = logging.getLogger(__name__)


def completes(write):
    """Run `write` to its end even if its caller is cancelled (see above)."""

    @functools.wraps(write)
    async def run(*args, **kwargs):
        task = asyncio.ensure_future(write(*args, **kwargs))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            keep(task)
            raise

    return run


# Tasks that nobody awaits any more, referenced until done (asyncio holds
# tasks weakly).
_unawaited: set[asyncio.Future] = set()


def keep(task: asyncio.Future) -> asyncio.Future:
    _unawaited.add(task)
    task.add_done_callback(_finished)
    return task


def _finished(task: asyncio.Future) -> None:
    _unawaited.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("a state task nobody awaits failed: %s", type(task.exception()).__name__)
