"""Faults injected on purpose, for the tests that prove the model thread
survives them (tests/test_model_thread_faults.py).

MILLM_FAULT_INJECTION lists `point:kind:nth` items, comma-separated: the nth
time the model thread passes `point`, it raises `kind` once. Points: `prefill`
(a forward pass over new prompts), `decode` (a lane's step), `merge` (new rows
joining a lane), `row` (one row taking its token), `admit` (a waiting part
being set up to run), `turn` (the loop itself, outside every guard). Kinds:
`oom` (torch's OutOfMemoryError, as a too-large batch raises on a GPU),
`error` (a RuntimeError) and `death` (an exception no guard catches, as if the
thread itself broke). The GGUF engine has `row`, `decode` (its shared batch's
step), `seeded` (a seeded lane's step) and `turn`.

Unset, as in production, `hit` is one lookup in an empty dict.
"""

from __future__ import annotations

import os
import threading

import torch


class SimulatedDeath(BaseException):
    """Escapes `except Exception`: the thread dies as it would of a bug in its guard."""


_KINDS = {
    "oom": lambda point: torch.OutOfMemoryError(f"simulated out of memory at {point}"),
    "error": lambda point: RuntimeError(f"simulated failure at {point}"),
    "death": lambda point: SimulatedDeath(f"simulated thread death at {point}"),
}
POINTS = ("prefill", "decode", "merge", "row", "admit", "turn", "seeded")


def _parse(spec: str) -> dict[str, list[tuple[int, str]]]:
    planned: dict[str, list[tuple[int, str]]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        point, kind, nth = item.split(":")
        if point not in POINTS or kind not in _KINDS or int(nth) < 1:
            raise ValueError(f"MILLM_FAULT_INJECTION: cannot read {item!r}")
        planned.setdefault(point, []).append((int(nth), kind))
    return planned


_planned = _parse(os.environ.get("MILLM_FAULT_INJECTION", ""))
_passes: dict[str, int] = {}
_lock = threading.Lock()


def hit(point: str) -> None:
    """Raise the fault planned for this pass through `point`, if any."""
    if not _planned or point not in _planned:
        return
    with _lock:
        _passes[point] = count = _passes.get(point, 0) + 1
    for nth, kind in _planned[point]:
        if nth == count:
            raise _KINDS[kind](point)
