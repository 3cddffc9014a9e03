"""The numbers a schema may ask the grammar compiler for.

A schema's size and depth are capped in structured_output.py, but a small
schema can still ask for a lot: xgrammar expands a pattern's counted
repetition (`[a-z]{0,5000}`) into automaton states, and its compile time
grows with the square of the count (about 0.06 s for `a{0,1000}`, 6.5 s for
`a{0,10000}` on the demo vocabulary), however few bytes the pattern takes.
So counted repetitions are budgeted per schema (nested counts multiply, the
patterns of a schema, or of all a request's tools, add up), and the other
numbers the grammar is built from are capped too:

- `minLength`, `maxLength`, `minItems`, `maxItems`: at most MAX_COUNT, more
  than any document a model writes within its context;
- `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`,
  `multipleOf`: magnitude at most MAX_BOUND (2^53 - 1, the largest integer
  a JSON number holds exactly in most parsers; xgrammar refuses integer
  bounds past 64 bits anyway);
- pattern repetition counts (`{m}`, `{m,}`, `{m,n}`): each quantifier counts
  its largest number times the counts inside its group; a schema's
  patterns together may count at most MAX_REPEATS.

A refusal is 400 `response_format_unsupported` naming the keyword's JSON
pointer.
"""

from __future__ import annotations

import re

MAX_COUNT = 100_000
MAX_BOUND = 2**53 - 1
MAX_REPEATS = 1_000

COUNTS = frozenset({"minLength", "maxLength", "minItems", "maxItems"})
BOUNDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                    "multipleOf"})
_QUANTIFIER = re.compile(r"\{(\d*)(?:,(\d*))?\}")


class RepeatBudget:
    """The repetition counts left to one schema (or one request's tools)."""

    def __init__(self, total: int = MAX_REPEATS):
        self.total = total
        self.used = 0


def pattern_repeats(pattern: str) -> int:
    """How many repetitions the pattern's counted quantifiers ask for: each
    quantifier's largest number, times what the group it repeats asks for
    inside, summed over the pattern. `*`, `+` and `?` count nothing (a loop
    costs the compiler no more than one pass)."""
    frames = [0]  # per open group: what its contents ask for so far
    last = 0  # what the atom just read asks for (already in frames[-1])
    i = 0
    while i < len(pattern):
        c = pattern[i]
        match = _QUANTIFIER.match(pattern, i) if c == "{" else None
        if match is not None and (match.group(1) or match.group(2)):
            count = max(int(n) for n in match.groups() if n)
            frames[-1] += count * max(last, 1) - last
            i, last = match.end(), 0
            continue
        i, last = i + 1, 0
        if c == "\\":
            i += 1
        elif c == "[":  # a class is one atom: skip to its closing bracket
            i += (pattern[i:i + 1] == "^")
            i += (pattern[i:i + 1] == "]")
            while i < len(pattern) and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
            i += 1
        elif c == "(":
            frames.append(0)
        elif c == ")" and len(frames) > 1:
            last = frames.pop()
            frames[-1] += last
    return sum(frames)


def limit_problem(key: str, value, pointer: str, budget: RepeatBudget) -> str | None:
    """Why this keyword's number is past its cap; None when it is not (or
    is no number: the JSON Schema check names that)."""
    if key == "pattern" and isinstance(value, str):
        before = budget.used
        budget.used += pattern_repeats(value)
        if budget.used > budget.total >= before:  # named once: the pattern past the cap
            return (f"pattern at {pointer} brings the counted repetitions of the schema's "
                    f"patterns to {budget.used}; at most {budget.total}")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if key in COUNTS and value > MAX_COUNT:
        return f"{key} {value} at {pointer}; at most {MAX_COUNT}"
    if key in BOUNDS and abs(value) > MAX_BOUND:
        return f"{key} {value} at {pointer}; its magnitude may be at most {MAX_BOUND}"
    return None
