"""Steered and unsteered side by side in one call (`steering_compare`,
issue 43): Neuronpedia's STEERED and DEFAULT completions, on the engine
that serves the traffic.

The request is validated once; its twin is the same validated generation
with no steering plan at all (and nothing read: no readout, no probes), so
both have the same prompt ids, the same rows and the same row seeds, and
each text is what the separate request would return (a seeded row draws
from its own generator whatever shares its batch). Both run at once as
jobs of their own, two sets of rows in the engine's batch, admitted like any
two requests. Their outputs are merged into one event stream: the steered
steps as usual, the twin's as `UnsteeredStep`. When both are done, each
steered choice's tokens are read again under both plans (one teacher-forced
pass each, engine.divergence) for their log-probabilities and the KL
divergence of the two next-token distributions at each step: `Compared`,
before the steered usage, probe verdicts and activations.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass

from service.generation.events import GenerationFinished
from service.generation.job import StepOutput

_DONE = object()
# The merged stream holds this many events of each side before its producer
# waits: a reader that stops reading stalls the jobs, whose stall limit ends
# the call as for any request (generation/job.py).
_BUFFER = 8


@dataclass(frozen=True)
class UnsteeredStep:
    """The unsteered twin's step output (its choice indices as the steered ones)."""

    step: StepOutput


@dataclass(frozen=True)
class Compared:
    """Each steered choice's tokens with their divergence, and the twin's usage."""

    choices: tuple  # ((index, (engines.scores.StepDivergence, ...)), ...)
    unsteered: GenerationFinished


def twin(spec):
    """The same validated generation with no steering and nothing read."""
    return dataclasses.replace(spec, request_id=f"{spec.request_id}-unsteered", steering=None,
                               steering_echo=None, circuit_rung=None, activations=None,
                               monitoring=None)


class ComparedGeneration:
    def __init__(self, steered, unsteered):
        self.steered, self.unsteered = steered, unsteered
        self.spec, self.lease = steered.spec, steered.lease

    async def _pump(self, generation, queue: asyncio.Queue) -> None:
        try:
            async for event in generation.events():
                await queue.put(event)
            await queue.put(_DONE)
        except Exception as exc:  # noqa: BLE001 - handed to the reader, which raises it
            await queue.put(exc)

    async def events(self) -> AsyncIterator:
        owner = asyncio.current_task()
        # A stalled reader cancels the jobs' owner: the servicer's task, not a pump.
        self.steered.owner = self.unsteered.owner = owner
        queues = (asyncio.Queue(_BUFFER), asyncio.Queue(_BUFFER))
        pumps = [asyncio.ensure_future(self._pump(g, q))
                 for g, q in zip((self.steered, self.unsteered), queues, strict=True)]
        held, tokens = [], {}
        finished_twin = None
        # The steered side's events wait until the twin has been submitted
        # (its first event), so a full queue refuses the call before it opens.
        early: list | None = []
        waiting = {asyncio.ensure_future(q.get()): side for side, q in enumerate(queues)}

        def steered(event) -> list:
            """What goes out now of a steered event: the finish and what follows
            it wait for the comparison."""
            if isinstance(event, StepOutput):
                for d in event.deltas:
                    tokens.setdefault(d.index, []).extend(d.token_ids)
            elif isinstance(event, GenerationFinished) or held:
                held.append(event)
                return []
            return [event]

        try:
            while waiting:
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    side = waiting.pop(future)
                    event = future.result()
                    if isinstance(event, Exception):
                        raise event
                    if event is _DONE:
                        continue
                    waiting[asyncio.ensure_future(queues[side].get())] = side
                    if side == 1:
                        if early is not None:  # the twin is in the queue: go on
                            for out in [x for e in early for x in steered(e)]:
                                yield out
                            early = None
                        if isinstance(event, StepOutput):
                            yield UnsteeredStep(event)
                        elif isinstance(event, GenerationFinished):
                            finished_twin = event
                        continue
                    if early is not None:
                        early.append(event)
                        continue
                    for out in steered(event):
                        yield out
            yield Compared(await self._divergences(tokens), finished_twin
                           or GenerationFinished(self.spec.prompt_tokens, 0, 0))
            for event in held:
                yield event
        finally:
            for pump in pumps:
                pump.cancel()
            for future in waiting:
                future.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)

    async def _divergences(self, tokens: dict[int, list[int]]) -> tuple:
        out = []
        engine = self.lease.engine
        for group in self.spec.groups:
            for index in range(group.first_index, group.first_index + group.n):
                generated = tokens.get(index, [])
                steps = ()
                if generated:
                    steps = tuple(await engine.divergence(
                        list(group.prompt_ids) + generated, len(group.prompt_ids),
                        self.spec.steering))
                out.append((index, steps))
        return tuple(out)
