"""The state database: one small interface, two implementations.

Why: the steering state and the stored responses must be durable, and with
several engine replicas they must be shared. SQLite in the data dir serves one
engine with nothing to run; PostgreSQL (service/state/postgres.py) serves many;
service/state/opening.py opens the one configured. The stores above
(steering/store.py, responses/store.py) write one SQL dialect that both
accept, so the same code runs on either:

- placeholders are `?` (the PostgreSQL side turns them into `%s`), and SQL
  text holds no `%` and no literal `?`;
- column types are TEXT, BIGINT and DOUBLE PRECISION;
- upserts are `INSERT ... ON CONFLICT (key) DO UPDATE` (see `upsert`), never
  SQLite's `INSERT OR REPLACE`; `RETURNING` works on both.

Every call is synchronous and meant to run off the event loop
(asyncio.to_thread). A transaction is all or nothing; a database error rolls
it back and becomes an EngineError by its DB-API class (`store_error`, the
same table for both drivers): the database failing (disk full, connection
lost, a timeout) is state_store_unavailable (503), and the next call works
once the database does; a value the database refuses (DataError,
IntegrityError) is the caller's 400; a statement the database cannot run is
the engine's own fault, internal_error (500), never "retry later".

Text the state database stores holds no NUL character: PostgreSQL's text
cannot, so SQLite's may not either, and the engine refuses one where it
validates the field (`check_storable`), naming it, on both databases alike.
"""

from __future__ import annotations

import logging
import pathlib
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from service.errors import EngineError, internal_error, invalid_parameter, store_unavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

# The channel a steering write announces its new version on (PostgreSQL).
STATE_CHANNEL = "millm_state"


def check_storable(value: str, param: str, error=invalid_parameter) -> str:
    """A text field the state database will store: refused (400 naming it) if
    it holds NUL, which PostgreSQL's text cannot hold."""
    if "\x00" in value:
        raise error(param, f"'{param}' holds a NUL character (U+0000), which stored text "
                    "cannot hold.")
    return value


def store_error(exc: BaseException, api) -> EngineError:
    """A driver's error (`api` is its DB-API module: sqlite3 or psycopg) as
    the engine answers it; see the module docstring. Only the class is told:
    a driver's text can quote file paths or stored values."""
    name = type(exc).__name__
    if isinstance(exc, (api.DataError, api.IntegrityError)):
        return EngineError("invalid_parameter", f"The state database refused a value of this "
                           f"request ({name}); nothing was changed.")
    if isinstance(exc, (api.ProgrammingError, api.NotSupportedError)):
        log.error("the state database refused a statement: %r", exc)
        return internal_error()
    return store_unavailable(exc)


class Tx:
    """What a transaction's work sees: execute, rows, one, notify."""

    def execute(self, sql: str, args: Sequence[Any] = ()) -> None:
        raise NotImplementedError

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        raise NotImplementedError

    def rows(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        raise NotImplementedError

    def one(self, sql: str, args: Sequence[Any] = ()) -> tuple | None:
        found = self.rows(sql, args)
        return found[0] if found else None

    def notify(self, channel: str, payload: str) -> None:
        """Tell the other replicas at commit (a no-op where there are none)."""


class Database:
    """A state database. `kind` is "sqlite" or "postgresql"."""

    kind = ""
    # Whether other processes may write the same state (replicas follow it).
    shared = False
    # The database server's clock in seconds since the epoch, as an SQL
    # expression: replicas compare times on one clock, not on their own.
    now_sql = "(julianday('now') - 2440587.5) * 86400.0"

    def transaction(self, work: Callable[[Tx], T], *, migration_lock: bool = False) -> T:
        """Run work(tx) in one transaction. With migration_lock, no other
        engine runs a migration_lock transaction on this database meanwhile."""
        raise NotImplementedError

    def read(self, work: Callable[[Tx], T]) -> T:
        """Run work(tx) on one consistent snapshot, writing nothing."""
        return self.transaction(work)

    def lock_writes(self) -> None:
        """Hold the database-wide write lock until unlock_writes (replicas
        write one at a time, each on the state the previous one left)."""

    def unlock_writes(self) -> None:
        pass

    def close(self) -> None:
        raise NotImplementedError


def upsert(table: str, columns: Sequence[str], key: Sequence[str]) -> str:
    """INSERT that replaces the row with the same key, on both databases."""
    update = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key) or None
    conflict = f"DO UPDATE SET {update}" if update else "DO NOTHING"
    return (f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
            f"({', '.join('?' for _ in columns)}) ON CONFLICT ({', '.join(key)}) {conflict}")


class _SqliteTx(Tx):
    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn

    def execute(self, sql, args=()):
        self._conn.execute(sql, tuple(args))

    def executemany(self, sql, rows):
        self._conn.executemany(sql, [tuple(r) for r in rows])

    def rows(self, sql, args=()):
        return self._conn.execute(sql, tuple(args)).fetchall()


class SqliteDatabase(Database):
    """One file in the data dir, one connection, one writer at a time (WAL,
    synchronous=FULL: a committed change survives a power cut)."""

    kind = "sqlite"

    def __init__(self, path: pathlib.Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")

    def transaction(self, work, *, migration_lock=False):
        # BEGIN IMMEDIATE takes SQLite's write lock at once: it is the
        # migration lock too.
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                result = work(_SqliteTx(self._conn))
                # Inside the try: a failed COMMIT (disk full) is rolled back
                # too, or every later write would fail with "cannot start a
                # transaction within a transaction".
                self._conn.execute("COMMIT")
            except BaseException as exc:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise store_error(exc, sqlite3) from exc
                raise
            return result

    def read(self, work):
        with self._lock:
            try:
                return work(_SqliteTx(self._conn))
            except sqlite3.Error as exc:
                raise store_error(exc, sqlite3) from exc

    def close(self) -> None:
        self._conn.close()

