"""What one step's rows tell their callers: the events of each request.

A step (a decode step of a lane, or a prefill's first tokens) yields one
(row, delta, done) per row. Each request gets one StepOutput with its rows'
deltas, and a GroupDone once every row of a group has finished; a request
with a row whose bookkeeping failed gets neither (the scheduler fails it).
The scheduler posts them all at once (job.post_all), so the event loop wakes
once per step rather than once per request.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.engines.transformers.batch import GroupProgress, Row
from service.generation.job import ChoiceDelta, GenerationJob, GroupDone, StepOutput


@dataclass
class StepEvents:
    failed: list[GenerationJob]  # a row of theirs failed: the scheduler fails them
    posts: list[tuple[GenerationJob, object]]  # (job, event), in posting order
    jobs: list[GenerationJob]  # those given a StepOutput
    finished: list[GroupProgress]  # groups whose last row finished
    tokens: int  # tokens generated for the jobs that did not fail


def step_events(results: list[tuple[Row, ChoiceDelta, bool]]) -> StepEvents:
    failed = {id(row.job): row.job for row, _, _ in results if row.failed}
    per_job: dict[int, tuple[GenerationJob, list]] = {}
    finished: list[GroupProgress] = []
    tokens = 0
    for row, delta, done in results:
        if id(row.job) in failed:
            continue
        tokens += 1
        per_job.setdefault(id(row.job), (row.job, []))[1].append(delta)
        if done:
            row.progress.rows_left -= 1
            if row.progress.rows_left == 0:
                finished.append(row.progress)
    posts: list[tuple[GenerationJob, object]] = [
        (job, StepOutput(tuple(deltas))) for job, deltas in per_job.values()]
    posts += [(p.job, GroupDone(p.completion_tokens, p.cached_tokens, p.recorder))
              for p in finished]
    return StepEvents(list(failed.values()), posts, [job for job, _ in per_job.values()],
                      finished, tokens)
