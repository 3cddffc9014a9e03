"""Custom (freeform) tools: a call whose input is text under a grammar.

Why this shape: every call syntax the engine serves writes a call's
arguments as one JSON value (formats/base.py), and the streaming parser,
the tool history and the chat templates all read them as JSON. So a custom
tool is offered to the model as a function with one string argument,
`input`, and its calls are `{"input": "<text>"}`. The client's grammar (Lark
or a regular expression, as OpenAI's custom tools send it) describes the
text itself, not its JSON spelling; to constrain the call, the grammar is
rewritten into one for the JSON string literal that spells the same text:
every literal and character class of xgrammar's normalised EBNF is replaced
by its JSON-escaped form (a `"` becomes `\\"`, a newline `\\n`, ...), and
the rule structure is kept as it is. xgrammar parses the client's grammar;
only its printed EBNF (string literals, character classes, rule names,
groups and repetitions) is rewritten here.

A grammar xgrammar cannot read, or whose EBNF holds a construct this
rewrite does not know (token references, tag dispatch), gives None: the
caller leaves the input free and reports the format as ignored, never a
5xx.
"""

from __future__ import annotations

import json
import logging

log = logging.getLogger(__name__)

FREE, LARK, REGEX = "text", "lark", "regex"
MAX_DEFINITION = 64 * 1024
INPUT_SCHEMA = {"type": "object", "properties": {"input": {"type": "string"}},
                "required": ["input"], "additionalProperties": False}
# Characters a JSON string cannot hold as themselves.
_SPECIAL = frozenset([*range(0x20), ord('"'), ord("\\")])
_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0", "b": "\b",
           "a": "\a", "e": "\x1b"}
_ROOT = "freeform_root"


class Unsupported(ValueError):
    """A construct of the printed EBNF this rewrite does not handle."""


def arguments_grammar(syntax: str, definition: str) -> str | None:
    """EBNF whose `root` is a call's arguments `{"input": "<text>"}` with the
    text in the client's grammar; None when it cannot be built (free text)."""
    import xgrammar

    if syntax == FREE or not definition or len(definition) > MAX_DEFINITION:
        return None
    try:
        if syntax == LARK:
            grammar = xgrammar.Grammar.from_lark(definition)
        else:
            grammar = xgrammar.Grammar.from_regex(definition)
        ebnf = escaped_ebnf(str(grammar))
        xgrammar.Grammar.from_ebnf(ebnf)  # parses: the structural tag will too
    except Exception as exc:  # noqa: BLE001 - any refusal of xgrammar's means "free text"
        log.info("custom_tool_grammar_unused syntax=%s reason=%s", syntax, str(exc)[:200])
        return None
    return ebnf


def escaped_ebnf(ebnf: str) -> str:
    """The printed grammar rewritten for JSON-escaped text, under a new root
    that wraps it in the arguments object."""
    tokens = list(_tokens(ebnf))
    names = {text for kind, text in tokens if kind == "name"}
    root = _ROOT
    while root in names:
        root += "_"
    out = []
    for kind, text in tokens:
        if kind == "literal":
            out.append(_literal(json.dumps(text, ensure_ascii=False)[1:-1]))
        elif kind == "class":
            out.append(_class(*text))
        elif kind == "name":
            out.append(root if text == "root" else text)
        else:
            out.append(text)
    head = f'root ::= ("{{\\"input\\": \\"" {root} "\\"}}")\n'
    return head + "".join(out)


def _tokens(ebnf: str):
    i, n = 0, len(ebnf)
    while i < n:
        c = ebnf[i]
        if c == '"':
            text, i = _read(ebnf, i + 1, '"')
            yield "literal", text
        elif c == "[":
            negated = ebnf.startswith("[^", i)
            start = i + 2 if negated else i + 1
            ranges, i = _read_class(ebnf, start)
            yield "class", (ranges, negated)
        elif c.isalpha() or c == "_":
            j = i
            while j < n and (ebnf[j].isalnum() or ebnf[j] in "_."):
                j += 1
            if ebnf.startswith("(", j):  # TagDispatch(...) and the like
                raise Unsupported(f"'{ebnf[i:j]}(' is not rewritten")
            yield "name", ebnf[i:j]
            i = j
        elif c == "{":
            j = ebnf.index("}", i) + 1
            yield "other", ebnf[i:j]
            i = j
        elif c in " \t\n():=|*+?,-0123456789":
            yield "other", c
            i += 1
        else:
            raise Unsupported(f"'{c}' is not rewritten")


