"""Stages: a reasoning model's steps give the same reasoning, answer and count
of reasoning tokens however a slow reader let them pile up (before, piled
steps were joined first and the block's close and the answer's first words,
in one step, were not counted as reasoning: 7 of 8 under load)."""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace

from service.formats.base import OPEN, THINK
from service.generation.job import ChoiceDelta, GenerationJob, GroupDone, StepOutput
from service.generation.stages import Stages

PIECES = ["Weigh", " it", ".", "\n", "</think>", "\n\n", '{"ok"', ": true}"]


def spec():
    return SimpleNamespace(constraint=None, grammar=None, tools=None,
                           reasoning=SimpleNamespace(syntax=THINK, mode=OPEN))


def steps():
    last = len(PIECES) - 1
    return [StepOutput((ChoiceDelta(0, text, (i,), "stop" if i == last else None),))
            for i, text in enumerate(PIECES)]


def through(cuts: tuple[int, ...]):
    stages, all_steps = Stages(spec()), steps()
    bounds = [0, *cuts, len(all_steps)]
    out = [stages.pile(all_steps[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    reasoning = "".join(d.reasoning for s in out for d in s.deltas)
    text = "".join(d.text for s in out for d in s.deltas)
    return reasoning, text, stages.reasoning_tokens


def test_every_way_of_piling_gives_one_answer_and_one_count():
    alone = through(tuple(range(1, len(PIECES))))
    # Three words, the newline before the close (inside the block), and the close.
    assert alone == ("Weigh it.", '{"ok": true}', 5)
    for k in range(len(PIECES)):
        for cuts in itertools.combinations(range(1, len(PIECES)), k):
            assert through(cuts) == alone, cuts


def test_a_job_hands_over_every_piled_step():
    async def run():
        job = GenerationJob(spec=SimpleNamespace(groups=[None], monitoring=None),
                            loop=asyncio.get_running_loop())
        for step in steps():
            job.queue.put_nowait(step)
        job.queue.put_nowait(GroupDone(8))
        return [len(p) async for p in job.piles()]
    assert asyncio.run(run()) == [len(PIECES)]
