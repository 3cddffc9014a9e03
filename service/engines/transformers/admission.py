"""How the transformers engine splits a request's prompt groups into the
parts it admits (the fair-admission rule itself, the limits and a waiting
request are engines/admission.py's, shared with the GGUF engine)."""

from __future__ import annotations

from dataclasses import replace

from service.requests.generation import PromptGroup


def split_parts(groups: tuple[PromptGroup, ...], size: int) -> list[tuple[PromptGroup, bool]]:
    """Each group as parts of at most `size` rows, with whether a part
    continues the one before it (same prompt, later choices)."""
    parts = []
    for group in groups:
        for start in range(0, group.n, size):
            k = min(size, group.n - start)
            part = group if k == group.n else replace(
                group, n=k, first_index=group.first_index + start,
                row_seeds=group.row_seeds[start:start + k])
            parts.append((part, start > 0))
    return parts
