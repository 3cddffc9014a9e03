"""What admission works with: the limits, a waiting request's parts, and how
a group is split into parts (scheduler.py's module docstring says why)."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field, replace

from service.generation.job import GenerationJob
from service.requests.generation import PromptGroup


@dataclass
class Waiting:
    job: GenerationJob
    groups: collections.deque = field(default_factory=collections.deque)  # parts not yet run
    since: float = field(default_factory=time.monotonic)


@dataclass
class SchedulerLimits:
    max_batch: int = 64  # running rows
    max_queued: int = 256  # waiting requests
    serial: bool = False  # one request at a time (for comparison benchmarks)
    max_rows_per_request: int = 0  # rows one request holds at once; 0: half of max_batch
    aging_s: float = 5.0  # how long later requests may pass one that does not fit
    stall_s: float = 30.0  # a reader that takes nothing this long is cancelled (job.py)
    prefill_chunk: int = 512  # prompt tokens computed per turn at most (prefill.py)

    @property
    def request_rows(self) -> int:
        if self.serial:
            return self.max_batch
        return self.max_rows_per_request or max(1, self.max_batch // 2)


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
