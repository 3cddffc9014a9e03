"""Steering state that survives a restart, in the state database
(service/state: SQLite in the data dir, or PostgreSQL shared by replicas).

One table per kind of thing an operator manages. Every write is one
transaction, awaited off the event loop (a write and its fsync must not stall
every stream), and a write that fails (disk full, I/O error, database gone)
is rolled back whole and answered state_store_unavailable; the next write
works once the database does. Every write also bumps the one-row
state_version and announces it, which is how other replicas know to reload
(steering/replication.py). Reads go to the in-memory snapshot the manager
keeps; the database is read whole at start and whenever its version moves.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import time
from dataclasses import dataclass

from service.errors import EngineError
from service.state.database import STATE_CHANNEL, Database, SqliteDatabase, Tx, upsert
from service.state.migrations import migrate

_SETTING = upsert("settings", ("key", "value"), ("key",))
_ATTACHED = upsert("attached_saes", ("sae_id", "attached_at"), ("sae_id",))
_PROFILE = upsert("profiles", ("name", "description", "kind", "entries", "target", "created",
                               "updated"), ("name",))
_DOCUMENTS = {t: upsert(t, ("name", "document"), ("name",)) for t in ("clusters", "circuits")}
_PROBE = upsert("probes", ("name", "document"), ("name",))


@dataclass(frozen=True)
class Snapshot:
    """Everything the manager holds, read in one transaction."""

    version: int
    settings: dict
    attached: list[str]
    profiles: list[dict]
    clusters: list[dict]
    circuits: list[dict]
    probes: list[dict]  # monitoring's (steering/monitoring.py)


def state_conflict() -> EngineError:
    return EngineError("state_store_unavailable", "The steering state changed on another "
                       "replica while this change was being made; nothing was changed. Retry.")


def _profiles(tx: Tx) -> list[dict]:
    return [{"name": r[0], "description": r[1], "kind": r[2], "entries": json.loads(r[3]),
             "target": r[4], "created": r[5], "updated": r[6]} for r in tx.rows(
        "SELECT name, description, kind, entries, target, created, updated FROM profiles "
        "ORDER BY name")]


def _documents(tx: Tx, table: str) -> list[dict]:
    assert table in _DOCUMENTS
    return [json.loads(r[0]) for r in tx.rows(f"SELECT document FROM {table} ORDER BY name")]


def _probes(tx: Tx) -> list[dict]:
    return [json.loads(r[0]) for r in tx.rows("SELECT document FROM probes ORDER BY name")]


def _version(tx: Tx) -> int:
    row = tx.one("SELECT version FROM state_version WHERE id = 1")
    return int(row[0]) if row else 0


class SteeringStore:
    def __init__(self, database: Database | pathlib.Path):
        if isinstance(database, pathlib.Path):
            database = SqliteDatabase(database)
            migrate(database)
        self.db = database
        # The state_version this process's snapshot reflects (None: no
        # snapshot read yet, so a write does not check it).
        self.version: int | None = None

    def close(self) -> None:
        self.db.close()

    def _rows(self, sql: str) -> list[tuple]:
        return self.db.read(lambda tx: tx.rows(sql))

    # -- reading everything ------------------------------------------------------------

    def current_version(self) -> int:
        return self.db.read(_version)

    def snapshot(self) -> Snapshot:
        def work(tx: Tx) -> Snapshot:
            return Snapshot(
                _version(tx),
                {k: json.loads(v) for k, v in tx.rows("SELECT key, value FROM settings")},
                [r[0] for r in tx.rows("SELECT sae_id FROM attached_saes "
                                       "ORDER BY attached_at, sae_id")],
                _profiles(tx), _documents(tx, "clusters"), _documents(tx, "circuits"),
                _probes(tx))

        snapshot = self.db.read(work)
        self.version = snapshot.version
        return snapshot

    # -- writing ------------------------------------------------------------------------

    def _write(self, *statements: tuple[str, tuple]) -> int:
        expected = self.version

        def work(tx: Tx) -> int:
            if expected is None:
                row = tx.one("UPDATE state_version SET version = version + 1 WHERE id = 1 "
                             "RETURNING version")
            else:
                # The write lock makes this hold; it is checked all the same.
                row = tx.one("UPDATE state_version SET version = version + 1 WHERE id = 1 "
                             "AND version = ? RETURNING version", (expected,))
            if row is None:
                raise state_conflict()
            for sql, args in statements:
                tx.execute(sql, args)
            tx.notify(STATE_CHANNEL, str(row[0]))
            return int(row[0])

        self.version = self.db.transaction(work)
        return self.version

    async def write(self, *statements: tuple[str, tuple]) -> int:
        """Several changes in one transaction (say, a cluster and its profile);
        returns the new state version."""
        return await asyncio.to_thread(self._write, *statements)

    # -- settings: enabled, live values, active profile -------------------------------

    def settings(self) -> dict:
        return {k: json.loads(v) for k, v in self._rows("SELECT key, value FROM settings")}

    @staticmethod
    def setting_sql(key: str, value) -> tuple[str, tuple]:
        return (_SETTING, (key, json.dumps(value)))

    async def put_settings(self, **values) -> None:
        await self.write(*(self.setting_sql(k, v) for k, v in values.items()))

    # -- SAEs attached at start -----------------------------------------------------

    async def set_attached(self, sae_id: str, attached: bool) -> None:
        if attached:
            await self.write((_ATTACHED, (sae_id, time.time_ns())))
        else:
            await self.write(("DELETE FROM attached_saes WHERE sae_id = ?", (sae_id,)))

    # -- profiles ---------------------------------------------------------------------

    def profiles(self) -> list[dict]:
        return self.db.read(_profiles)

    @staticmethod
    def profile_sql(p: dict) -> tuple[str, tuple]:
        return (_PROFILE, (p["name"], p["description"], p["kind"], json.dumps(p["entries"]),
                           p["target"], p["created"], p["updated"]))

    @staticmethod
    def delete_profile_sql(name: str) -> tuple[str, tuple]:
        return ("DELETE FROM profiles WHERE name = ?", (name,))

    async def put_profile(self, profile: dict, *also: tuple[str, tuple]) -> None:
        await self.write(self.profile_sql(profile), *also)

    # -- clusters and circuits (their documents, dial included) -------------------------

    @staticmethod
    def put_document_sql(table: str, document: dict) -> tuple[str, tuple]:
        return (_DOCUMENTS[table], (document["name"], json.dumps(document)))

    @staticmethod
    def delete_document_sql(table: str, name: str) -> tuple[str, tuple]:
        assert table in _DOCUMENTS
        return (f"DELETE FROM {table} WHERE name = ?", (name,))

    # -- monitoring: probes and the per-model switch (a setting) -------------------------

    def probes(self) -> list[dict]:
        return self.db.read(_probes)

    async def put_probe(self, name: str, document: dict) -> None:
        await self.write((_PROBE, (name, json.dumps(document))))

    async def delete_probe(self, name: str) -> None:
        await self.write(("DELETE FROM probes WHERE name = ?", (name,)))

    async def set_monitoring(self, models: dict[str, bool]) -> None:
        await self.write(self.setting_sql("monitoring", models))
