"""The inbox both engines' model threads take work from (engines/model_thread.py
Inbox), on its own: the queue-full check, the drain, death, and the answer to
what never ran. No model and no thread: the test plays the model thread."""

from __future__ import annotations

import asyncio

import pytest

from service.engines.model_thread import Inbox
from service.errors import EngineError


class Job:
    parts = 0
    error = None

    def fail_from_thread(self, error) -> None:
        self.error = error


def test_submit_refuses_past_max_queued_until_a_job_leaves_the_queue():
    inbox = Inbox(max_queued=2)
    first, second = Job(), Job()
    inbox.submit(first, 3)
    inbox.submit(second, 1)
    assert first.parts == 3 and inbox.queued == 2
    with pytest.raises(EngineError) as refused:
        inbox.submit(Job(), 1)
    assert refused.value.code == "queue_full"
    taken = []
    assert inbox.take(taken.append, block=False)
    assert taken == [first, second] and inbox.queued == 2  # queued until admitted
    inbox.dequeued()
    inbox.submit(Job(), 1)


def test_reads_and_jobs_are_drained_apart_and_close_stops_the_thread():
    async def scenario():
        inbox = Inbox(max_queued=4)
        job = Job()
        read = inbox.call(lambda ctx: "read")
        inbox.submit(job, 1)
        taken = []
        assert inbox.take(taken.append, block=False)
        assert taken == [job] and len(inbox.reads) == 1
        inbox.close()
        assert not inbox.take(taken.append, block=True)
        assert inbox.reads[0].run(None)  # the thread runs it; the caller gets its result
        return await read

    assert asyncio.run(scenario()) == "read"


def test_a_dead_thread_refuses_work_and_answers_what_never_ran():
    async def scenario():
        inbox = Inbox(max_queued=4)
        queued, running_read = Job(), inbox.call(lambda ctx: "never")
        inbox.take(lambda job: None, block=False)  # the read is under way
        waiting_read = inbox.call(lambda ctx: "never")
        inbox.submit(queued, 1)
        inbox.die()
        with pytest.raises(EngineError) as refused:
            inbox.submit(Job(), 1)
        assert refused.value.code == "engine_failure"
        with pytest.raises(EngineError):
            await inbox.call(lambda ctx: "never")
        inbox.answer_unrun()
        assert queued.error.code == "model_busy"
        for read in (running_read, waiting_read):
            with pytest.raises(EngineError) as answered:
                await read
            assert answered.value.code == "model_busy"

    asyncio.run(scenario())
