"""Every replica applies every steering change.

Why: replicas behind one bridge share their state through PostgreSQL, but
each validates requests against an in-memory snapshot (steering/manager.py),
so each must notice the others' writes and reload, within a second.

How:
- Every write bumps `state_version` and sends NOTIFY millm_state in the same
  transaction (steering/store.py). Each replica LISTENs on its own
  connection (state/postgres.py Listener); a notification, and a version
  check once a second in case one was missed, makes it compare the version
  with its snapshot's and, if they differ, read the whole state in one
  consistent snapshot and swap it in (attaching or detaching SAEs to match).
- Writes go one at a time across the cluster: the WriteGate takes the
  database's write lock, catches up, then lets the manager validate the
  change against the state as it is now and write it. So "create" never
  overwrites another replica's profile, and an operator's change is never
  lost to a stale snapshot. A write whose caller gives up (a deadline) still
  runs to its end (`completes`), and the gate releases the lock whatever
  happens to its caller: a lock left held would stall every replica's writes.
- The database goes away: requests keep being served from the last applied
  snapshot; writes answer 503 state_store_unavailable; `available` turns
  False (the engine's health entry `millm.state_store` and the metric
  millm_engine_state_store_up follow it). When the listener reconnects, the
  replica catches up first and only then reports available again.
- After each catch-up (so at least once a second) the replica records the
  version it applies in the `replicas` table, which is how a write's answer
  knows whether every replica has applied it (steering/acks.py).

On SQLite (one engine, nothing shared) none of this runs: the gate is a plain
lock and the snapshot is always current.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from service.state.database import Database
from service.steering.acks import Registry
from service.steering.completion import keep

log = logging.getLogger(__name__)


class WriteGate:
    """`async with gate:` around a management write: one at a time here, and
    with a shared database one at a time in the cluster, on current state.

    The database's write lock is taken and released in worker threads. A
    caller cancelled meanwhile (`completes` spares the manager's writes that,
    but not every caller) must not leave it held: the thread goes on, and
    a task of its own releases the lock once the thread has it, and only
    then this replica's gate."""

    def __init__(self, follower: Follower):
        self._follower = follower
        self.lock = asyncio.Lock()

    async def __aenter__(self):
        await self.lock.acquire()
        db = self._follower.database
        if not db.shared:
            return self
        locking = asyncio.ensure_future(asyncio.to_thread(db.lock_writes))
        try:
            await asyncio.shield(locking)
        except asyncio.CancelledError:
            keep(asyncio.ensure_future(self._release(after=locking)))
            raise
        except BaseException:
            self.lock.release()
            raise
        try:
            await self._follower.catch_up_locked()
        except BaseException:
            await self._exit()
            raise
        return self

    async def __aexit__(self, *exc_info):
        await self._exit()

    async def _exit(self) -> None:
        """Release the database's lock, then the gate, even if cancelled meanwhile."""
        if not self._follower.database.shared:
            self.lock.release()
            return
        await asyncio.shield(keep(asyncio.ensure_future(self._release())))

    async def _release(self, after: asyncio.Future | None = None) -> None:
        try:
            if after is not None:
                try:
                    await after
                except Exception:  # noqa: BLE001 - it never took the lock
                    return
            await asyncio.to_thread(self._follower.database.unlock_writes)
        finally:
            self.lock.release()


class Follower:
    """Keeps the manager's snapshot at the database's version."""

    def __init__(self, manager, database: Database, url: str = "",
                 on_availability: Callable[[bool], object] | None = None):
        self.manager = manager
        self.store = manager.store
        self.database = database
        self._url = url
        self._on_availability = on_availability
        self.available = True
        self._recovering = False
        self.reloads = 0
        self.last_reload_at = 0.0
        self.gate = WriteGate(self)
        self.replicas = Registry(database, lambda: self.available)
        manager._lock = self.gate
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener = None
        self._wanted = asyncio.Event()
        self._task: asyncio.Task | None = None

    @property
    def applied_version(self) -> int:
        return self.store.version or 0

    def start(self) -> None:
        """Follow the database from now on (a shared one only)."""
        if not self.database.shared:
            return
        from service.state.postgres import Listener

        log.info("replica id %s (state database %s)", self.replicas.id, self.database.kind)
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._follow())
        self._listener = Listener(
            self._url,
            on_up=lambda: self._from_thread(self._reconnected),
            on_change=lambda: self._from_thread(self._wanted.set),
            on_down=lambda exc: self._from_thread(lambda: self._lost(exc)))
        self._listener.start()

    def stop(self) -> None:
        if self._listener is not None:
            self._listener.stop()
        if self._task is not None:
            self._task.cancel()

    async def leave(self) -> None:
        """A clean stop: this replica no longer counts as answering."""
        await self.replicas.leave()

    def _from_thread(self, fn) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn)

    def _reconnected(self) -> None:
        self._recovering = True
        self._wanted.set()

    def _lost(self, exc: BaseException) -> None:
        if self.available:
            log.warning("state database unreachable (%s): serving the last applied state "
                        "(version %d); writes answer 503", type(exc).__name__,
                        self.applied_version)
        self._set_available(False)

    def _set_available(self, available: bool) -> None:
        if available != self.available:
            self.available = available
            if self._on_availability is not None:
                result = self._on_availability(available)
                if asyncio.iscoroutine(result):
                    asyncio.ensure_future(result)

    async def _follow(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            try:
                await self.catch_up()
            except Exception as exc:  # noqa: BLE001 - the database is away; the listener says so
                log.debug("catching up failed: %s", exc)
                continue
            # Read with no await since catch_up released the gate: the
            # version is the one applied.
            await self.replicas.report(self.applied_version)
            if self._recovering:
                self._recovering = False
                log.info("state database reachable: caught up at version %d",
                         self.applied_version)
                self._set_available(True)

    async def catch_up(self) -> bool:
        async with self.gate.lock:
            return await self.catch_up_locked()

    async def catch_up_locked(self) -> bool:
        """Reload if the database moved on; True if it did. Gate lock held."""
        version = await asyncio.to_thread(self.store.current_version)
        if version == self.store.version:
            return False
        snapshot = await asyncio.to_thread(self.store.snapshot)
        await self.manager.follow(snapshot)
        self.reloads += 1
        self.last_reload_at = time.time()
        log.info("steering state reloaded at version %d", snapshot.version)
        return True
