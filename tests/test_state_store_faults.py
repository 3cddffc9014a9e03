"""A durable write that fails (disk full) is rolled back whole, answered 503
state_store_unavailable, changes nothing in memory, and the next write works
once space is back, with no restart.

Two ways to fill the disk: SQLite's own page limit on the store's connection
(always available; SQLite answers SQLITE_FULL exactly as for a full disk), and
a real full filesystem (a small tmpfs holding the engine's data dir) where the
machine lets a test mount one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess

import pytest

from service.errors import EngineError
from service.steering.intensity import IntensityLimits
from service.steering.manager import SteeringManager
from service.steering.store import SteeringStore
from tests.harness import OwnStack
from tests.http_helpers import call


def test_a_full_database_fails_the_write_cleanly_and_the_next_one_works(tmp_path):
    store = SteeringStore(tmp_path / "steering.sqlite3")
    manager = SteeringManager(store, tmp_path, IntensityLimits())
    pages = store.db._conn.execute("PRAGMA page_count").fetchone()[0]
    store.db._conn.execute(f"PRAGMA max_page_count = {pages}")
    big = "x" * 20_000  # needs pages the database may not grow by

    async def scenario():
        with pytest.raises(EngineError) as caught:
            await manager.create_profile("full", big, ())
        assert caught.value.code == "state_store_unavailable"
        assert "full" not in manager.profiles  # memory unchanged
        assert not store.db._conn.in_transaction  # rolled back, not left open
        store.db._conn.execute(f"PRAGMA max_page_count = {pages + 1000}")
        profile, _ = await manager.create_profile("full", big, ())
        assert profile.description == big

    asyncio.run(scenario())
    store.close()
    reopened = SteeringStore(tmp_path / "steering.sqlite3")
    assert [p["name"] for p in reopened.profiles()] == ["full"]
    reopened.close()


@contextlib.contextmanager
def _small_tmpfs(path, size: str):
    path.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                            capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"this machine does not let a test mount a tmpfs: {result.stderr!r}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(path) -> None:
    with open(path / "filler", "wb") as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()
                os.fsync(f.fileno())


def test_a_full_disk_under_the_engine_answers_503_and_recovers_without_restart(tmp_path):
    with _small_tmpfs(tmp_path / "data", "4m") as data:
        stack = OwnStack(data)
        try:
            port, url = stack.http_port, "/api/profiles"
            ok = call(port, "POST", url, {"name": "before", "entries": []})
            assert ok.status_code == 200, ok.text
            _fill(data)
            full = call(port, "POST", url, {"name": "during", "description": "y" * 50_000,
                                            "entries": []})
            assert full.status_code == 503, full.text
            assert full.json()["error"]["code"] == "state_store_unavailable"
            names = [p["name"] for p in call(port, "GET", url).json()["profiles"]]
            assert "during" not in names
            (data / "filler").unlink()
            after = call(port, "POST", url, {"name": "after", "entries": []})
            assert after.status_code == 200, after.text
            names = [p["name"] for p in call(port, "GET", url).json()["profiles"]]
            assert {"before", "after"} <= set(names)
            assert stack.engine.alive()
        finally:
            stack.stop()
