"""A Generate stream's first message: the metadata, with the first output when
that is ready within FIRST_OUTPUT_WAIT_S (generation/run.py), so a short
request costs one message less on both sides; a coalesced answer is one
message. The job waits for its first event without losing it or its order
(GenerationJob.output_within), and the servicer merges only what it was told
is ready (servicers/generation_replies.py)."""

from __future__ import annotations

import asyncio
import threading
import time
import types

from service.generation.events import (
    Echoed,
    EchoedPrompt,
    GenerationFinished,
    GenerationStarted,
)
from service.generation.job import ChoiceDelta, GenerationJob, GroupDone, StepOutput
from service.servicers.generation_replies import coalesced, streamed


def _started(ready: bool) -> GenerationStarted:
    return GenerationStarted(id="g1", created=1, model="m", system_fingerprint="fp",
                             seed=None, seed_scope=None, prompt_tokens=3, output_ready=ready)


def _step(text: str, token: int) -> StepOutput:
    return StepOutput((ChoiceDelta(0, text, (token,)),))


async def _events(*events):
    for event in events:
        yield event


def _shapes(messages) -> list[list[str]]:
    return [[field.name for field, _ in m.ListFields()] for m in messages]


async def _collect(stream) -> list:
    return [m async for m in stream]


def test_metadata_rides_with_the_first_output_only_when_it_is_ready():
    finished = GenerationFinished(3, 2, 0)
    ready = asyncio.run(_collect(streamed(_events(
        _started(True), _step("a", 5), _step("b", 6), finished))))
    assert _shapes(ready) == [["metadata", "choices"], ["choices"], ["usage"]]
    assert ready[0].metadata.id == "g1" and ready[0].choices[0].text == "a"
    assert ready[2].usage.completion_tokens == 2
    late = asyncio.run(_collect(streamed(_events(_started(False), _step("a", 5), finished))))
    assert _shapes(late) == [["metadata"], ["choices"], ["usage"]]
    # Nothing after it (a stream cut short): the metadata still goes out.
    alone = asyncio.run(_collect(streamed(_events(_started(True)))))
    assert _shapes(alone) == [["metadata"]]


def test_a_coalesced_answer_is_one_message_and_echoes_come_first():
    finished = GenerationFinished(3, 2, 0)
    whole = asyncio.run(_collect(coalesced(_events(
        _started(False), _step("a", 5), _step("b", 6), finished))))
    assert _shapes(whole) == [["metadata", "choices", "usage"]]
    assert whole[0].choices[0].text == "ab" and list(whole[0].choices[0].token_ids) == [5, 6]
    echoed = Echoed((EchoedPrompt(0, "The river", ()),))
    echo = asyncio.run(_collect(coalesced(_events(_started(False), echoed, _step("a", 5),
                                                   finished))))
    assert _shapes(echo) == [["metadata", "echoed"], ["choices", "usage"]]


def _job(loop) -> GenerationJob:
    spec = types.SimpleNamespace(monitoring=None, request_id="r", groups=[object()])
    return GenerationJob(spec, loop)


def test_output_within_waits_for_the_first_event_and_keeps_it_first():
    async def scenario():
        job = _job(asyncio.get_running_loop())
        threading.Timer(0.01, job.post, args=(_step("a", 5),)).start()
        started = time.monotonic()
        assert await job.output_within(5.0)
        assert time.monotonic() - started < 2.0  # woken by the event, not the timeout
        job.post(_step("b", 6))
        job.post(GroupDone(2))
        return [s async for s in job.events()], job.taken

    steps, taken = asyncio.run(scenario())
    assert [d.text for s in steps for d in s.deltas] == ["a", "b"] and taken == 3


def test_output_within_gives_up_after_its_time_and_loses_nothing():
    async def scenario():
        job = _job(asyncio.get_running_loop())
        started = time.monotonic()
        assert not await job.output_within(0.05)
        waited = time.monotonic() - started
        job.post(_step("a", 5))
        job.post(GroupDone(1))
        return waited, [s async for s in job.events()]

    waited, steps = asyncio.run(scenario())
    assert waited >= 0.05 and [d.text for s in steps for d in s.deltas] == ["a"]
