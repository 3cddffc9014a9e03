"""Stored responses of the Responses API, in the engine's state database.

Why here: a stored response must outlive the process and be readable by every
replica, like steering state, so it lives in the same SQLite file
(`<data dir>/steering.sqlite3`; PostgreSQL once replicas share state), in
tables of its own, written transactionally. The store keeps documents it
does not read (the servicer's JSON of a StoredResponse and of each input
item) with the columns it does read: id, owner, creation time, item ids and
their order.

Retention: a response older than `max_age_s` is invisible and removed, and
past `max_count` responses the oldest are removed, both checked whenever one
is saved. Ownership: `owner` is the name of the API key that saved it; a
reader passes its own key name, or None for an admin (or an engine without
keys), which sees every response.
"""

from __future__ import annotations

import pathlib
import sqlite3
import threading
import time
from dataclasses import dataclass

from service.errors import store_unavailable

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
  id TEXT PRIMARY KEY, owner TEXT NOT NULL, stored_at REAL NOT NULL, document TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS responses_by_age ON responses (stored_at);
CREATE TABLE IF NOT EXISTS response_input_items (
  response_id TEXT NOT NULL, position INTEGER NOT NULL, item_id TEXT NOT NULL,
  document TEXT NOT NULL, PRIMARY KEY (response_id, position));
"""


@dataclass(frozen=True)
class Retention:
    max_count: int = 10_000
    max_age_s: float = 30 * 86_400


@dataclass(frozen=True)
class Stored:
    id: str
    owner: str
    document: str


class ResponseStore:
    def __init__(self, path: pathlib.Path, retention: Retention | None = None, clock=time.time):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.retention = retention or Retention()
        self._clock = clock
        # A connection of its own to the shared file; sqlite3's default busy
        # timeout (5 s) lets its writes and the steering store's take turns.
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        self._db.close()

    def _oldest_kept(self) -> float:
        return self._clock() - self.retention.max_age_s

    def _transaction(self, work):
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                result = work(self._db)
                # Inside the try: a failed COMMIT (disk full) is rolled back too.
                self._db.execute("COMMIT")
            except BaseException as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise store_unavailable(exc) from exc
                raise
            return result

    def exists(self, response_id: str) -> bool:
        """Whether the id is taken, by any owner (expired rows included)."""
        with self._lock:
            row = self._db.execute("SELECT 1 FROM responses WHERE id = ?",
                                   (response_id,)).fetchone()
        return row is not None

    def save(self, response_id: str, owner: str, document: str,
             items: list[tuple[str, str]]) -> int:
        """Store a response and its input items ((item id, document), oldest
        first) in one transaction; returns how many old responses the
        retention limits removed. Raises KeyError when the id is taken."""

        def work(db: sqlite3.Connection) -> int:
            if db.execute("SELECT 1 FROM responses WHERE id = ?", (response_id,)).fetchone():
                raise KeyError(response_id)
            db.execute("INSERT INTO responses VALUES (?, ?, ?, ?)",
                       (response_id, owner, self._clock(), document))
            db.executemany("INSERT INTO response_input_items VALUES (?, ?, ?, ?)",
                           [(response_id, i, item_id, doc)
                            for i, (item_id, doc) in enumerate(items)])
            return self._prune(db)

        return self._transaction(work)

    def _prune(self, db: sqlite3.Connection) -> int:
        doomed = [r[0] for r in db.execute(
            "SELECT id FROM responses WHERE stored_at < ? UNION "
            "SELECT id FROM (SELECT id FROM responses ORDER BY stored_at DESC, rowid DESC "
            "LIMIT -1 OFFSET ?)", (self._oldest_kept(), self.retention.max_count))]
        for response_id in doomed:
            self._delete(db, response_id)
        return len(doomed)

    @staticmethod
    def _delete(db: sqlite3.Connection, response_id: str) -> None:
        db.execute("DELETE FROM response_input_items WHERE response_id = ?", (response_id,))
        db.execute("DELETE FROM responses WHERE id = ?", (response_id,))

    def get(self, response_id: str, owner: str | None) -> Stored | None:
        """The response if `owner` may see it (None: any owner) and it has not
        expired; else None, whether it is missing or someone else's."""
        with self._lock:
            row = self._db.execute(
                "SELECT owner, document FROM responses WHERE id = ? AND stored_at >= ?",
                (response_id, self._oldest_kept())).fetchone()
        if row is None or (owner is not None and row[0] != owner):
            return None
        return Stored(response_id, row[0], row[1])

    def items(self, response_id: str) -> list[tuple[str, str]]:
        """(item id, document) of a response's input items, oldest first."""
        with self._lock:
            return self._db.execute(
                "SELECT item_id, document FROM response_input_items WHERE response_id = ? "
                "ORDER BY position", (response_id,)).fetchall()

    def delete(self, response_id: str, owner: str | None) -> bool:
        def work(db: sqlite3.Connection) -> bool:
            row = db.execute("SELECT owner FROM responses WHERE id = ? AND stored_at >= ?",
                             (response_id, self._oldest_kept())).fetchone()
            if row is None or (owner is not None and row[0] != owner):
                return False
            self._delete(db, response_id)
            return True

        return self._transaction(work)

    def prune(self) -> int:
        return self._transaction(self._prune)

    def count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]
