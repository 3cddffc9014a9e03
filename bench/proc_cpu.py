"""CPU time of a process and of each of its threads, read from /proc.

The benches count CPU rather than wall time where they can: on a machine that
others share, a process's CPU per token holds when its throughput does not.
"""

from __future__ import annotations

import os
import pathlib

_TICK = os.sysconf("SC_CLK_TCK")


def _seconds(stat: pathlib.Path) -> float:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


def process_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads."""
    return _seconds(pathlib.Path(f"/proc/{pid}/stat"))


def thread_seconds(pid: int) -> dict[int, float]:
    """User + system CPU time of each thread of a process, by thread id (a
    thread that ends between listing and reading is left out)."""
    out = {}
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = _seconds(task / "stat")
        except OSError:
            continue
    return out
