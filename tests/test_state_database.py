"""The state database's two implementations behind one interface: the same
stores on SQLite and on a real PostgreSQL (tests/postgres.py), migrations
applied once under a lock, a stopped server answered state_store_unavailable
and recovered from without a restart."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest

from service.errors import EngineError
from service.responses.store import ResponseStore, Retention
from service.state import migrations
from service.state.database import SqliteDatabase
from service.state.opening import open_database
from service.state.postgres import Listener, PostgresDatabase
from service.steering.store import SteeringStore


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path, pg):
    if request.param == "sqlite":
        db = open_database("", tmp_path)
    else:
        db = PostgresDatabase(pg.url)
        db.transaction(lambda tx: [tx.execute(f"DROP TABLE IF EXISTS {t}") for t in (
            "schema_migrations", "settings", "attached_saes", "profiles", "clusters", "circuits",
            "responses", "response_input_items", "state_version")])
        migrations.migrate(db)
    yield db
    db.close()


class Clock:
    now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_the_steering_store_reads_back_what_it_wrote_and_counts_versions(database):
    store = SteeringStore(database)
    assert store.snapshot().version == 0
    profile = {"name": "p", "description": "d", "kind": "features",
               "entries": [{"layer": 1, "feature": 2, "strength": 3.0}], "target": "",
               "created": 1, "updated": 2}
    assert asyncio.run(store.write(store.profile_sql(profile),
                                   store.setting_sql("active_profile", "p"))) == 1
    profile["description"] = "changed"  # the upsert replaces the row
    asyncio.run(store.put_profile(profile))
    asyncio.run(store.set_attached("sae-a", True))
    asyncio.run(store.write(store.put_document_sql("clusters", {"name": "c", "x": 1})))
    other = SteeringStore(database).snapshot()
    assert other.version == 4
    assert other.profiles == [profile]
    assert other.settings == {"active_profile": "p"}
    assert other.attached == ["sae-a"] and other.clusters == [{"name": "c", "x": 1}]


def test_a_write_on_a_stale_snapshot_is_refused(database):
    first, second = SteeringStore(database), SteeringStore(database)
    first.snapshot()
    second.snapshot()
    asyncio.run(first.put_settings(enabled=False))
    with pytest.raises(EngineError) as caught:
        asyncio.run(second.put_settings(enabled=True))
    assert caught.value.code == "state_store_unavailable"
    assert SteeringStore(database).settings() == {"enabled": False}


def test_stored_responses_keep_their_retention_rules(database):
    clock = Clock()
    store = ResponseStore(database, Retention(max_count=3, max_age_s=100), clock)
    for i in range(4):
        clock.now += 1
        store.save(f"resp_{i}", "alice", "{}", [(f"msg_{i}", "{}"), (f"msg_{i}b", "{}")])
    assert store.count() == 3 and store.get("resp_0", None) is None
    assert store.items("resp_1") == [("msg_1", "{}"), ("msg_1b", "{}")]
    clock.now += 99
    assert store.get("resp_1", None) is None and store.prune() == 1 and store.count() == 2
    with pytest.raises(KeyError):
        store.save("resp_3", "bob", "{}", [])
    assert store.get("resp_3", "bob") is None and store.get("resp_3", "alice").owner == "alice"
    assert store.delete("resp_3", None) and store.count() == 1


def test_engines_starting_together_migrate_once(pg):
    PostgresDatabase(pg.url).transaction(lambda tx: tx.execute(
        "DROP TABLE IF EXISTS schema_migrations, settings, attached_saes, profiles, clusters, "
        "circuits, responses, response_input_items, state_version"))
    barrier = threading.Barrier(4)

    def start() -> list[int]:
        db = PostgresDatabase(pg.url)
        barrier.wait()
        try:
            return migrations.migrate(db)
        finally:
            db.close()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        applied = list(pool.map(lambda _: start(), range(4)))
    assert sorted(applied) == [[], [], [], [m[0] for m in migrations.MIGRATIONS]]
    rows = PostgresDatabase(pg.url).read(lambda tx: tx.rows(
        "SELECT version FROM schema_migrations"))
    assert [r[0] for r in rows] == [m[0] for m in migrations.MIGRATIONS]


def test_a_sqlite_file_from_before_migrations_is_adopted(tmp_path):
    import sqlite3

    old = sqlite3.connect(tmp_path / "steering.sqlite3")
    old.executescript("CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                      "INSERT INTO settings VALUES ('enabled', 'false');")
    old.close()
    db = open_database("", tmp_path)
    assert SteeringStore(db).snapshot().settings == {"enabled": False}
    assert migrations.migrate(db) == []
    db.close()
    assert isinstance(db, SqliteDatabase)


def test_a_stopped_server_fails_calls_cleanly_and_they_work_once_it_is_back(pg):
    db = PostgresDatabase(pg.url)
    migrations.migrate(db)
    store = SteeringStore(db)
    store.snapshot()
    events: list[str] = []
    listener = Listener(pg.url, on_up=lambda: events.append("up"),
                        on_change=lambda: None, on_down=lambda exc: events.append("down"),
                        tick_s=0.2, retry_s=0.2)
    listener.start()
    try:
        deadline = time.monotonic() + 5
        while "up" not in events and time.monotonic() < deadline:
            time.sleep(0.05)
        pg.stop()
        with pytest.raises(EngineError) as caught:
            asyncio.run(store.put_settings(enabled=False))
        assert caught.value.code == "state_store_unavailable"
        with pytest.raises(EngineError):
            store.current_version()
        assert "down" in events
        pg.start()
        deadline = time.monotonic() + 10
        while events[-1] != "up" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert events[-1] == "up"
        asyncio.run(store.put_settings(enabled=False))
        assert SteeringStore(db).snapshot().version == store.version == 1
        assert SteeringStore(db).settings()["enabled"] is False
    finally:
        listener.stop()
        db.close()


def test_the_replica_registry_counts_the_replicas_that_answer(database):
    """steering/acks.py on the database alone: rows, heartbeat age, the wait."""
    from service.steering import acks
    from service.steering.manager import Live

    database.transaction(lambda tx: tx.execute("DELETE FROM replicas"))
    a, b = acks.Registry(database), acks.Registry(database)
    assert a.id != b.id
    if not database.shared:  # a lone engine: nothing is written, 1 of 1
        asyncio.run(a.report(3))
        assert database.read(lambda tx: tx.rows("SELECT * FROM replicas")) == []
        assert asyncio.run(a.wait(3)) == acks.LONE
        return
    asyncio.run(a.report(3))
    asyncio.run(b.report(2))
    seen = asyncio.run(a.wait(3, 0))
    assert (seen.replicas, seen.applied, seen.error) == (2, 1, "")

    async def b_catches_up_later() -> acks.Acks:
        waiting = asyncio.create_task(a.wait(3))
        await asyncio.sleep(0.1)
        await b.report(3)
        return await waiting

    seen = asyncio.run(b_catches_up_later())
    # The wait saw b's later report (looking once above found 1 of 2).
    assert (seen.replicas, seen.applied) == (2, 2)
    # Not behind and missing the wait: 1 of 2, after ACK_WAIT_S.
    seen = asyncio.run(a.wait(4))
    assert (seen.replicas, seen.applied) == (2, 1) and seen.waited_s >= acks.ACK_WAIT_S  # all of it
    live = acks.across(Live(True), seen)
    assert (live.live, live.replicas, live.replicas_applied) == (False, 2, 1)
    assert live.reason.startswith("applied on 1 of 2 replicas within 1 s;")
    assert acks.across(Live(True), asyncio.run(a.wait(4, 0))).reason.startswith(
        "applied on 1 of 2 replicas now;")
    assert acks.across(Live(False, "steering is disabled"), seen) == Live(
        False, "steering is disabled", 2, 1)
    # A row whose heartbeat is older than ANSWERING_S did not answer.
    database.transaction(lambda tx: tx.execute(
        f"UPDATE replicas SET seen_at = seen_at - {acks.ANSWERING_S + 1} WHERE replica_id = ?",
        (b.id,)))
    seen = asyncio.run(a.wait(4))
    # Nothing to wait for: it answers without running out the wait.
    assert (seen.replicas, seen.applied) == (1, 1) and seen.waited_s < acks.ACK_WAIT_S
    asyncio.run(b.report(4))  # a heartbeat brings it back
    assert (asyncio.run(a.wait(4, 0)).replicas) == 2
    asyncio.run(b.leave())  # a clean stop deletes the row, and no heartbeat writes it again
    asyncio.run(b.report(5))
    assert database.read(lambda tx: tx.rows("SELECT replica_id FROM replicas")) == [(a.id,)]
