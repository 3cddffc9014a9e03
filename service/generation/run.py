"""A prepared generation: its validated value and the model lease it holds.

`InferenceService.generation(params)` validates a request and yields one of
these; leaving the `async with` block ends the lease, whatever happened, so a
model change waits for exactly the requests still running. `events()` runs
it: reading passes first when the request scores or echoes (a ModelCall on
the model thread, between decode steps), then the job in the engine's batch.
Closing the event iterator early cancels the job in the model thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from service.errors import model_busy
from service.generation.events import (
    ActivationsRead,
    Echoed,
    EchoedPrompt,
    GenerationFinished,
    GenerationStarted,
    ProbesRead,
)
from service.generation.job import ChoiceDelta, FinishReason, GenerationJob, StepOutput
from service.generation.stages import Stages
from service.models.lifecycle import Lease
from service.request_metrics import RequestTimer
from service.requests.generation import ValidatedGeneration
from service.steering import readout
from service.steering.plan import UNSTEERED as UNSTEERED_READ
from service.steering.recording import ActivationRecorder

Event = (GenerationStarted | Echoed | StepOutput | GenerationFinished | ProbesRead
         | ActivationsRead)


class Generation:
    def __init__(self, spec: ValidatedGeneration, lease: Lease,
                 timer: RequestTimer | None = None, monitoring=None):
        self.spec, self.lease = spec, lease
        self.timer = timer  # the serving metrics' record of this request
        self.monitoring = monitoring  # steering.monitoring.MonitoringManager
        # The task a stalled reader's job cancels (default: the one running events()).
        self.owner: asyncio.Task | None = None

    def started(self) -> GenerationStarted:
        spec, info = self.spec, self.lease.info
        return GenerationStarted(
            id=spec.request_id,
            created=int(time.time()),
            model=info.id,
            system_fingerprint=info.system_fingerprint,
            seed=spec.seed,
            # Seeded groups run in a lane of their own (engines/transformers/scheduler.py).
            seed_scope="request" if spec.seed is not None else None,
            prompt_tokens=spec.prompt_tokens,
            ignored_fields=spec.ignored_fields,
            constraint=spec.constraint,
            steering_echo=spec.steering_echo,
            circuit_rung=spec.circuit_rung,
            unsteered=spec.scoring,
            max_tokens_cap=spec.max_tokens_cap,
        )

    async def events(self) -> AsyncIterator[Event]:
        spec = self.spec
        if spec.scoring or spec.echo:
            async for event in self._reading():
                yield event
            if spec.scoring or spec.groups[0].max_tokens == 0:
                return
        if self.lease.released:  # a forced unload ended it: its engine is gone
            raise model_busy("The model was unloaded before this request ran; retry.")
        job = GenerationJob(spec=spec, loop=asyncio.get_running_loop(),
                            owner=self.owner or asyncio.current_task())
        self.lease.jobs.append(job)  # ended by a forced unload (models/lifecycle.py)
        # Submitting first means a full queue is refused before the stream opens.
        submitted = time.monotonic()
        self.lease.engine.submit(job)
        timer, queued = self.timer, False
        # A single-choice generation whose monitoring keeps feature contexts
        # hands its token ids over when it ends (steering/traffic_contexts.py).
        ids = None
        if (job.monitor is not None and job.monitor.spec.contexts and len(spec.groups) == 1
                and spec.groups[0].n == 1):
            ids = list(spec.groups[0].prompt_ids)
        try:
            if not spec.echo:
                yield self.started()
            stages = Stages(spec)
            async for piled in job.piles():
                step = stages.pile(piled)
                if timer is not None:
                    if not queued and job.admitted_at:
                        timer.queued(job.admitted_at - submitted)
                        queued = True
                    tokens = max((len(d.token_ids) for d in step.deltas), default=0)
                    if spec.whole:  # posted once, timed by the model thread
                        timer.held(tokens, job.held_first_at, job.held_last_at)
                    else:
                        timer.step(tokens)
                if ids is not None:
                    for d in step.deltas:
                        ids.extend(d.token_ids)
                yield step
        finally:
            # Closed before or between events: the model thread drops the job.
            job.cancelled.set()
            if timer is not None:
                timer.flush()  # the steps it timed count, however it ended
        if timer is not None:
            timer.finished(spec.prompt_tokens, job.cached_tokens)
        yield GenerationFinished(spec.prompt_tokens, job.completion_tokens, job.cached_tokens,
                                 stages.reasoning_tokens)
        if job.monitor is not None and self.monitoring is not None:
            # (Contexts show special tokens written out, as /detokenize does.)
            yield ProbesRead(self.monitoring.record(job.monitor, ids,
                                                    self.lease.engine.detokenize))
        if spec.activations is not None:
            yield ActivationsRead(readout.result(spec.activations, job.recorder))

    async def _score(self, next_token: bool, recorder: ActivationRecorder | None) -> list:
        spec = self.spec
        return await self.lease.engine.score(
            [list(g.prompt_ids) for g in spec.groups], temperature=spec.options.temperature,
            allowed=list(spec.allowed_token_ids) if spec.allowed_token_ids else None,
            top=spec.logprobs or 0, echo=spec.echo, next_token=next_token,
            # Scoring is never steered; an echo is read as its completion is generated.
            plan=None if spec.scoring else spec.steering, recorder=recorder)

    async def _reading(self) -> AsyncIterator[Event]:
        """Scoring mode (the answer is the most probable allowed token, from one
        forward pass) and echo (the prompt back, with its log-probabilities)."""
        spec = self.spec
        yield self.started()
        scored = None
        recorder = None
        if spec.activations is not None:  # scoring: readout is refused with echo
            recorder = ActivationRecorder(spec.activations, len(spec.groups[0].prompt_ids))
        if spec.scoring or spec.logprobs is not None:
            scored = await self._score(spec.scoring, recorder)
        if spec.echo:
            yield Echoed(tuple(
                EchoedPrompt(i, spec.prompt_texts[i], scored[i].prompt_tokens if scored else ())
                for i in range(len(spec.groups))))
        if spec.scoring:
            yield StepOutput(tuple(
                ChoiceDelta(g.first_index, s.next.token.text, (s.next.token.token_id,),
                            FinishReason.LENGTH, (s.next,))
                for g, s in zip(spec.groups, scored, strict=True)))
            yield GenerationFinished(spec.prompt_tokens, len(spec.groups), 0)
            if recorder is not None:
                yield ActivationsRead(readout.result(spec.activations, recorder, UNSTEERED_READ))
        elif spec.groups[0].max_tokens == 0:
            # Echo alone: every choice is its prompt, with nothing generated.
            yield StepOutput(tuple(ChoiceDelta(g.first_index + j, "", (), FinishReason.LENGTH)
                                   for g in spec.groups for j in range(g.n)))
            yield GenerationFinished(spec.prompt_tokens, 0, 0)
