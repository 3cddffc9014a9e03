"""One decode step's events, gathered per request and posted together.

Both engines take a step's rows one at a time. Each request then gets one
StepOutput holding its rows' deltas in the order they were taken, followed by
a GroupDone for each of its groups that finished in the step. A request one of
whose rows failed gets none of it: the engine fails that request instead.
Posting everything at once (job.post_all) wakes the event loop once a step
rather than once a request; a request whose reader has fallen too far behind
is abandoned after the post, and its rows leave at the engine's next turn.
"""

from __future__ import annotations

from service.generation.job import ChoiceDelta, GenerationJob, GroupDone, StepOutput, post_all


class StepPosts:
    def __init__(self) -> None:
        self._deltas: dict[int, tuple[GenerationJob, list[ChoiceDelta]]] = {}
        self._done: list[tuple[GenerationJob, GroupDone]] = []
        self._failed: dict[int, GenerationJob] = {}

    def fail(self, job: GenerationJob) -> None:
        """A row of `job` failed: nothing of this step is posted to it."""
        self._failed[id(job)] = job

    def has_failed(self, job: GenerationJob) -> bool:
        return id(job) in self._failed

    @property
    def failed(self) -> list[GenerationJob]:
        return list(self._failed.values())

    def delta(self, job: GenerationJob, delta: ChoiceDelta) -> None:
        self._deltas.setdefault(id(job), (job, []))[1].append(delta)

    def group_done(self, job: GenerationJob, done: GroupDone) -> None:
        self._done.append((job, done))

    @property
    def tokens(self) -> int:
        """Tokens this step generated for the requests that did not fail."""
        return sum(len(deltas) for key, (_, deltas) in self._deltas.items()
                   if key not in self._failed)

    def post(self, stall_s: float) -> list[GenerationJob]:
        """Post every request's events; returns those given a StepOutput. A
        whole-read job's steps are held (GenerationJob.hold) and posted
        joined before its group's GroupDone."""
        stepped: list[GenerationJob] = []
        posts: list[tuple[GenerationJob, object]] = []
        for key, (job, deltas) in self._deltas.items():
            if key in self._failed:
                continue
            if job.spec.whole:
                job.hold(StepOutput(tuple(deltas)))
                continue
            stepped.append(job)
            posts.append((job, StepOutput(tuple(deltas))))
        for job, done in self._done:
            if id(job) in self._failed:
                continue
            if job.spec.whole and job.held:
                stepped.append(job)
                posts.append((job, job.release()))
            posts.append((job, done))
        post_all(posts)
        for job in stepped:
            if job.stalled(stall_s):
                job.abandon()
        return stepped
