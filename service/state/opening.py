"""Opening the configured state database: SQLite or PostgreSQL by the URL,
migrated to the current schema before anything uses it.

Its own module because it is the one place that knows every part of
service/state: the interface and SQLite (database.py), PostgreSQL
(postgres.py) and the schema (migrations.py). Those import database.py;
kept in database.py, the opener made database.py import them back.
"""

from __future__ import annotations

import logging
import pathlib
import time

from service.errors import EngineError
from service.state import migrations
from service.state.database import Database, SqliteDatabase

log = logging.getLogger(__name__)


def open_database(url: str, data_dir: pathlib.Path, wait_s: float = 30.0) -> Database:
    """The configured database, migrated to the current schema. An empty URL
    is the SQLite file in the data dir. A database server that is not up yet
    (replicas and their database often start together) is waited for up to
    wait_s; then the error stands and the engine exits for its supervisor."""
    if url.startswith(("postgresql://", "postgres://")):
        # Imported here: psycopg is loaded only where PostgreSQL is used.
        from service.state.postgres import PostgresDatabase

        database: Database = PostgresDatabase(url)
    elif url == "" or url.startswith("sqlite:"):
        path = pathlib.Path(url.removeprefix("sqlite:")) if url else (
            data_dir / "steering.sqlite3")
        database = SqliteDatabase(path)
    else:
        raise ValueError("MILLM_DATABASE_URL must start with postgresql:// or sqlite:")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            migrations.migrate(database)
            return database
        except EngineError as exc:
            if not database.shared or time.monotonic() > deadline:
                raise
            log.warning("state database not reachable yet (%s); retrying", exc.message)
            time.sleep(1.0)