def _escape(s: str, i: int) -> tuple[str, int]:
    """The character of the escape at s[i] (after the backslash), and the index after it."""
    c = s[i]
    width = {"x": 2, "u": 4, "U": 8}.get(c)
    if width is not None:
        return chr(int(s[i + 1:i + 1 + width], 16)), i + 1 + width
    return _SIMPLE.get(c, c), i + 1


def _read(s: str, i: int, end: str) -> tuple[str, int]:
    out = []
    while s[i] != end:
        if s[i] == "\\":
            ch, i = _escape(s, i + 1)
        else:
            ch, i = s[i], i + 1
        out.append(ch)
    return "".join(out), i + 1


def _read_class(s: str, i: int) -> tuple[list[tuple[int, int]], int]:
    chars: list[str] = []  # characters, with "-" marking a range between neighbours
    while s[i] != "]":
        if s[i] == "\\":
            ch, i = _escape(s, i + 1)
            chars.append(("c", ch))
        elif s[i] == "-" and chars and s[i + 1] != "]":
            chars.append(("-", "-"))
            i += 1
        else:
            chars.append(("c", s[i]))
            i += 1
    ranges, k = [], 0
    while k < len(chars):
        if k + 2 < len(chars) and chars[k + 1][0] == "-":
            ranges.append((ord(chars[k][1]), ord(chars[k + 2][1])))
            k += 3
        else:
            ranges.append((ord(chars[k][1]), ord(chars[k][1])))
            k += 1
    return ranges, i + 1


def _minus_specials(ranges) -> list[tuple[int, int]]:
    out = []
    for lo, hi in ranges:
        start = lo
        for c in range(lo, min(hi, 0x5C) + 1):
            if c in _SPECIAL:
                if start < c:
                    out.append((start, c - 1))
                start = c + 1
        if start <= hi:
            out.append((start, hi))
    return out


def _covers(ranges, c: int) -> bool:
    return any(lo <= c <= hi for lo, hi in ranges)


def _class(ranges, negated: bool) -> str:
    """A character class as the JSON spelling of its characters: the ones a
    JSON string holds as themselves stay a class; each special one becomes
    the literal of its escape."""
    if negated:
        plain = _class_text([*ranges, *((c, c) for c in _SPECIAL)], True)
        escapes = [c for c in sorted(_SPECIAL) if not _covers(ranges, c)]
    else:
        kept = _minus_specials(ranges)
        plain = _class_text(kept, False) if kept else None
        escapes = [c for c in sorted(_SPECIAL) if _covers(ranges, c)]
    options = ([plain] if plain else []) + [
        _literal(json.dumps(chr(c))[1:-1]) for c in escapes]
    if not options:
        raise Unsupported("a character class that matches nothing")
    return "(" + " | ".join(options) + ")"


def _merged(ranges) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def _class_text(ranges, negated: bool) -> str:
    ranges = _merged(ranges)
    body = "".join(_char(lo, True) if lo == hi else f"{_char(lo, True)}-{_char(hi, True)}"
                   for lo, hi in ranges)
    return f"[{'^' if negated else ''}{body}]"


def _char(c: int, in_class: bool = False) -> str:
    ch = chr(c)
    if 0x20 < c < 0x7F and ch not in '"\\' and not (in_class and ch in "]-^["):
        return ch
    if c == 0x20:
        return " "
    if ch in '"\\]-^[':
        return "\\" + ch
    if c <= 0xFF:
        return f"\\x{c:02x}"
    if c <= 0xFFFF:
        return f"\\u{c:04x}"
    return f"\\U{c:08x}"


def _literal(text: str) -> str:
    return '"' + "".join(_char(ord(ch)) for ch in text) + '"'
