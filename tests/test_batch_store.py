"""The batch store's guarantees (service/batches), in process on SQLite: a
line is answered once whatever runner answers it, a vanished runner's lines
are claimed again when its lease ends, bad lines go to the error file while
the rest run, the last answer writes the output once, the completion window
ends a batch, cancel stops lines not yet claimed, and owners see only their
own. On SQLite and on PostgreSQL (where two runners claim at once)."""

from __future__ import annotations

import concurrent.futures
import json

import pytest

from service.batches.batches import BatchStore
from service.batches.files import FileStore
from service.errors import EngineError
from service.state.database import SqliteDatabase
from service.state.migrations import migrate


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


def line(i: int, url="/v1/chat/completions", **extra) -> str:
    return json.dumps({"custom_id": f"r{i}", "method": "POST", "url": url,
                       "body": {"model": "m", "messages": [], **extra}})


TABLES = ("schema_migrations", "settings", "attached_saes", "profiles", "clusters", "circuits",
          "probes", "replicas", "responses", "response_input_items", "state_version",
          "feature_explanations", "files", "batches", "batch_lines")


@pytest.fixture(params=["sqlite", "postgresql"])
def stores(request, tmp_path):
    if request.param == "sqlite":
        db = SqliteDatabase(tmp_path / "state.sqlite3")
    else:
        from service.state.postgres import PostgresDatabase

        db = PostgresDatabase(request.getfixturevalue("pg").url)
        db.transaction(lambda tx: tx.execute(f"DROP TABLE IF EXISTS {', '.join(TABLES)}"))
    migrate(db)
    clock = Clock()
    files = FileStore(db)
    yield files, BatchStore(db, files, clock), clock
    db.close()


def upload(files, text: str, owner="alice"):
    return files.create(owner, "batch", "in.jsonl", text.encode())


def output(files, file_id: str) -> list[dict]:
    return [json.loads(x) for x in files.content(file_id, None).splitlines()]


def test_lines_run_once_and_the_last_answer_writes_the_files(stores):
    files, batches, clock = stores
    text = "\n".join([line(0), "not json", line(1), line(2, url="/v1/audio"), ""]) + "\n"
    batch = batches.create("alice", upload(files, text).id, "/v1/chat/completions", "24h", {})
    assert (batch.status, batch.doc["total"], batch.doc["failed"]) == ("in_progress", 4, 2)
    got, lines = batches.claim("a", 10, 30)
    assert got.id == batch.id and [ln.custom_id for ln in lines] == ["r0", "r1"]
    assert batches.claim("b", 10, 30) == (None, [])  # both claimed, by a live claim
    assert batches.complete(batch.id, [(0, 200, '{"ok": 0}', "q0")]) == 1
    clock.now += 20
    assert batches.renew("a", batch.id, 30) == 1  # r1, still running
    assert batches.renew("b", batch.id, 30) == 0  # b holds nothing
    clock.now += 20
    assert batches.claim("b", 10, 30) == (None, [])  # renewed: still a's
    clock.now += 11  # runner a vanished: r1's lease ended
    _, again = batches.claim("b", 10, 30)
    assert [ln.custom_id for ln in again] == ["r1"]
    assert batches.complete(batch.id, [(0, 200, '{"ok": "twice"}', "q")]) == 0  # r0 stays
    assert batches.complete(batch.id, [(again[0].index, 400, '{"error": {}}', "q1")]) == 1
    done = batches.get(batch.id, "alice")
    assert done.status == "completed"
    assert (done.doc["completed"], done.doc["failed"]) == (1, 3)
    out = output(files, done.doc["output_file_id"])
    assert [(o["custom_id"], o["response"]["body"]) for o in out] == [("r0", {"ok": 0})]
    errors = output(files, done.doc["error_file_id"])
    assert [e["custom_id"] for e in errors] == [None, "r1", "r2"]
    assert errors[0]["error"]["code"] == "invalid_json_line"
    assert errors[1]["response"]["status_code"] == 400
    assert errors[2]["error"]["code"] == "invalid_url"
    assert batches.complete(batch.id, [(again[0].index, 200, "{}", "q")]) == 0  # ended
    with pytest.raises(EngineError) as caught:
        batches.cancel(batch.id, "alice")
    assert caught.value.code == "batch_not_cancellable"


