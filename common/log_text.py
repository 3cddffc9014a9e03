"""Client-chosen text in log lines: escaped and bounded.

A model name, profile name, field name, path or request id comes from whoever
sent the request. Written raw, a newline in it forges a log line and 30,000
characters of it drown the log; `shown` writes it as a quoted Python literal
(every control character, quote and lone surrogate escaped) cut to a bound.
JSON log lines are escaped by json.dumps already and only need `clipped`.
"""

from __future__ import annotations

LIMIT = 128


def clipped(text: str, limit: int = LIMIT) -> str:
    """At most `limit` characters of `text`, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…(+{len(text) - limit} chars)"


def shown(text: object, limit: int = LIMIT) -> str:
    """`text` as an escaped, quoted literal of bounded length, for %s in a log line."""
    return repr(clipped(str(text), limit))
