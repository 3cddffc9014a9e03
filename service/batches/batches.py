"""Batches (OpenAI's Batch API) in the engine's state database, and the claim
protocol the REST bridge runs their lines by (rest_bridge/batch_runner.py).

Why the work is claimed through the database and not queued in a process: a
batch must survive the engine or the bridge being killed and run on whichever
replica serves its model. Each line is a row: pending until a result is
recorded, then done, and a line is done once (the first recorded answer
stays; a later one for the same line is ignored), so a result is never
written twice. A runner claims pending lines for a lease; a line whose runner
vanished is claimable again when its lease ends, and is run again, which is
harmless for a line never recorded. The last line recorded writes the output
and error files in the same transaction, so a batch is finalized once.

A batch's life: in_progress (its file was read when it was created, so it
never waits in validating), then completed (output written), or expired (its
completion window ended: lines not answered go to the error file with code
batch_expired), or cancelling then cancelled (lines not claimed never run;
claimed ones are recorded, then the files are written).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass

from service.batches import files
from service.batches.lines import ENDPOINTS, Line, Problem, for_batch
from service.errors import EngineError, invalid_parameter
from service.state.database import Database, Tx

ENDED = ("completed", "failed", "expired", "cancelled")
MAX_METADATA = 16
MAX_LIST = 100
MAX_CLAIM = 256
_WINDOW = re.compile(r"^([1-9][0-9]{0,5})(h|m)$")
_MAX_WINDOW_S = 7 * 86_400


@dataclass
class Batch:
    id: str
    owner: str
    status: str
    doc: dict  # the batch object's other fields (BatchObject's names)


def not_found(batch_id: str) -> EngineError:
    shown = batch_id if len(batch_id) <= 80 else batch_id[:80] + "…"
    return EngineError("batch_not_found", f"No such Batch object: {shown}", "batch_id")


def window_seconds(window: str) -> int:
    match = _WINDOW.match(window)
    seconds = (int(match.group(1)) * (3600 if match.group(2) == "h" else 60)) if match else 0
    if not 60 <= seconds <= _MAX_WINDOW_S:
        raise invalid_parameter("completion_window", "'completion_window' must be a number of "
                                "hours or minutes, such as 24h, from 1m to 168h.")
    return seconds


def _problem_line(problem: Problem) -> str:
    return json.dumps({"id": files.new_id("batch_req_"), "custom_id": problem.custom_id or None,
                       "response": None,
                       "error": {"code": problem.code, "message": problem.message}})


def answer_line(custom_id: str, status_code: int, body: str, request_id: str) -> str:
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = body
    return json.dumps({"id": files.new_id("batch_req_"), "custom_id": custom_id,
                       "response": {"status_code": status_code, "request_id": request_id,
                                    "body": parsed}, "error": None})


class BatchStore:
    def __init__(self, db: Database, file_store: files.FileStore, clock=time.time):
        self.db, self.files, self._clock = db, file_store, clock

    # -- the caller's side -------------------------------------------------------------------

    def create(self, owner: str, input_file_id: str, endpoint: str, window: str,
               metadata: dict[str, str]) -> Batch:
        if endpoint not in ENDPOINTS:
            raise invalid_parameter("endpoint", f"'endpoint' must be one of "
                                    f"{', '.join(ENDPOINTS)}.")
        seconds = window_seconds(window)
        if len(metadata) > MAX_METADATA or any(
                len(k) > 64 or len(v) > 512 or "\x00" in k + v for k, v in metadata.items()):
            raise invalid_parameter("metadata", f"'metadata' takes at most {MAX_METADATA} "
                                    "pairs, keys up to 64 characters and values up to 512.")
        stored = self.files.get(input_file_id, owner, "input_file_id")
        if stored.purpose != "batch":
            raise invalid_parameter("input_file_id", f"The input file has purpose "
                                    f"'{stored.purpose}'; a batch reads one of purpose 'batch'.")
        lines, problems = for_batch(self.files.content(input_file_id, owner), "input_file_id")
        now = int(self._clock())
        batch = Batch(files.new_id("batch_"), owner, "in_progress", {
            "endpoint": endpoint, "input_file_id": input_file_id, "completion_window": window,
            "metadata": dict(metadata), "created_at": now, "in_progress_at": now,
            "expires_at": now + seconds, "total": len(lines) + len(problems), "completed": 0,
            "failed": len(problems)})

        def work(tx: Tx) -> Batch:
            self._save(tx, batch, insert=True)
            tx.executemany(
                "INSERT INTO batch_lines (batch_id, line, custom_id, url, body, state, claimed_by, "
                "claimed_until, status_code, output) VALUES (?, ?, ?, ?, ?, ?, '', 0, ?, ?)",
                [(batch.id, ln.index, ln.custom_id, ln.url, ln.body, "pending", 0, "")
                 for ln in lines]
                + [(batch.id, p.index, p.custom_id, "", "", "done", 0, _problem_line(p))
                   for p in problems])
            if not lines:
                self._finalize(tx, batch, "completed")
            return batch

        return self.db.transaction(work)

    def get(self, batch_id: str, owner: str | None) -> Batch:
        if files.well_formed(batch_id, "batch_"):
            row = self.db.read(lambda tx: tx.one(
                "SELECT id, owner, status, document FROM batches WHERE id = ?", (batch_id,)))
            if row is not None and (owner is None or row[1] == owner):
                return Batch(row[0], row[1], row[2], json.loads(row[3]))
        raise not_found(batch_id)

    def list(self, owner: str | None, limit: int, after: str) -> tuple[list[Batch], bool]:
        limit = limit or 20
        if not 1 <= limit <= MAX_LIST:
            raise invalid_parameter("limit", f"'limit' must be from 1 to {MAX_LIST}.")
        rows = self.db.read(lambda tx: tx.rows(
            "SELECT id, owner, status, document FROM batches ORDER BY created_at DESC, id DESC"))
        found = [Batch(r[0], r[1], r[2], json.loads(r[3])) for r in rows
                 if owner is None or r[1] == owner]
        if after:
            ids = [b.id for b in found]
            if after not in ids:
                raise not_found(after)
            found = found[ids.index(after) + 1:]
        return found[:limit], len(found) > limit

    def cancel(self, batch_id: str, owner: str | None) -> Batch:
        self.get(batch_id, owner)

        def work(tx: Tx) -> Batch:
            batch = self._load(tx, batch_id)
            if batch.status in ENDED:
                raise EngineError("batch_not_cancellable", f"Batch {batch_id} has already "
                                  f"ended ({batch.status}); only a running batch can be "
                                  "cancelled.", "batch_id")
            if batch.status != "cancelling":
                batch.status = "cancelling"
                batch.doc["cancelling_at"] = int(self._clock())
                self._save(tx, batch)
            self._settle(tx, batch)
            return batch

        return self.db.transaction(work)

    # -- the runner's side -------------------------------------------------------------------

    def claim(self, runner_id: str, max_lines: int, lease_s: float) -> tuple[Batch | None,
                                                                           list[Line]]:
        if not runner_id or len(runner_id) > 200:
            raise invalid_parameter("runner_id", "'runner_id' must be 1 to 200 characters.")
        if not 1 <= max_lines <= MAX_CLAIM or not 1 <= lease_s <= 3600:
            raise invalid_parameter("max_lines", f"'max_lines' must be 1 to {MAX_CLAIM} and "
                                    "'lease_s' 1 to 3600.")

        def work(tx: Tx):
            now = self._clock()
            for (batch_id,) in tx.rows("SELECT id FROM batches WHERE status IN "
                                       "('in_progress', 'cancelling') ORDER BY created_at, id"):
                batch = self._load(tx, batch_id)
                if self._settle(tx, batch) or batch.status != "in_progress":
                    continue
                rows = tx.rows(
                    "UPDATE batch_lines SET claimed_by = ?, claimed_until = ? WHERE batch_id = ? "
                    "AND state = 'pending' AND claimed_until < ? AND line IN (SELECT line FROM "
                    "batch_lines WHERE batch_id = ? AND state = 'pending' AND claimed_until < ? "
                    "ORDER BY line LIMIT ?) RETURNING line, custom_id, url, body",
                    (runner_id, now + lease_s, batch_id, now, batch_id, now, max_lines))
                if rows:
                    lines = sorted((Line(int(r[0]), r[1], r[2], r[3]) for r in rows),
                                   key=lambda ln: ln.index)
                    return batch, lines
            return None, []

        return self.db.transaction(work)

    def renew(self, runner_id: str, batch_id: str, lease_s: float) -> int:
        """Extend `runner_id`'s live claims in the batch to now + lease_s."""
        if not 1 <= lease_s <= 3600:
            raise invalid_parameter("lease_s", "'lease_s' must be 1 to 3600.")
        if not files.well_formed(batch_id, "batch_"):
            raise not_found(batch_id)

        def work(tx: Tx) -> int:
            now = self._clock()
            return len(tx.rows(
                "UPDATE batch_lines SET claimed_until = ? WHERE batch_id = ? AND claimed_by = ? "
                "AND state = 'pending' AND claimed_until >= ? RETURNING line",
                (now + lease_s, batch_id, runner_id, now)))

        return self.db.transaction(work)

    def complete(self, batch_id: str, results: list[tuple[int, int, str, str]]) -> int:
        """Record (line, status code, body, request id) answers; returns how
        many lines were newly answered."""

        def work(tx: Tx) -> int:
            batch = self._load(tx, batch_id)
            recorded = 0
            for line, status, body, request_id in results:
                found = tx.one("SELECT custom_id FROM batch_lines WHERE batch_id = ? AND line = ? "
                               "AND state = 'pending'", (batch_id, line))
                if found is None:
                    continue  # answered before (or no such line): the first answer stays
                tx.execute("UPDATE batch_lines SET state = 'done', status_code = ?, output = ? "
                           "WHERE batch_id = ? AND line = ?",
                           (status, answer_line(found[0], status, body, request_id),
                            batch_id, line))
                recorded += 1
                batch.doc["completed" if 200 <= status < 300 else "failed"] += 1
            if recorded:
                self._save(tx, batch)
            self._settle(tx, batch)
            return recorded

        if not files.well_formed(batch_id, "batch_"):
            raise not_found(batch_id)
        return self.db.transaction(work)

    # -- inside a transaction ----------------------------------------------------------------

    def _load(self, tx: Tx, batch_id: str) -> Batch:
        row = tx.one("SELECT id, owner, status, document FROM batches WHERE id = ?", (batch_id,))
        if row is None:
            raise not_found(batch_id)
        return Batch(row[0], row[1], row[2], json.loads(row[3]))

    def _save(self, tx: Tx, batch: Batch, insert: bool = False) -> None:
        document = json.dumps(batch.doc)
        if insert:
            tx.execute("INSERT INTO batches (id, owner, created_at, status, document) VALUES "
                       "(?, ?, ?, ?, ?)", (batch.id, batch.owner, batch.doc["created_at"],
                                          batch.status, document))
        else:
            tx.execute("UPDATE batches SET status = ?, document = ? WHERE id = ?",
                       (batch.status, document, batch.id))

    def _settle(self, tx: Tx, batch: Batch) -> bool:
        """Finalize `batch` if it is due: every line answered, its window
        over, or cancelled with no live claim. True when it ended here."""
        if batch.status in ENDED:
            return False
        now = self._clock()
        pending = tx.one("SELECT COUNT(*) FROM batch_lines WHERE batch_id = ? AND "
                         "state = 'pending'", (batch.id,))[0]
        if not pending:
            self._finalize(tx, batch, "cancelled" if batch.status == "cancelling"
                           else "completed")
            return True
        if now >= batch.doc["expires_at"]:
            self._finalize(tx, batch, "expired")
            return True
        if batch.status == "cancelling":
            live = tx.one("SELECT COUNT(*) FROM batch_lines WHERE batch_id = ? AND state = "
                          "'pending' AND claimed_until >= ?", (batch.id, now))[0]
            if not live:
                self._finalize(tx, batch, "cancelled")
                return True
        return False

    def _finalize(self, tx: Tx, batch: Batch, status: str) -> None:
        now = int(self._clock())
        rows = tx.rows("SELECT line, custom_id, state, status_code, output FROM batch_lines "
                       "WHERE batch_id = ? ORDER BY line", (batch.id,))
        outputs, errors = [], []
        for _, custom_id, state, code, output in rows:
            if state == "done":
                (outputs if 200 <= code < 300 else errors).append(output)
            elif status == "expired":
                errors.append(_problem_line(Problem(0, custom_id, "batch_expired",
                                                    "The batch's completion window ended "
                                                    "before this request ran.")))
                batch.doc["failed"] += 1
        batch.doc["finalizing_at"] = now
        for kind, items in (("output_file_id", outputs), ("error_file_id", errors)):
            if items:
                purpose = "batch_output" if kind == "output_file_id" else "batch_error"
                stored = files.insert(tx, batch.owner, purpose, f"{batch.id}_{purpose}.jsonl",
                                      "\n".join(items) + "\n")
                batch.doc[kind] = stored.id
        batch.status = status
        batch.doc[f"{status}_at"] = now
        tx.execute("UPDATE batch_lines SET body = '' WHERE batch_id = ?", (batch.id,))
        self._save(tx, batch)


def new_runner_id() -> str:
    return secrets.token_hex(8)
