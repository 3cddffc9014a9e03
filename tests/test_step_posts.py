"""StepPosts: the one rule both engines follow to post a step's events. Each
request gets one StepOutput with its rows' deltas in the order they were taken,
its finished groups' GroupDone after it, and nothing at all once a row of it
failed (the engine fails that request instead)."""

from __future__ import annotations

import asyncio
import types

import pytest

from service.generation.job import ChoiceDelta, GenerationJob, GroupDone, StepOutput
from service.generation.step_posts import StepPosts


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def job(loop, whole: bool = False) -> GenerationJob:
    return GenerationJob(types.SimpleNamespace(monitoring=None, request_id="r", whole=whole), loop)


def received(loop, j: GenerationJob) -> list:
    loop.run_until_complete(asyncio.sleep(0))  # run the posted put_nowait calls
    events = []
    while not j.queue.empty():
        events.append(j.queue.get_nowait())
    return events


def test_each_request_gets_its_deltas_in_order_then_its_group_done(loop):
    a, b = job(loop), job(loop)
    posts = StepPosts()
    posts.delta(a, ChoiceDelta(0, "x", (1,)))
    posts.delta(b, ChoiceDelta(0, "y", (2,)))
    posts.delta(a, ChoiceDelta(1, "z", (3,)))
    posts.group_done(a, GroupDone(5, 0))
    assert posts.tokens == 3
    assert posts.post(stall_s=60.0) == [a, b]
    got_a, got_b = received(loop, a), received(loop, b)
    assert [type(e) for e in got_a] == [StepOutput, GroupDone]
    assert [(d.index, d.text) for d in got_a[0].deltas] == [(0, "x"), (1, "z")]
    assert [[d.text for d in e.deltas] for e in got_b] == [["y"]]


def test_a_failed_request_gets_nothing_of_the_step_and_counts_no_tokens(loop):
    a, b = job(loop), job(loop)
    posts = StepPosts()
    posts.delta(a, ChoiceDelta(0, "taken before its other row failed", (1,)))
    posts.delta(b, ChoiceDelta(0, "y", (2,)))
    posts.group_done(a, GroupDone(1, 0))
    posts.fail(a)
    assert posts.has_failed(a) and not posts.has_failed(b)
    assert posts.failed == [a]
    assert posts.tokens == 1
    assert posts.post(stall_s=60.0) == [b]
    assert received(loop, a) == []
    assert [type(e) for e in received(loop, b)] == [StepOutput]


def test_a_request_read_whole_gets_its_steps_joined_once_its_group_ends(loop):
    whole, streamed = job(loop, whole=True), job(loop)
    for step, text in enumerate(("Once", " upon", " a")):
        posts = StepPosts()
        posts.delta(whole, ChoiceDelta(0, text, (step,)))
        posts.delta(streamed, ChoiceDelta(0, text, (step,)))
        if step == 2:
            posts.group_done(whole, GroupDone(3, 0))
        posts.post(stall_s=60.0)
        if step < 2:
            assert received(loop, whole) == []  # no wake of its caller a step
    assert len(received(loop, streamed)) == 3
    got = received(loop, whole)
    assert [type(e) for e in got] == [StepOutput, GroupDone]
    assert [(d.text, d.token_ids) for d in got[0].deltas] == [("Once upon a", (0, 1, 2))]
    assert 0 < whole.held_first_at <= whole.held_last_at and whole.held == []
