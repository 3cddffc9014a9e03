"""The state database on PostgreSQL (MILLM_DATABASE_URL=postgresql://…), for
replicas that share their state.

Driver: psycopg 3. It is the maintained successor of psycopg2 from the same
project, ships binary wheels (no compiler, libpq included), has both a
synchronous API, which fits the stores' "run the transaction in a worker
thread" model as SQLite does, and LISTEN/NOTIFY with a timeout
(`Connection.notifies`), which is how replicas hear of each other's writes.
asyncpg is asyncio-only and would have split the stores into two code paths.

Connections: one for transactions (one at a time, like SQLite's), one that
holds the cluster-wide write lock while a management write runs, and one in
the listener's thread. Each is reopened on its next use after the server went
away; until then every call answers state_store_unavailable. TCP keepalives
and a statement timeout bound how long a call can hang on a dead server.
Errors are classed as on SQLite (database.store_error): only the server or
the connection failing is 503; a value PostgreSQL refuses is a 400.

The write lock is a session advisory lock, held across the transactions of
one management write (catch up, then write). Whoever takes it must release
it whatever happens to its caller: replication.WriteGate sees to that, since
a lock left held stalls every replica's writes until this connection drops.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg

from service.state.database import STATE_CHANNEL, Database, Tx, store_error

log = logging.getLogger(__name__)

# Advisory lock keys (any two numbers unique to miLLM in this database).
MIGRATION_LOCK = 0x6D694C4C4D01
WRITE_LOCK = 0x6D694C4C4D02

CONNECT_TIMEOUT_S = 3
STATEMENT_TIMEOUT = "10s"


def connect(url: str) -> psycopg.Connection:
    conn = psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                           application_name="millm-engine", keepalives=1, keepalives_idle=5,
                           keepalives_interval=2, keepalives_count=2)
    conn.execute(f"SET statement_timeout = '{STATEMENT_TIMEOUT}'")
    return conn


def _pg(sql: str) -> str:
    return sql.replace("?", "%s")


class _PgTx(Tx):
    def __init__(self, conn: psycopg.Connection):
        self._conn = conn

    def execute(self, sql, args=()):
        self._conn.execute(_pg(sql), tuple(args))

    def executemany(self, sql, rows):
        with self._conn.cursor() as cur:
            cur.executemany(_pg(sql), [tuple(r) for r in rows])

    def rows(self, sql, args=()):
        return self._conn.execute(_pg(sql), tuple(args)).fetchall()

    def notify(self, channel, payload):
        # Delivered at commit, to every connection LISTENing on the channel.
        self._conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


class _Connection:
    """A connection reopened on use once it broke."""

    def __init__(self, url: str):
        self._url = url
        self._conn: psycopg.Connection | None = None
        self.lock = threading.Lock()

    def get(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            self._conn = connect(self._url)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


class PostgresDatabase(Database):
    kind = "postgresql"
    shared = True
    now_sql = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"

    def __init__(self, url: str):
        self.url = url
        self._main = _Connection(url)
        self._writer = _Connection(url)
        self._holding = False

    def _run(self, work, *, migration_lock: bool = False, read_only: bool = False):
        with self._main.lock:
            try:
                conn = self._main.get()
                with conn.transaction():
                    if read_only:
                        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    if migration_lock:
                        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                    return work(_PgTx(conn))
            except psycopg.Error as exc:
                raise store_error(exc, psycopg) from exc

    def transaction(self, work, *, migration_lock=False):
        return self._run(work, migration_lock=migration_lock)

    def read(self, work):
        return self._run(work, read_only=True)

    def lock_writes(self) -> None:
        with self._writer.lock:
            try:
                self._writer.get().execute("SELECT pg_advisory_lock(%s)", (WRITE_LOCK,))
                self._holding = True
            except psycopg.Error as exc:
                raise store_error(exc, psycopg) from exc

    def unlock_writes(self) -> None:
        with self._writer.lock:
            if not self._holding:
                return
            self._holding = False
            try:
                self._writer.get().execute("SELECT pg_advisory_unlock(%s)", (WRITE_LOCK,))
            except psycopg.Error as exc:
                # A lost connection released its session locks with it.
                log.warning("could not release the state write lock: %s", type(exc).__name__)

    def close(self) -> None:
        self._main.close()
        self._writer.close()


class Listener:
    """A thread that LISTENs for state writes and reports to callbacks:
    on_up once connected (again), on_change for each notification and once a
    tick (a version check in case a notification was missed), on_down when
    the server is unreachable. Reconnects every retry_s."""

    def __init__(self, url: str, on_up: Callable[[], None], on_change: Callable[[], None],
                 on_down: Callable[[BaseException], None], tick_s: float = 1.0,
                 retry_s: float = 0.5):
        self._url = url
        self._on_up, self._on_change, self._on_down = on_up, on_change, on_down
        self._tick_s, self._retry_s = tick_s, retry_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="millm-state-listener",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with connect(self._url) as conn:
                    conn.execute(f"LISTEN {STATE_CHANNEL}")
                    self._on_up()
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=self._tick_s):
                            self._on_change()
                        conn.execute("SELECT 1")  # a dead server shows here
                        self._on_change()
            except psycopg.Error as exc:
                if self._stop.is_set():
                    return
                self._on_down(exc)
                self._stop.wait(self._retry_s)
