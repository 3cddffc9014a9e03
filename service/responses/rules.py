"""What a stored response must satisfy, and how its input items are paged.

Pure functions over plain values, so the servicer only translates: the id
format, OpenAI's metadata limits (16 pairs, keys of 64 and values of 512
characters), item ids (present and unique, since pages are addressed by
them), and the list parameters (limit 1-100, default 20; newest first by
default; `after`/`before` name items of the list).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.errors import EngineError, invalid_parameter

RESPONSE_ID = re.compile(r"resp_[A-Za-z0-9_-]{1,200}")
ITEM_ID = re.compile(r"[A-Za-z0-9_-]{1,200}")
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
MAX_ITEMS = 100_000
DEFAULT_LIMIT, MAX_LIMIT = 20, 100
ASC, DESC = "asc", "desc"


def not_found(response_id: str, param: str) -> EngineError:
    shown = response_id if len(response_id) <= 80 else response_id[:80] + "…"
    return EngineError("response_not_found", f"No response with id '{shown}' was found.", param)


def check_id(response_id: str, param: str) -> None:
    """The one id rule, for every path that takes a response id (save, read,
    delete, list its items, previous_response_id), checked before any query:
    an id no save could have stored (a NUL byte, 10,000 characters) is a 400
    naming the field on every database alike."""
    if not RESPONSE_ID.fullmatch(response_id):
        raise invalid_parameter(param, f"'{param}' must be a response id (resp_ followed by "
                                "up to 200 letters, digits, '_' or '-').")


def check_metadata(metadata: dict[str, str]) -> None:
    if len(metadata) > MAX_METADATA_PAIRS:
        raise invalid_parameter("metadata", f"'metadata' holds at most {MAX_METADATA_PAIRS} "
                                f"pairs; got {len(metadata)}.")
    for key, value in metadata.items():
        if not 1 <= len(key) <= MAX_METADATA_KEY:
            raise invalid_parameter("metadata", f"'metadata' keys are 1 to {MAX_METADATA_KEY} "
                                    "characters.")
        if len(value) > MAX_METADATA_VALUE:
            raise invalid_parameter(f"metadata.{key}", f"'metadata.{key}' is longer than "
                                    f"{MAX_METADATA_VALUE} characters.")


def check_items(item_ids: list[str], kinds: list[str | None], where: str) -> None:
    """Every item has an id, unique in its list, and is one of the kinds."""
    if len(item_ids) > MAX_ITEMS:
        raise invalid_parameter(where, f"'{where}' holds at most {MAX_ITEMS} items.")
    seen: set[str] = set()
    for i, (item_id, kind) in enumerate(zip(item_ids, kinds, strict=True)):
        if kind is None:
            raise invalid_parameter(f"{where}[{i}]", f"'{where}[{i}]' is neither a message, a "
                                    "function call, a function call's output nor reasoning.")
        if not ITEM_ID.fullmatch(item_id):
            raise invalid_parameter(f"{where}[{i}].id", f"'{where}[{i}].id' must be 1 to 200 "
                                    "letters, digits, '_' or '-'.")
        if item_id in seen:
            raise invalid_parameter(f"{where}[{i}].id", f"Two items of '{where}' have the id "
                                    f"'{item_id}'.")
        seen.add(item_id)


@dataclass(frozen=True)
class Page:
    positions: list[int]  # into the list, oldest first
    has_more: bool


def page(item_ids: list[str], limit: int | None, order: str, after: str,
         before: str) -> Page:
    """A page of a list of ids (oldest first), in `order`: the first `limit`
    after `after`, or with `before` alone the last `limit` before it (both
    named in that order)."""
    if limit is None:
        limit = DEFAULT_LIMIT
    if not 1 <= limit <= MAX_LIMIT:
        raise invalid_parameter("limit", f"'limit' must be 1 to {MAX_LIMIT}; got {limit}.")
    ordered = list(range(len(item_ids)))
    if order == DESC:
        ordered.reverse()
    start, stop = 0, len(ordered)
    ids_in_order = [item_ids[i] for i in ordered]
    if after:
        if after not in ids_in_order:
            raise invalid_parameter("after", "'after' names no item of this list "
                                    f"('{after[:80]}').")
        start = ids_in_order.index(after) + 1
    if before:
        if before not in ids_in_order:
            raise invalid_parameter("before", "'before' names no item of this list "
                                    f"('{before[:80]}').")
        stop = ids_in_order.index(before)
    window = ordered[start:max(start, stop)]
    if before and not after:
        # Paging backwards: the items right before `before`.
        return Page(window[-limit:], len(window) > limit)
    return Page(window[:limit], len(window) > limit)
