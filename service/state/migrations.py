"""Versioned schema migrations, applied at start under the database's lock.

Why: replicas share one database and may start together, and a data dir may
hold a file written by an older release. Each migration has a number and runs
once; `schema_migrations` records which ran. The whole check-and-apply is one
transaction under the migration lock (PostgreSQL: a transaction-scoped
advisory lock; SQLite: its write lock), so of two engines starting on an empty
database one applies the migrations and the other waits, then finds them done.
PostgreSQL's DDL is transactional, so a migration that fails leaves nothing
half-made.

Migration 1 is the schema SQLite files had before migrations existed, written
with IF NOT EXISTS, so such a file is adopted as it is. Add a migration by
appending to MIGRATIONS; never edit one that has shipped.
"""

from __future__ import annotations

import logging
import time

from service.state.database import Database, Tx

log = logging.getLogger(__name__)

MIGRATIONS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (1, "steering state, stored responses, the state version", (
        "CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS attached_saes (sae_id TEXT PRIMARY KEY, "
        "attached_at BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS profiles (name TEXT PRIMARY KEY, description TEXT NOT NULL, "
        "kind TEXT NOT NULL, entries TEXT NOT NULL, target TEXT NOT NULL, "
        "created BIGINT NOT NULL, updated BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS clusters (name TEXT PRIMARY KEY, document TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS circuits (name TEXT PRIMARY KEY, document TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, owner TEXT NOT NULL, "
        "stored_at DOUBLE PRECISION NOT NULL, document TEXT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS responses_by_age ON responses (stored_at)",
        "CREATE TABLE IF NOT EXISTS response_input_items (response_id TEXT NOT NULL, "
        "position BIGINT NOT NULL, item_id TEXT NOT NULL, document TEXT NOT NULL, "
        "PRIMARY KEY (response_id, position))",
        # One row: bumped by every steering write, so a replica knows whether
        # its snapshot is current by comparing one number.
        "CREATE TABLE IF NOT EXISTS state_version (id BIGINT PRIMARY KEY, "
        "version BIGINT NOT NULL)",
        "INSERT INTO state_version (id, version) VALUES (1, 0) ON CONFLICT (id) DO NOTHING",
    )),
    (2, "monitoring probes", (
        "CREATE TABLE IF NOT EXISTS probes (name TEXT PRIMARY KEY, document TEXT NOT NULL)",
    )),
    # Each running replica's row: the state version it applies, and when it
    # last said so (the database's clock), so a write can tell whether every
    # replica that answers has applied it (steering/acks.py).
    (3, "replica registry", (
        "CREATE TABLE IF NOT EXISTS replicas (replica_id TEXT PRIMARY KEY, "
        "applied_version BIGINT NOT NULL, seen_at DOUBLE PRECISION NOT NULL)",
    )),
    # What a feature means, set by a user or imported (steering/explanations.py).
    (4, "feature explanations", (
        "CREATE TABLE IF NOT EXISTS feature_explanations (sae_id TEXT NOT NULL, "
        "feature BIGINT NOT NULL, text TEXT NOT NULL, source TEXT NOT NULL, "
        "updated BIGINT NOT NULL, PRIMARY KEY (sae_id, feature))",
    )),
    # OpenAI's Files and Batch APIs (service/batches).
    (5, "files and batches", (
        "CREATE TABLE IF NOT EXISTS files (id TEXT PRIMARY KEY, owner TEXT NOT NULL, "
        "purpose TEXT NOT NULL, filename TEXT NOT NULL, bytes BIGINT NOT NULL, "
        "created_at BIGINT NOT NULL, content TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS batches (id TEXT PRIMARY KEY, owner TEXT NOT NULL, "
        "created_at BIGINT NOT NULL, status TEXT NOT NULL, document TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS batch_lines (batch_id TEXT NOT NULL, line BIGINT NOT NULL, "
        "custom_id TEXT NOT NULL, url TEXT NOT NULL, body TEXT NOT NULL, state TEXT NOT NULL, "
        "claimed_by TEXT NOT NULL, claimed_until DOUBLE PRECISION NOT NULL, "
        "status_code BIGINT NOT NULL, output TEXT NOT NULL, PRIMARY KEY (batch_id, line))",
        "CREATE INDEX IF NOT EXISTS batch_lines_by_state ON batch_lines (batch_id, state)",
    )),
)

LATEST = MIGRATIONS[-1][0]


def migrate(database: Database) -> list[int]:
    """Apply the migrations this database lacks; returns their numbers."""

    def work(tx: Tx) -> list[int]:
        tx.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, "
                   "description TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)")
        done = {r[0] for r in tx.rows("SELECT version FROM schema_migrations")}
        newer = [v for v in done if v > LATEST]
        if newer:
            raise RuntimeError(f"the state database has schema version {max(newer)}, newer "
                               f"than this engine's {LATEST}: upgrade the engine")
        applied = []
        for version, description, statements in MIGRATIONS:
            if version in done:
                continue
            for sql in statements:
                tx.execute(sql)
            tx.execute("INSERT INTO schema_migrations (version, description, applied_at) "
                       "VALUES (?, ?, ?)", (version, description, time.time()))
            applied.append(version)
        return applied

    applied = database.transaction(work, migration_lock=True)
    if applied:
        log.info("state database (%s): applied migrations %s", database.kind, applied)
    else:
        log.info("state database (%s): schema is current (version %d)", database.kind, LATEST)
    return applied