def test_the_completion_window_ends_a_batch(stores):
    files, batches, clock = stores
    batch = batches.create("alice", upload(files, line(0) + "\n" + line(1)).id,
                           "/v1/chat/completions", "1h", {})
    batches.claim("a", 1, 30)
    batches.complete(batch.id, [(0, 200, "{}", "q")])
    clock.now += 3601
    assert batches.claim("a", 10, 30) == (None, [])
    ended = batches.get(batch.id, None)
    assert ended.status == "expired" and ended.doc["failed"] == 1
    assert output(files, ended.doc["error_file_id"])[0]["error"]["code"] == "batch_expired"


def test_cancel_stops_lines_not_claimed(stores):
    files, batches, clock = stores
    batch = batches.create("alice", upload(files, "\n".join(line(i) for i in range(4))).id,
                           "/v1/chat/completions", "24h", {"run": "x"})
    batches.claim("a", 1, 30)
    cancelling = batches.cancel(batch.id, "alice")
    assert cancelling.status == "cancelling"  # one line is claimed and may still answer
    assert batches.claim("b", 10, 30) == (None, [])
    batches.complete(batch.id, [(0, 200, "{}", "q")])
    ended = batches.get(batch.id, "alice")
    assert ended.status == "cancelled" and ended.doc["completed"] == 1
    assert len(output(files, ended.doc["output_file_id"])) == 1
    assert ended.doc["metadata"] == {"run": "x"}


def test_owners_see_their_own_and_bad_input_is_refused_naming_the_field(stores):
    files, batches, _ = stores
    stored = upload(files, line(0))
    with pytest.raises(EngineError) as caught:
        files.get(stored.id, "bob")
    assert caught.value.code == "file_not_found"
    assert files.get(stored.id, None).id == stored.id  # admin
    for args, param in [((stored.id, "/v1/nothing", "24h", {}), "endpoint"),
                        ((stored.id, "/v1/chat/completions", "25", {}), "completion_window"),
                        (("file-nothing", "/v1/chat/completions", "24h", {}), "input_file_id")]:
        with pytest.raises(EngineError) as caught:
            batches.create("alice", *args)
        assert caught.value.param == param
    twice = upload(files, line(0) + "\n" + line(0))
    with pytest.raises(EngineError) as caught:
        batches.create("alice", twice.id, "/v1/chat/completions", "24h", {})
    assert caught.value.code == "duplicate_custom_id"
    with pytest.raises(EngineError) as caught:
        files.create("alice", "batch", "x.jsonl", b"\xff\xfe")
    assert caught.value.param == "file"
    with pytest.raises(EngineError) as caught:
        files.create("alice", "batch", "x.jsonl", b"x" * (9 * 1024 * 1024))
    assert caught.value.code == "file_too_large"
    batch = batches.create("alice", stored.id, "/v1/chat/completions", "24h", {})
    with pytest.raises(EngineError):
        batches.get(batch.id, "bob")
    assert [b.id for b in batches.list("alice", 0, "")[0]] == [batch.id]
    assert batches.list("bob", 0, "")[0] == []


def test_two_runners_claiming_at_once_get_different_lines(stores):
    files, batches, _ = stores
    batch = batches.create("alice", upload(files, "\n".join(line(i) for i in range(40))).id,
                           "/v1/chat/completions", "24h", {})
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        claims = list(pool.map(lambda r: batches.claim(r, 8, 30), ["a", "b", "c", "d"]))
    taken = [ln.index for got, lines in claims for ln in lines if got is not None]
    assert len(taken) == len(set(taken)) == 32
    assert all(got.id == batch.id for got, _ in claims)


def test_a_line_that_fails_inside_the_bridge_is_answered_500_and_the_runner_goes_on():
    """rest_bridge/batch_runner.py: Starlette re-raises an unhandled error after
    its 500; the runner must turn it into the line's answer, not die."""
    import asyncio

    from rest_bridge.batch_runner import post_in_process

    async def broken(scope, receive, send):
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b"Internal Server Error"})
        raise RuntimeError("a handler bug")

    status, body, _ = asyncio.run(post_in_process(broken, "/v1/chat/completions", b"{}", None))
    assert (status, body) == (500, b"Internal Server Error")
