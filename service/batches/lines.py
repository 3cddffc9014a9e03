"""A batch input file read line by line: which lines are requests a batch can
run, and why each other one is not.

OpenAI's line: {"custom_id": "...", "method": "POST", "url": "/v1/...",
"body": {...}}. A line that is none (not JSON, not an object, a field missing
or of the wrong type, another method, a url miLLM does not batch) does not
stop the batch: it goes to the error file with the reason, and the other
lines run. A line may target another of those urls than the batch's
endpoint. Blank lines are skipped. Two lines with the same
custom_id make the results ambiguous, so such a file is refused when the
batch is created (400 duplicate_custom_id naming the id), as OpenAI refuses it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from service.errors import EngineError, invalid_parameter

MAX_LINES = 50_000
MAX_CUSTOM_ID = 512
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
             "/v1/messages")


@dataclass(frozen=True)
class Line:
    index: int  # 0-based, among the file's non-blank lines
    custom_id: str
    url: str
    body: str  # the request body, as JSON text


@dataclass(frozen=True)
class Problem:
    index: int
    custom_id: str
    code: str
    message: str


def _read(index: int, raw: str) -> Line | Problem:
    try:
        item = json.loads(raw)
    except ValueError:
        return Problem(index, "", "invalid_json_line", "The line is not JSON.")
    if not isinstance(item, dict):
        return Problem(index, "", "invalid_request", "The line is not a JSON object.")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= MAX_CUSTOM_ID:
        return Problem(index, "", "missing_custom_id", f"The line needs 'custom_id': a string "
                       f"of 1 to {MAX_CUSTOM_ID} characters.")
    if item.get("method") != "POST":
        return Problem(index, custom_id, "invalid_method", "The line's 'method' must be POST.")
    url = item.get("url")
    if url not in ENDPOINTS:
        return Problem(index, custom_id, "invalid_url", f"The line's 'url' must be one of "
                       f"{', '.join(ENDPOINTS)}.")
    body = item.get("body")
    if not isinstance(body, dict):
        return Problem(index, custom_id, "missing_body", "The line needs 'body': a JSON "
                       "object, the request.")
    return Line(index, custom_id, url, json.dumps(body, separators=(",", ":")))


def parse(text: str) -> tuple[list[Line], list[Problem]]:
    """Every non-blank line, read: requests and problems, in file order."""
    raws = [r for r in text.splitlines() if r.strip()]
    if len(raws) > MAX_LINES:
        raise invalid_parameter("file", f"A batch file holds at most {MAX_LINES} requests; "
                                f"this one has {len(raws)}.")
    lines, problems = [], []
    for index, raw in enumerate(raws):
        read = _read(index, raw)
        (lines if isinstance(read, Line) else problems).append(read)
    return lines, problems


def for_batch(text: str, param: str) -> tuple[list[Line], list[Problem]]:
    """The file's lines for a batch; a custom_id used twice refuses the
    batch. A line may name another batchable endpoint than the batch's
    (OpenAI refuses that; here it runs there), so one file can mix chat,
    completions and embeddings."""
    if not text.strip():
        raise invalid_parameter(param, "The input file holds no requests.")
    lines, problems = parse(text)
    seen: set[str] = set()
    for item in [*lines, *problems]:
        if item.custom_id and item.custom_id in seen:
            raise EngineError("duplicate_custom_id", f"The input file uses custom_id "
                              f"'{item.custom_id[:80]}' more than once; each line needs its "
                              "own.", param)
        seen.add(item.custom_id)
    return lines, problems
