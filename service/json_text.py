"""JSON that arrives as text inside a request, read by one parser.

Tool-call arguments, steering documents and stored responses' JSON fields
come as strings, so the bridge's body checks (depth, NaN) never saw their
contents. (Schemas are read here too; structured_output.check_schema then
holds them to its tighter size and depth limits.) Python's json module reads
NaN and Infinity, which no JSON writer may write back, and raises
RecursionError (not ValueError) on deep nesting, which a handler catching
ValueError lets through as an internal error. Here
both are a ValueError with a reason, and so is nesting deeper than a request
body may be (rest_bridge/protocol/base.py MAX_BODY_DEPTH), so every caller
refuses them as it refuses any other text that is not JSON.
"""

from __future__ import annotations

import json

MAX_DEPTH = 128


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def loads(text: str):
    """The JSON value of `text`; ValueError saying why when it is not
    standard JSON of at most MAX_DEPTH levels."""
    too_deep = f"nested deeper than {MAX_DEPTH} levels"
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError(too_deep) from None
    depth, level = 0, [value]
    while containers := [v for v in level if isinstance(v, dict | list)]:
        depth += 1
        if depth > MAX_DEPTH:
            raise ValueError(too_deep)
        level = [c for item in containers
                 for c in (item.values() if isinstance(item, dict) else item)]
    return value
