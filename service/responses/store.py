"""Stored responses of the Responses API, in the engine's state database.

Why here: a stored response must outlive the process and be readable by every
replica, like steering state, so it lives in the same SQLite file
(`<data dir>/steering.sqlite3`, or PostgreSQL when replicas share state:
service/state), in tables of its own, written transactionally. Reads go to the
database, never to a cache, so every replica sees a response the moment it is
saved. The store keeps documents it
does not read (the servicer's JSON of a StoredResponse and of each input
item) with the columns it does read: id, owner, creation time, item ids and
their order.

Retention: a response older than `max_age_s` is invisible and removed, and
past `max_count` responses the oldest are removed, both checked whenever one
is saved. Ownership: `owner` is the name of the API key that saved it; a
reader passes its own key name, or None for an admin (or an engine without
keys), which sees every response.

An id holding NUL is never stored (stored text cannot hold one: see
service/state/database.py), so a lookup of one finds nothing without asking
the database, which on PostgreSQL could not even compare with it.
"""

from __future__ import annotations

import pathlib
import time
from dataclasses import dataclass

from service.state.database import Database, SqliteDatabase, Tx
from service.state.migrations import migrate

# LIMIT needs a number on PostgreSQL (SQLite's -1 is not one): "all the rest".
_ALL = 1 << 62


def _unstorable(text: str) -> bool:
    return "\x00" in text


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
    def __init__(self, database: Database | pathlib.Path, retention: Retention | None = None,
                 clock=time.time):
        if isinstance(database, pathlib.Path):
            database = SqliteDatabase(database)
            migrate(database)
        self.db = database
        self.retention = retention or Retention()
        self._clock = clock

    def close(self) -> None:
        self.db.close()

    def _oldest_kept(self) -> float:
        return self._clock() - self.retention.max_age_s

    def _transaction(self, work):
        return self.db.transaction(work)

    def exists(self, response_id: str) -> bool:
        """Whether the id is taken, by any owner (expired rows included)."""
        if _unstorable(response_id):
            return False
        return self.db.read(lambda tx: tx.one("SELECT 1 FROM responses WHERE id = ?",
                                              (response_id,))) is not None

    def save(self, response_id: str, owner: str, document: str,
             items: list[tuple[str, str]]) -> int:
        """Store a response and its input items ((item id, document), oldest
        first) in one transaction; returns how many old responses the
        retention limits removed. Raises KeyError when the id is taken."""

        def work(tx: Tx) -> int:
            if tx.one("SELECT 1 FROM responses WHERE id = ?", (response_id,)):
                raise KeyError(response_id)
            tx.execute("INSERT INTO responses (id, owner, stored_at, document) "
                       "VALUES (?, ?, ?, ?)", (response_id, owner, self._clock(), document))
            if items:
                tx.executemany("INSERT INTO response_input_items (response_id, position, "
                               "item_id, document) VALUES (?, ?, ?, ?)",
                               [(response_id, i, item_id, doc)
                                for i, (item_id, doc) in enumerate(items)])
            return self._prune(tx)

        return self._transaction(work)

    def _prune(self, tx: Tx) -> int:
        doomed = [r[0] for r in tx.rows(
            "SELECT id FROM responses WHERE stored_at < ? UNION "
            "SELECT id FROM (SELECT id FROM responses ORDER BY stored_at DESC, id DESC "
            "LIMIT ? OFFSET ?) AS past_count",
            (self._oldest_kept(), _ALL, self.retention.max_count))]
        for response_id in doomed:
            self._delete(tx, response_id)
        return len(doomed)

    @staticmethod
    def _delete(tx: Tx, response_id: str) -> None:
        tx.execute("DELETE FROM response_input_items WHERE response_id = ?", (response_id,))
        tx.execute("DELETE FROM responses WHERE id = ?", (response_id,))

    def get(self, response_id: str, owner: str | None) -> Stored | None:
        """The response if `owner` may see it (None: any owner) and it has not
        expired; else None, whether it is missing or someone else's."""
        if _unstorable(response_id):
            return None
        row = self.db.read(lambda tx: tx.one(
            "SELECT owner, document FROM responses WHERE id = ? AND stored_at >= ?",
            (response_id, self._oldest_kept())))
        if row is None or (owner is not None and row[0] != owner):
            return None
        return Stored(response_id, row[0], row[1])

    def items(self, response_id: str) -> list[tuple[str, str]]:
        """(item id, document) of a response's input items, oldest first."""
        if _unstorable(response_id):
            return []
        return [tuple(r) for r in self.db.read(lambda tx: tx.rows(
            "SELECT item_id, document FROM response_input_items WHERE response_id = ? "
            "ORDER BY position", (response_id,)))]

    def delete(self, response_id: str, owner: str | None) -> bool:
        if _unstorable(response_id):
            return False

        def work(tx: Tx) -> bool:
            row = tx.one("SELECT owner FROM responses WHERE id = ? AND stored_at >= ?",
                         (response_id, self._oldest_kept()))
            if row is None or (owner is not None and row[0] != owner):
                return False
            self._delete(tx, response_id)
            return True

        return self._transaction(work)

    def prune(self) -> int:
        return self._transaction(self._prune)

    def count(self) -> int:
        return self.db.read(lambda tx: tx.one("SELECT COUNT(*) FROM responses")[0])
