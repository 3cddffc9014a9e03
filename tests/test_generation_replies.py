"""How a Generate call's events become messages (servicers/generation_replies.py):
in a stream, a message an event (event_to_pb), the metadata alone; for a caller that
reads the answer whole (`coalesce`), the metadata, then every step's output
joined into one message, then the usage, each alone."""

from __future__ import annotations

import asyncio

from service.generation.events import (
    Echoed,
    EchoedPrompt,
    GenerationFinished,
    GenerationStarted,
)
from service.generation.job import ChoiceDelta, StepOutput
from service.servicers.generation_replies import coalesced, event_to_pb


def _started() -> GenerationStarted:
    return GenerationStarted(id="g1", created=1, model="m", system_fingerprint="fp",
                             seed=None, seed_scope=None, prompt_tokens=3)


def _step(text: str, token: int) -> StepOutput:
    return StepOutput((ChoiceDelta(0, text, (token,)),))


async def _events(*events):
    for event in events:
        yield event


def _shapes(stream) -> tuple[list[list[str]], list]:
    async def collect():
        return [m async for m in stream]
    messages = asyncio.run(collect())
    return [[field.name for field, _ in m.ListFields()] for m in messages], messages


async def _each(events):
    async for event in events:
        yield event_to_pb(event)


def test_a_stream_is_a_message_an_event_with_the_metadata_alone_first():
    shapes, messages = _shapes(_each(_events(
        _started(), _step("a", 5), _step("b", 6), GenerationFinished(3, 2, 0))))
    assert shapes == [["metadata"], ["choices"], ["choices"], ["usage"]]
    assert messages[0].metadata.id == "g1" and messages[2].choices[0].text == "b"


def test_a_coalesced_answer_joins_the_steps_between_the_metadata_and_the_usage():
    shapes, messages = _shapes(coalesced(_events(
        _started(), _step("a", 5), _step("b", 6), GenerationFinished(3, 2, 0))))
    assert shapes == [["metadata"], ["choices"], ["usage"]]
    assert messages[1].choices[0].text == "ab"
    assert list(messages[1].choices[0].token_ids) == [5, 6]
    assert messages[2].usage.completion_tokens == 2
    echoed = Echoed((EchoedPrompt(0, "The river", ()),))
    shapes, _ = _shapes(coalesced(_events(_started(), echoed, _step("a", 5))))
    assert shapes == [["metadata"], ["echoed"], ["choices"]]  # steps with nothing after them
