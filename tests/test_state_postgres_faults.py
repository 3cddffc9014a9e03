"""The state store's faults on a real PostgreSQL (tests/postgres.py), in
process: what PostgreSQL refuses is the caller's 400 naming the field (the
same answer as on SQLite), never 503 state_store_unavailable, which stays for
the database failing; and a write whose caller is cancelled (a client's
deadline) neither leaves the cluster's write lock held nor leaves this
replica's snapshot behind the database.

"Another replica" is a second PostgresDatabase on the same server, taking the
write lock as a replica's WriteGate does.
"""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from service.errors import EngineError
from service.responses.store import ResponseStore
from service.state import migrations
from service.state.opening import open_database
from service.state.postgres import WRITE_LOCK, PostgresDatabase
from service.steering.intensity import IntensityLimits
from service.steering.manager import SteeringManager
from service.steering.replication import Follower
from service.steering.store import SteeringStore

TABLES = ("schema_migrations", "settings", "attached_saes", "profiles", "clusters", "circuits",
          "probes", "replicas", "responses", "response_input_items", "state_version")
CLUSTER = {"format": "millm.cluster.v1", "name": "calm", "description": "a\x00b",
           "members": [{"layer": 1, "feature": 3, "strength": 1.0}]}
CIRCUIT = {**CLUSTER, "format": "millm.circuit.v1", "rung": 1}


def _fresh(url: str) -> PostgresDatabase:
    db = PostgresDatabase(url)
    db.transaction(lambda tx: tx.execute(f"DROP TABLE IF EXISTS {', '.join(TABLES)}"))
    migrations.migrate(db)
    return db


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path, pg):
    db = open_database("", tmp_path) if request.param == "sqlite" else _fresh(pg.url)
    yield db
    db.close()


def _manager(database, tmp_path) -> SteeringManager:
    manager = SteeringManager(SteeringStore(database), tmp_path, IntensityLimits())
    Follower(manager, database)  # its WriteGate, as the engine has it (not started)
    return manager


def _refusal(coro) -> tuple[str, str | None]:
    with pytest.raises(EngineError) as caught:
        asyncio.run(coro)
    return caught.value.code, caught.value.param


def test_a_nul_in_a_stored_description_is_400_naming_it_on_both_databases(database, tmp_path):
    manager = _manager(database, tmp_path)
    assert _refusal(manager.create_profile("p", "a\x00b", ())) == (
        "invalid_parameter", "description")
    asyncio.run(manager.create_profile("p", "fine", ()))
    assert _refusal(manager.update_profile("p", "\x00", None)) == (
        "invalid_parameter", "description")
    assert _refusal(manager.import_cluster(CLUSTER)) == ("invalid_document", "description")
    assert _refusal(manager.import_circuit(CIRCUIT)) == ("invalid_document", "description")
    stored = SteeringStore(database).snapshot()
    assert [(p["name"], p["description"]) for p in stored.profiles] == [("p", "fine")]
    assert stored.version == 1 and not stored.clusters and not stored.circuits


def test_a_value_postgresql_refuses_is_400_and_changes_nothing(pg):
    db = _fresh(pg.url)
    store = SteeringStore(db)
    store.snapshot()
    profile = {"name": "p", "description": "a\x00b", "kind": "features", "entries": [],
               "target": "", "created": 1, "updated": 1}
    with pytest.raises(EngineError) as caught:
        asyncio.run(store.put_profile(profile))
    assert caught.value.code == "invalid_parameter"  # was state_store_unavailable
    assert SteeringStore(db).snapshot().profiles == [] and store.current_version() == 0
    asyncio.run(store.put_profile({**profile, "description": "ab"}))  # the next write works
    assert store.current_version() == 1
    db.close()


def test_a_statement_postgresql_cannot_run_is_500_not_retry_later(pg):
    # (SQLite calls this an OperationalError, like a full disk: 503 there.)
    db = _fresh(pg.url)
    with pytest.raises(EngineError) as caught:
        db.transaction(lambda tx: tx.rows("SELECT no_such_column FROM profiles"))
    assert caught.value.code == "internal_error"
    assert db.read(lambda tx: tx.one("SELECT 1")) == (1,)  # and the connection still works
    db.close()


