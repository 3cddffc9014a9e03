"""Gemma 4: calls between `<|tool_call>` and `<tool_call|>`, arguments in
Gemma's own object notation (keys bare, strings between `<|"|>` marks, at
every depth), and thinking in a thought channel:

    <|channel>thought
    The user wants the weather.<channel|>
    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>

(the call's line after the thought, cut here, follows it directly),
The grammar is xgrammar's JSON-schema format in its "gemma" style; the
arguments come back to the client as the JSON object they stand for
(`GemmaArguments`), streamed as each value completes."""

from __future__ import annotations

import json

from service.formats.base import ArgumentNotation, CallSyntax, Family, ReasoningSyntax

QUOTE = '<|"|>'
REASONING = ReasoningSyntax("gemma4", "<|channel>thought\n", "<channel|>")
BARE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-+.")


def detect(template: str, special_tokens: tuple[str, ...]) -> bool:
    return "<|tool_call>" in template or "<|channel>" in template


def gemma_text(value) -> str:
    """A JSON value in Gemma's notation."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{gemma_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(gemma_text(v) for v in value) + "]"
    if isinstance(value, str):
        return QUOTE + value + QUOTE
    return json.dumps(value)


class GemmaArguments:
    """One call's arguments read character by character into JSON text
    (spaced as json.dumps spaces it); `done` turns true when the object
    closes."""

    def __init__(self, schema: dict | None):
        self.depth, self.done = 0, False
        self.bare = ""  # a key or a literal, until what follows says which
        self.string: str | None = None  # inside <|"|>...<|"|>: its text so far
        self.mark = ""  # the part of <|"|> read so far

    def feed(self, c: str) -> str:
        if self.string is not None:
            self.string += c
            if self.string.endswith(QUOTE):
                text, self.string = self.string[:-len(QUOTE)], None
                return json.dumps(text)
            return ""
        if self.mark or c == "<":
            self.mark += c
            if not QUOTE.startswith(self.mark):
                raise ValueError("not Gemma's notation")
            if self.mark == QUOTE:
                self.mark, self.string = "", ""
            return ""
        if c.isspace():
            return ""  # layout (a bare word waits for what follows it)
        if c in BARE:
            self.bare += c
            return ""
        out = ""
        if self.bare:  # a key before ':', else a literal
            out, self.bare = (json.dumps(self.bare) if c == ":" else self._literal()), ""
        if c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            self.done = self.depth == 0
        elif c not in ",:":
            raise ValueError("not Gemma's notation")
        return out + {",": ", ", ":": ": "}.get(c, c)

    def _literal(self) -> str:
        value = json.loads(self.bare)  # a number, true, false or null
        return json.dumps(value)


class GemmaNotation(ArgumentNotation):
    """Gemma's notation as CallSyntax writes and reads it."""

    style, markup = "gemma", (QUOTE,)

    def text(self, arguments_json: str, call_close: str) -> tuple[str, str]:
        return gemma_text(json.loads(arguments_json)), call_close

    def reader(self, schema: dict | None, call_close: str) -> tuple[GemmaArguments, str]:
        return GemmaArguments(schema), call_close


CALLS = CallSyntax("gemma4", call_open="<|tool_call>call:", name_close="",
                   call_close="<tool_call|>", separator="", arguments=GemmaNotation())
FAMILY = Family("gemma4", CALLS, REASONING, detect,
                "the template writes `<|tool_call>` or `<|channel>`")
