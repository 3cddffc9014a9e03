"""What one step's rows tell their callers, for the transformers engine.

A step (a decode step of a lane, or a prefill's first tokens) yields one
(row, delta, done) per row. Rows here carry their group's progress, so a
group is done when its last row is (n > 1 runs a row per choice); the
gathering and posting rule itself is the engines' shared one
(service/generation/step_posts.py).
"""

from __future__ import annotations

from service.engines.transformers.batch import GroupProgress, Row
from service.generation.job import ChoiceDelta, GroupDone
from service.generation.step_posts import StepPosts


def step_posts(results: list[tuple[Row, ChoiceDelta, bool]]
               ) -> tuple[StepPosts, list[GroupProgress]]:
    """The step's posts, and the groups whose last row finished in it."""
    posts = StepPosts()
    for row, _, _ in results:
        if row.failed:
            posts.fail(row.job)
    finished: list[GroupProgress] = []
    for row, delta, done in results:
        if posts.has_failed(row.job):
            continue
        posts.delta(row.job, delta)
        if done:
            row.progress.rows_left -= 1
            if row.progress.rows_left == 0:
                finished.append(row.progress)
    for p in finished:  # after every delta: a group's tokens are all counted
        posts.group_done(p.job, GroupDone(p.completion_tokens, p.cached_tokens, p.recorder))
    return posts, finished
