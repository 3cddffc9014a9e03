"""The X-miLLM-Ignored-Fields header: an RFC 8941 list of strings naming each
unused field's location, as the engine reported them."""

from __future__ import annotations

HEADER = "X-miLLM-Ignored-Fields"
MAX_BYTES = 1024


def _sf_string(location: str) -> str:
    # An sf-string holds printable ASCII only; anything else (and "%", so the
    # encoding reads back unambiguously) is percent-encoded as UTF-8.
    out = []
    for char in location:
        if " " <= char <= "~" and char != "%":
            out.append("\\" + char if char in '"\\' else char)
        else:
            out.extend(f"%{b:02X}" for b in char.encode())
    return '"' + "".join(out) + '"'


def header_value(locations: list[str]) -> str | None:
    """The header's value, capped at MAX_BYTES with a last entry "+N more";
    None when nothing was ignored."""
    if not locations:
        return None
    items = [_sf_string(loc) for loc in locations]
    whole = ", ".join(items)
    if len(whole) <= MAX_BYTES:
        return whole
    kept, size = [], 0
    for i, item in enumerate(items):
        tail = f'"+{len(items) - i - 1} more"'
        grown = size + (2 if kept else 0) + len(item)
        if grown + 2 + len(tail) > MAX_BYTES:
            break
        kept.append(item)
        size = grown
    rest = len(items) - len(kept)
    return ", ".join([*kept, f'"+{rest} more"'])
