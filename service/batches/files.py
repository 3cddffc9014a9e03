"""Stored files (OpenAI's Files API) in the engine's state database.

Why there: a batch's input and output must outlive the process and be
readable from every replica, as stored responses are (responses/store.py);
the same SQLite file or PostgreSQL database holds them. Content is kept as
text: a batch file is UTF-8 JSONL by definition, and other purposes are
accepted only as UTF-8 text too (nothing here serves images or audio).
Ownership as stored responses: the key name that uploaded it; None reads
all (an admin key, or an engine without keys).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from common.grpc_limits import MAX_FILE_BYTES
from service.errors import EngineError, invalid_parameter
from service.state.database import Database, Tx

PURPOSES = ("batch", "batch_output", "batch_error", "assistants", "fine-tune", "vision",
            "user_data", "evals")
UPLOADABLE = tuple(p for p in PURPOSES if p not in ("batch_output", "batch_error"))
MAX_FILENAME = 255
MAX_LIST = 10_000
_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


@dataclass(frozen=True)
class StoredFile:
    id: str
    owner: str
    purpose: str
    filename: str
    bytes: int
    created_at: int


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def well_formed(item_id: str, prefix: str) -> bool:
    """An id a save could have made: checked before any query, so the
    database never compares with one holding NUL or 10,000 characters."""
    return (item_id.startswith(prefix) and len(item_id) <= 200
            and set(item_id) <= _ID_CHARS)


def not_found(file_id: str, param: str = "file_id") -> EngineError:
    shown = file_id if len(file_id) <= 80 else file_id[:80] + "…"
    return EngineError("file_not_found", f"No such File object: {shown}", param)


def decode(content: bytes, param: str = "file") -> str:
    if len(content) > MAX_FILE_BYTES:
        raise EngineError("file_too_large", f"A file may hold at most {MAX_FILE_BYTES} bytes; "
                          f"this one has {len(content)}.", param)
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid_parameter(param, "The file must be UTF-8 text (a batch file is JSONL).") \
            from None
    if "\x00" in text:
        raise invalid_parameter(param, "The file holds a NUL character, which stored text "
                                "cannot hold.")
    return text


def insert(tx: Tx, owner: str, purpose: str, filename: str, text: str) -> StoredFile:
    """Store `text` as a file within the caller's transaction."""
    stored = StoredFile(new_id("file-"), owner, purpose, filename, len(text.encode()),
                        int(time.time()))
    tx.execute("INSERT INTO files (id, owner, purpose, filename, bytes, created_at, content) "
               "VALUES (?, ?, ?, ?, ?, ?, ?)", (stored.id, owner, purpose, filename,
                                                stored.bytes, stored.created_at, text))
    return stored


def _row(row) -> StoredFile:
    return StoredFile(row[0], row[1], row[2], row[3], int(row[4]), int(row[5]))


_COLUMNS = "id, owner, purpose, filename, bytes, created_at"


class FileStore:
    def __init__(self, db: Database):
        self.db = db

    def create(self, owner: str, purpose: str, filename: str, content: bytes) -> StoredFile:
        if purpose not in UPLOADABLE:
            raise invalid_parameter("purpose", f"'purpose' must be one of "
                                    f"{', '.join(UPLOADABLE)}; got '{purpose[:64]}'.")
        if not filename or len(filename) > MAX_FILENAME or "\x00" in filename:
            raise invalid_parameter("file", f"The file needs a name of 1 to {MAX_FILENAME} "
                                    "characters.")
        text = decode(content)
        if purpose == "batch":
            from service.batches.lines import parse

            parse(text)  # a file no batch could read is refused now, naming the line
        return self.db.transaction(lambda tx: insert(tx, owner, purpose, filename, text))

    def get(self, file_id: str, owner: str | None, param: str = "file_id") -> StoredFile:
        if well_formed(file_id, "file-"):
            row = self.db.read(lambda tx: tx.one(
                f"SELECT {_COLUMNS} FROM files WHERE id = ?", (file_id,)))
            if row is not None and (owner is None or row[1] == owner):
                return _row(row)
        raise not_found(file_id, param)

    def content(self, file_id: str, owner: str | None, param: str = "file_id") -> str:
        self.get(file_id, owner, param)
        return self.db.read(lambda tx: tx.one("SELECT content FROM files WHERE id = ?",
                                              (file_id,)))[0]

    def list(self, owner: str | None, purpose: str, limit: int, after: str
             ) -> tuple[list[StoredFile], bool]:
        limit = limit or MAX_LIST
        if not 1 <= limit <= MAX_LIST:
            raise invalid_parameter("limit", f"'limit' must be from 1 to {MAX_LIST}.")
        rows = self.db.read(lambda tx: tx.rows(
            f"SELECT {_COLUMNS} FROM files ORDER BY created_at DESC, id DESC"))
        found = [_row(r) for r in rows if (owner is None or r[1] == owner)
                 and (not purpose or r[2] == purpose)]
        if after:
            ids = [f.id for f in found]
            if after not in ids:
                raise not_found(after, "after")
            found = found[ids.index(after) + 1:]
        return found[:limit], len(found) > limit

    def delete(self, file_id: str, owner: str | None) -> None:
        self.get(file_id, owner)
        self.db.transaction(lambda tx: tx.execute("DELETE FROM files WHERE id = ?", (file_id,)))
