"""Steering state that survives a restart, in SQLite in the data dir.

One table per kind of thing an operator manages. Every write is one
transaction, awaited off the event loop (a write and its fsync must not stall
every stream), and a write that fails (disk full, I/O error) is rolled back
whole and answered state_store_unavailable; the next write works once the
disk does. Reads go to the in-memory snapshot the manager keeps, so the
database is read once at start.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import sqlite3
import threading
import time

from service.errors import store_unavailable

SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS attached_saes (sae_id TEXT PRIMARY KEY, attached_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS profiles (
  name TEXT PRIMARY KEY, description TEXT NOT NULL, kind TEXT NOT NULL,
  entries TEXT NOT NULL, target TEXT NOT NULL, created INTEGER NOT NULL, updated INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS clusters (name TEXT PRIMARY KEY, document TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS circuits (name TEXT PRIMARY KEY, document TEXT NOT NULL);
"""


class SteeringStore:
    def __init__(self, path: pathlib.Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # Written from the event loop and read at start; the lock keeps a
        # to_thread caller from interleaving with another transaction.
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        self._db.close()

    def _write(self, *statements: tuple[str, tuple]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, args in statements:
                    self._db.execute(sql, args)
                # COMMIT is inside the try: a commit that fails (disk full, I/O
                # error) is rolled back too, or every later write would fail
                # with "cannot start a transaction within a transaction".
                self._db.execute("COMMIT")
            except BaseException as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise store_unavailable(exc) from exc
                raise

    async def _write_off_loop(self, *statements: tuple[str, tuple]) -> None:
        await asyncio.to_thread(self._write, *statements)

    def _rows(self, sql: str) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql).fetchall()

    # -- settings: enabled, live values, active profile -------------------------------

    def settings(self) -> dict:
        return {k: json.loads(v) for k, v in self._rows("SELECT key, value FROM settings")}

    async def put_settings(self, **values) -> None:
        await self._write_off_loop(*(
            ("INSERT INTO settings(key, value) VALUES (?, ?) ON CONFLICT(key) DO "
             "UPDATE SET value = excluded.value", (k, json.dumps(v))) for k, v in values.items()))

    # -- SAEs attached at start -----------------------------------------------------

    def attached_saes(self) -> list[str]:
        return [r[0] for r in self._rows("SELECT sae_id FROM attached_saes ORDER BY attached_at")]

    async def set_attached(self, sae_id: str, attached: bool) -> None:
        if attached:
            await self._write_off_loop(("INSERT OR REPLACE INTO attached_saes VALUES (?, ?)",
                                        (sae_id, time.time_ns())))
        else:
            await self._write_off_loop(("DELETE FROM attached_saes WHERE sae_id = ?", (sae_id,)))

    # -- profiles ---------------------------------------------------------------------

    def profiles(self) -> list[dict]:
        rows = self._rows("SELECT name, description, kind, entries, target, created, updated "
                          "FROM profiles ORDER BY name")
        return [{"name": r[0], "description": r[1], "kind": r[2], "entries": json.loads(r[3]),
                 "target": r[4], "created": r[5], "updated": r[6]} for r in rows]

    @staticmethod
    def _profile_row(p: dict) -> tuple:
        return (p["name"], p["description"], p["kind"], json.dumps(p["entries"]), p["target"],
                p["created"], p["updated"])

    async def put_profile(self, profile: dict, *also: tuple[str, tuple]) -> None:
        await self._write_off_loop(self.profile_sql(profile), *also)

    # -- clusters and circuits (their documents, dial included) -------------------------

    def documents(self, table: str) -> list[dict]:
        assert table in ("clusters", "circuits")
        return [json.loads(r[0]) for r in self._rows(f"SELECT document FROM {table} ORDER BY name")]

    @staticmethod
    def put_document_sql(table: str, document: dict) -> tuple[str, tuple]:
        assert table in ("clusters", "circuits")
        return (f"INSERT OR REPLACE INTO {table} VALUES (?, ?)",
                (document["name"], json.dumps(document)))

    @staticmethod
    def delete_document_sql(table: str, name: str) -> tuple[str, tuple]:
        assert table in ("clusters", "circuits")
        return (f"DELETE FROM {table} WHERE name = ?", (name,))

    @staticmethod
    def profile_sql(profile: dict) -> tuple[str, tuple]:
        return ("INSERT OR REPLACE INTO profiles VALUES (?, ?, ?, ?, ?, ?, ?)",
                SteeringStore._profile_row(profile))

    @staticmethod
    def delete_profile_sql(name: str) -> tuple[str, tuple]:
        return ("DELETE FROM profiles WHERE name = ?", (name,))

    async def write(self, *statements: tuple[str, tuple]) -> None:
        """Several changes in one transaction (say, a cluster and its profile)."""
        await self._write_off_loop(*statements)