def test_a_response_id_holding_nul_is_found_nowhere(database):
    store = ResponseStore(database)
    store.save("resp_a", "", "{}", [("msg_1", "{}")])
    nul = "resp_a\x00"
    assert store.get(nul, None) is None and not store.exists(nul)
    assert store.items(nul) == [] and not store.delete(nul, None)
    assert store.get("resp_a", None) is not None


# -- a write whose caller is cancelled ------------------------------------------------------


def _other_replica_locks_within(url: str, seconds: float) -> float | None:
    """How long another replica waited for the cluster's write lock (None:
    not within `seconds`); it releases it at once."""
    with psycopg.connect(url, autocommit=True) as conn:
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            if conn.execute("SELECT pg_try_advisory_lock(%s)", (WRITE_LOCK,)).fetchone()[0]:
                conn.execute("SELECT pg_advisory_unlock(%s)", (WRITE_LOCK,))
                return time.monotonic() - start
            time.sleep(0.02)
    return None


async def _cancelled_after(coro, seconds: float) -> None:
    task = asyncio.ensure_future(coro)
    await asyncio.sleep(seconds)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def _settle(manager: SteeringManager, name: str) -> None:
    """Until the write that the cancelled caller left has landed."""
    for _ in range(100):
        stored = await asyncio.to_thread(manager.store.profiles)
        if name in {p["name"] for p in stored}:
            break
        await asyncio.sleep(0.05)
    async with manager.write_lock:  # it has let go of the gate too
        pass


def test_a_write_cancelled_while_waiting_for_the_lock_leaves_it_free(pg, tmp_path):
    db = _fresh(pg.url)
    manager = _manager(db, tmp_path)

    async def scenario():
        with psycopg.connect(pg.url, autocommit=True) as holder:
            # Another replica is writing: this one's write waits for the lock.
            holder.execute("SELECT pg_advisory_lock(%s)", (WRITE_LOCK,))
            await _cancelled_after(manager.create_profile("late", "", ()), 0.3)
            holder.execute("SELECT pg_advisory_unlock(%s)", (WRITE_LOCK,))
        waited = await asyncio.to_thread(_other_replica_locks_within, pg.url, 1.0)
        assert waited is not None, "the cancelled write left the cluster's write lock held"
        await _settle(manager, "late")

    asyncio.run(scenario())
    # The write went through whole: in the database and in this replica's snapshot.
    assert [p["name"] for p in SteeringStore(db).profiles()] == ["late"]
    assert list(manager.profiles) == ["late"]
    db.close()


def test_a_write_cancelled_mid_transaction_lands_whole_and_frees_the_lock(pg, tmp_path):
    db = _fresh(pg.url)
    manager = _manager(db, tmp_path)

    async def scenario():
        with psycopg.connect(pg.url) as blocker:
            # A row lock holds the write's transaction in its UPDATE.
            blocker.execute("SELECT version FROM state_version WHERE id = 1 FOR UPDATE")
            await _cancelled_after(manager.create_profile("mid", "", ()), 0.5)
            blocker.commit()
        waited = await asyncio.to_thread(_other_replica_locks_within, pg.url, 1.0)
        assert waited is not None, "the cancelled write left the cluster's write lock held"
        await _settle(manager, "mid")

    asyncio.run(scenario())
    assert [p["name"] for p in SteeringStore(db).profiles()] == ["mid"]
    # Was: committed in the database, missing here, and the version matched,
    # so this replica would never reload it.
    assert list(manager.profiles) == ["mid"]
    db.close()


def test_the_gate_itself_releases_the_lock_when_its_holder_is_cancelled(pg, tmp_path):
    db = _fresh(pg.url)
    manager = _manager(db, tmp_path)

    async def hold():
        async with manager.write_lock:
            await asyncio.sleep(30)

    async def scenario():
        with psycopg.connect(pg.url, autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s)", (WRITE_LOCK,))
            await _cancelled_after(hold(), 0.3)  # cancelled waiting for the lock
            holder.execute("SELECT pg_advisory_unlock(%s)", (WRITE_LOCK,))
        assert await asyncio.to_thread(_other_replica_locks_within, pg.url, 1.0) is not None
        await asyncio.wait_for(_cancelled_after(hold(), 0.3), 5)  # cancelled holding it
        assert await asyncio.to_thread(_other_replica_locks_within, pg.url, 1.0) is not None
        await asyncio.wait_for(manager.create_profile("after", "", ()), 5)

    asyncio.run(scenario())
    db.close()
