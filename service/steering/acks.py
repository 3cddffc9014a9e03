"""Whether a management write is live on every replica, not only on the one
that took it.

Why: a write's answer says whether the value steers the next request
(`Liveness`), and behind a bridge the next request may land on any replica.
Every replica applies a write within milliseconds (replication.py), but
"within milliseconds" is not "now", and a replica may be stuck. So the
replica that took the write waits, briefly, for the others to confirm it, and
answers live only when every replica that answered has applied it, with both
counts in the answer.

How:
- Each replica has a random id for its life and a row in the `replicas`
  table (migration 3): the state version it applies and when it last said so.
  Its follower writes the row after each catch-up that moved the version and,
  as a heartbeat, on the once-a-second version check; a clean stop deletes it.
  `seen_at` is the database server's clock, so replicas' clocks need not agree.
- After a write commits and the cluster write lock is released (no other
  replica's write waits on ours), the writer reads the table, off the event
  loop, every POLL_S (sooner at first), until every replica seen in the last
  ANSWERING_S reports applied_version >= the write's version, for at most
  ACK_WAIT_S.
- A replica that stopped heartbeating (killed, or cut off from the database,
  when it serves its last applied state and says so on millm.state_store)
  stops counting after ANSWERING_S: it did not answer. Rows unseen for
  FORGET_S are deleted by whichever replica heartbeats next.
- A heartbeat that fails (the database is away) is skipped quietly: the
  listener already reports the outage, and the row going stale is the truth.

On SQLite (a lone engine) nothing is written or read: 1 of 1.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

from service.state.database import Database, Tx
from service.steering.manager import Live

log = logging.getLogger(__name__)

# A replica whose heartbeat is older than this did not answer.
ANSWERING_S = 3.0
# How long a write's answer waits for the other replicas to apply it.
ACK_WAIT_S = 1.0
# The table is read again after 2 ms, doubling to every 20 ms: the others
# usually apply a write within a few milliseconds.
POLL_FIRST_S, POLL_S = 0.002, 0.02
# An unchanged version is reported at most this often (the listener's version
# check comes once a second; a heartbeat or two may be missed within ANSWERING_S).
HEARTBEAT_S = 0.5
FORGET_S = 600.0


@dataclass(frozen=True)
class Acks:
    """How many replicas answered (this one included) and how many of them had
    applied the version; `error` when the table could not be read."""

    replicas: int = 1
    applied: int = 1
    waited_s: float = 0.0
    error: str = ""
    wait_s: float = 0.0  # how long it could have waited (0: looked once)


LONE = Acks()


def across(live: Live, acks: Acks) -> Live:
    """Live on this replica (manager.py's rule) and applied on every replica
    that answered."""
    counts = {"replicas": acks.replicas, "replicas_applied": acks.applied}
    if not live.live:
        return replace(live, **counts)
    if acks.error:
        return Live(False, f"live on this replica; whether the others applied it is unknown "
                    f"({acks.error})", **counts)
    if acks.applied < acks.replicas:
        within = f"within {acks.wait_s:g} s" if acks.wait_s else "now"
        return Live(False, f"applied on {acks.applied} of {acks.replicas} replicas {within}; "
                    "the others apply it when they catch up", **counts)
    return replace(live, **counts)


class Registry:
    """This replica's row in `replicas`, and the count of the others'."""

    def __init__(self, database: Database, available: Callable[[], bool] = lambda: True):
        self.database = database
        self.id = uuid.uuid4().hex
        self._available = available
        # One database call of ours at a time, and none once we have left.
        self._lock = threading.Lock()
        self._left = False
        self._reported: int | None = None
        self._reported_at = 0.0
        self._failing = False

    # -- this replica's row -------------------------------------------------------------

    def _report(self, version: int) -> None:
        now = self.database.now_sql

        def work(tx: Tx) -> None:
            tx.execute("INSERT INTO replicas (replica_id, applied_version, seen_at) VALUES "
                       f"(?, ?, {now}) ON CONFLICT (replica_id) DO UPDATE SET "
                       "applied_version = excluded.applied_version, seen_at = excluded.seen_at",
                       (self.id, version))
            tx.execute(f"DELETE FROM replicas WHERE seen_at < {now} - ?", (FORGET_S,))

        with self._lock:
            if not self._left:
                self.database.transaction(work)

    async def report(self, version: int) -> None:
        """Say which version this replica applies: at once when it moved, else
        as a heartbeat at most every HEARTBEAT_S."""
        if not self.database.shared or self._left:
            return
        now = time.monotonic()
        if version == self._reported and now - self._reported_at < HEARTBEAT_S:
            return
        try:
            await asyncio.to_thread(self._report, version)
        except Exception as exc:  # noqa: BLE001 - the database is away; the listener says so
            if not self._failing:
                log.debug("replica heartbeat failed: %s", exc)
            self._failing = True
            return
        self._failing = False
        self._reported, self._reported_at = version, now

    def _leave(self) -> None:
        with self._lock:
            self._left = True
            self.database.transaction(lambda tx: tx.execute(
                "DELETE FROM replicas WHERE replica_id = ?", (self.id,)))

    async def leave(self) -> None:
        """Delete this replica's row (a clean stop): it no longer answers."""
        if not self.database.shared or self._left:
            return
        if not self._available():
            self._left = True  # the row goes stale by itself
            return
        try:
            await asyncio.to_thread(self._leave)
        except Exception as exc:  # noqa: BLE001 - it goes stale instead
            log.debug("could not delete this replica's row: %s", exc)

    # -- the others -----------------------------------------------------------------------

    def _count(self, version: int) -> tuple[int, int]:
        rows = self.database.read(lambda tx: tx.rows(
            "SELECT applied_version FROM replicas WHERE replica_id <> ? AND seen_at >= "
            f"{self.database.now_sql} - ?", (self.id, ANSWERING_S)))
        return 1 + len(rows), 1 + sum(1 for (applied,) in rows if applied >= version)

    async def wait(self, version: int, wait_s: float = ACK_WAIT_S) -> Acks:
        """Until every replica that answers has applied `version`, for at most
        wait_s (0: look once)."""
        if not self.database.shared:
            return LONE
        start = time.monotonic()
        answered, applied, delay = 1, 1, POLL_FIRST_S
        while True:
            if not self._available():
                return Acks(answered, applied, time.monotonic() - start,
                            "the state database is unreachable", wait_s)
            try:
                answered, applied = await asyncio.to_thread(self._count, version)
            except Exception as exc:  # noqa: BLE001 - the write stands; say what is known
                log.debug("reading the replica registry failed: %s", exc)
                return Acks(answered, applied, time.monotonic() - start,
                            "the state database is unreachable", wait_s)
            waited = time.monotonic() - start
            if applied >= answered or waited >= wait_s:
                return Acks(answered, applied, waited, "", wait_s)
            await asyncio.sleep(delay)
            delay = min(delay * 2, POLL_S)
