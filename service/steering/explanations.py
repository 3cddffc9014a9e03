"""Feature explanations: what a feature means, in words a person or a tool
wrote (issue 43).

An SAE's record says where a feature fires; an explanation says what that
is ("mentions of the sea"). Users set one per feature, or import many at
once from Neuronpedia's explanation export, whose records carry the
feature's `index` and a `description`. They live in the state database
(migration 4), so replicas sharing PostgreSQL read the same ones; they
steer nothing, so they are read and written directly rather than through
the versioned steering snapshot. Text search (steering/search.py) matches
them too.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from service.errors import invalid_parameter
from service.state.database import Database, upsert
from service.steering.sae import SaeInfo, check_feature_index

MAX_TEXT = 1000
MAX_SOURCE = 128
MAX_IMPORT_BYTES = 1 << 20
MAX_IMPORT_RECORDS = 65536
USER = "user"
NEURONPEDIA = "neuronpedia"
_UPSERT = upsert("feature_explanations", ("sae_id", "feature", "text", "source", "updated"),
                 ("sae_id", "feature"))


@dataclass(frozen=True)
class Explanation:
    text: str
    source: str
    updated: int


def check_text(text: str, param: str = "text") -> str:
    text = text.strip()
    if len(text) > MAX_TEXT:
        raise invalid_parameter(param, f"An explanation is at most {MAX_TEXT} characters.")
    return text


def parse_import(document_json: str, info: SaeInfo) -> list[tuple[int, str, str]]:
    """(feature, text, source) for each record of a Neuronpedia export."""
    if len(document_json.encode()) > MAX_IMPORT_BYTES:
        raise invalid_parameter("document", f"The import is at most {MAX_IMPORT_BYTES} bytes.")
    try:
        records = json.loads(document_json)
    except RecursionError:
        raise invalid_parameter("document", "The import is nested too deeply.") from None
    except ValueError as exc:
        raise invalid_parameter("document", f"The import is not JSON: {exc}.") from None
    if isinstance(records, dict) and isinstance(records.get("explanations"), list):
        records = records["explanations"]
    if not isinstance(records, list) or not records:
        raise invalid_parameter("document", "The import must be a non-empty JSON array of "
                                "explanation records ({\"index\", \"description\"}).")
    if len(records) > MAX_IMPORT_RECORDS:
        raise invalid_parameter("document", f"The import holds at most {MAX_IMPORT_RECORDS} "
                                "records.")
    out = []
    for i, record in enumerate(records):
        where = f"document[{i}]"
        if not isinstance(record, dict):
            raise invalid_parameter(where, f"'{where}' must be an object.")
        index = record.get("index")
        # Neuronpedia writes the index as a string.
        if isinstance(index, str) and index.isdigit():
            index = int(index)
        if not isinstance(index, int) or isinstance(index, bool):
            raise invalid_parameter(f"{where}.index", f"'{where}.index' must be a feature "
                                    "index.")
        check_feature_index(info, index, f"{where}.index")
        text = record.get("description")
        if not isinstance(text, str) or not text.strip():
            raise invalid_parameter(f"{where}.description", f"'{where}.description' must be "
                                    "a non-empty string.")
        source = record.get("explanationModelName") or NEURONPEDIA
        if not isinstance(source, str):
            source = NEURONPEDIA
        out.append((index, check_text(text, f"{where}.description"), source[:MAX_SOURCE]))
    return out


class Explanations:
    """The feature_explanations table."""

    def __init__(self, database: Database):
        self._db = database

    def _read(self, sql: str, args: tuple) -> list[tuple]:
        return self._db.read(lambda tx: tx.rows(sql, args))

    async def get(self, sae_id: str, feature: int) -> Explanation | None:
        rows = await asyncio.to_thread(
            self._read, "SELECT text, source, updated FROM feature_explanations "
            "WHERE sae_id = ? AND feature = ?", (sae_id, feature))
        return Explanation(rows[0][0], rows[0][1], int(rows[0][2])) if rows else None

    async def of_sae(self, sae_id: str) -> dict[int, str]:
        rows = await asyncio.to_thread(
            self._read, "SELECT feature, text FROM feature_explanations WHERE sae_id = ?",
            (sae_id,))
        return {int(feature): text for feature, text in rows}

    async def set(self, info: SaeInfo, feature: int, text: str) -> Explanation | None:
        """Store `text` as the feature's explanation; empty removes it."""
        check_feature_index(info, feature, "index")
        text = check_text(text)
        if not text:
            await asyncio.to_thread(self._db.transaction, lambda tx: tx.execute(
                "DELETE FROM feature_explanations WHERE sae_id = ? AND feature = ?",
                (info.id, feature)))
            return None
        now = int(time.time())
        await asyncio.to_thread(self._db.transaction, lambda tx: tx.execute(
            _UPSERT, (info.id, feature, text, USER, now)))
        return Explanation(text, USER, now)

    async def import_records(self, info: SaeInfo, records: list[tuple[int, str, str]]) -> int:
        """Store every record in one transaction; returns how many features
        now have one of them."""
        now = int(time.time())
        latest = {feature: (text, source) for feature, text, source in records}
        rows = [(info.id, f, text, source, now) for f, (text, source) in latest.items()]
        await asyncio.to_thread(self._db.transaction,
                                lambda tx: tx.executemany(_UPSERT, rows))
        return len(rows)
