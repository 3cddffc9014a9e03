"""Whether a text is the start of a JSON document: what a grammar-constrained
answer cut short by max_tokens must still be, whatever the model chose to
write. json.loads can only say whether a whole document is complete; this
reads a prefix with a small pushdown automaton (RFC 8259), so a test can
assert the engine's guarantee instead of hoping a small model closes its
object in time."""

from __future__ import annotations

import re

_WS = " \t\n\r"
_LITERALS = ("true", "false", "null")
_NUMBER = "0123456789+-.eE"


def is_json_prefix(text: str, top: str = "{") -> bool:
    """True when `text` can be extended to a valid JSON document whose value
    starts with `top` (one of "{", "[", or "" for any value)."""
    stack: list[str] = []  # "{" / "[" per open container
    expect = "value"  # value, key, colon, comma_or_close, key_or_close, value_or_close
    i, n = 0, len(text)
    started = False
    while i < n:
        c = text[i]
        if c in _WS:
            i += 1
            continue
        if expect in ("value", "value_or_close"):
            if expect == "value_or_close" and c == "]":
                stack.pop()
                expect = _after_value(stack)
                i += 1
                continue
            if not started and top and c != top:
                return False
            started = True
            if c in "{[":
                stack.append(c)
                expect = "key_or_close" if c == "{" else "value_or_close"
                i += 1
            elif c == '"':
                end = _string_end(text, i)
                if end < 0:
                    return end == _OPEN
                i, expect = end, _after_value(stack)
            elif c == "-" or c.isdigit():
                j = i
                while j < n and text[j] in _NUMBER:
                    j += 1
                if not _number_prefix_ok(text[i:j], complete=j < n):
                    return False
                i, expect = j, _after_value(stack)
            else:
                rest = text[i:]
                word = next((w for w in _LITERALS if rest.startswith(w) or w.startswith(rest)),
                            None)
                if word is None:
                    return False
                if len(rest) < len(word):
                    return True  # the text ends inside the literal
                i, expect = i + len(word), _after_value(stack)
        elif expect in ("key", "key_or_close"):
            if expect == "key_or_close" and c == "}":
                stack.pop()
                expect = _after_value(stack)
                i += 1
                continue
            if c != '"':
                return False
            end = _string_end(text, i)
            if end < 0:
                return end == _OPEN
            i, expect = end, "colon"
        elif expect == "colon":
            if c != ":":
                return False
            i, expect = i + 1, "value"
        elif expect == "comma_or_close":
            if c == ",":
                expect = "key" if stack[-1] == "{" else "value"
            elif c == "}" and stack[-1] == "{" or c == "]" and stack[-1] == "[":
                stack.pop()
                expect = _after_value(stack)
            else:
                return False
            i += 1
        else:  # "done": only whitespace may follow a complete document
            return False
    return True


def _after_value(stack: list[str]) -> str:
    return "comma_or_close" if stack else "done"


_OPEN, _BAD = -1, -2
_ESCAPES = '"\\/bfnrt'
_HEX = "0123456789abcdefABCDEF"


def _string_end(text: str, start: int) -> int:
    """The index after the closing quote of the string opening at `start`;
    _OPEN when the text ends inside it validly, _BAD at a control character
    or a bad escape."""
    i, n = start + 1, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            return i + 1
        if ord(c) < 0x20:
            return _BAD
        if c == "\\":
            if i + 1 >= n:
                return _OPEN
            kind = text[i + 1]
            if kind == "u":
                digits = text[i + 2:i + 6]
                if not all(d in _HEX for d in digits):
                    return _BAD
                if len(digits) < 4:
                    return _OPEN
                i += 6
                continue
            if kind not in _ESCAPES:
                return _BAD
            i += 2
            continue
        i += 1
    return _OPEN


def _number_prefix_ok(token: str, complete: bool) -> bool:
    """A number token (or, at the end of the text, its start)."""
    whole = re.fullmatch(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?", token)
    if complete or whole:
        return whole is not None
    return re.fullmatch(r"-?(0|[1-9]\d*)?(\.\d*)?([eE][+-]?\d*)?", token) is not None \
        and not re.search(r"^-?0\d", token)
