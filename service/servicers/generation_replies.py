"""What a Generate call sends back: each generation event as a protobuf
response (a stream sends a message an event, in order), and for a caller
reading the answer whole (`coalesce`), every step's output joined into one
message."""

from __future__ import annotations

from collections.abc import AsyncIterator

from millm.v1 import generation_pb2, generation_service_pb2, monitoring_pb2, steering_pb2
from service.generation.compare import Compared, UnsteeredStep
from service.generation.events import (
    ActivationsRead,
    Echoed,
    GenerationFinished,
    GenerationStarted,
    ProbesRead,
)
from service.generation.job import FinishReason, StepOutput, join_steps
from service.steering import plan as runtime
from service.steering import readout
from service.steering.documents import RUNG_LANGUAGE
from service.structured_output import CHOICE, GRAMMAR, REGEX, STRUCTURAL_TAG

_SEED_SCOPES = {
    "request": generation_pb2.SEED_SCOPE_REQUEST,
    "batch-shape": generation_pb2.SEED_SCOPE_BATCH_SHAPE,
    "best-effort": generation_pb2.SEED_SCOPE_BEST_EFFORT,
}
_CONSTRAINTS = {
    "json_object": generation_pb2.OUTPUT_CONSTRAINT_JSON_OBJECT,
    "json_schema": generation_pb2.OUTPUT_CONSTRAINT_JSON_SCHEMA,
    REGEX: generation_pb2.OUTPUT_CONSTRAINT_REGEX,
    CHOICE: generation_pb2.OUTPUT_CONSTRAINT_CHOICE,
    GRAMMAR: generation_pb2.OUTPUT_CONSTRAINT_GRAMMAR,
    STRUCTURAL_TAG: generation_pb2.OUTPUT_CONSTRAINT_STRUCTURAL_TAG,
}
_FINISH = {
    None: generation_pb2.FINISH_REASON_UNSPECIFIED,
    FinishReason.STOP: generation_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: generation_pb2.FINISH_REASON_LENGTH,
    FinishReason.CONTENT_FILTER: generation_pb2.FINISH_REASON_CONTENT_FILTER,
    FinishReason.TOOL_CALLS: generation_pb2.FINISH_REASON_TOOL_CALLS,
}
_READ_POINTS_PB = {
    runtime.POST_STEERING: steering_pb2.READ_POINT_POST_STEERING,
    runtime.PRE_STEERING: steering_pb2.READ_POINT_PRE_STEERING,
    runtime.UNSTEERED: steering_pb2.READ_POINT_UNSTEERED,
}


def activations_to_pb(result: readout.ActivationResult) -> steering_pb2.SaeActivations:
    return steering_pb2.SaeActivations(
        sae_id=result.sae_id, layer=result.layer, read_point=_READ_POINTS_PB[result.read_point],
        note=result.note,
        positions=[steering_pb2.PositionActivations(
            position=position, token_id=token_id,
            features=[steering_pb2.FeatureActivation(index=i, value=v) for i, v in features])
            for position, token_id, features in result.positions])


def verdicts_to_pb(verdicts) -> monitoring_pb2.ProbeVerdicts:
    out = monitoring_pb2.ProbeVerdicts()
    for v in verdicts:
        pb = out.verdicts.add(probe=v.probe, sae_id=v.sae_id, layer=v.layer, fired=v.fired,
                              peak=v.peak, positions_read=v.positions_read,
                              threshold=v.threshold)
        if v.first_position is not None:
            pb.first_position = v.first_position
    return out


def _logprob_to_pb(t) -> generation_pb2.TokenLogprob:
    out = generation_pb2.TokenLogprob(token_id=t.token_id, text=t.text, bytes=t.bytes)
    if t.logprob is not None:
        out.logprob = t.logprob
    return out


def score_to_pb(score) -> generation_pb2.TokenScore:
    return generation_pb2.TokenScore(token=_logprob_to_pb(score.token),
                                     top=[_logprob_to_pb(t) for t in score.top])


def _deltas(step: StepOutput) -> list[generation_pb2.ChoiceDelta]:
    return [_delta(d) for d in step.deltas]


def _delta(d) -> generation_pb2.ChoiceDelta:
    # Only the fields a delta has: most stream deltas are a text and its
    # tokens, built once a step a request.
    out = generation_pb2.ChoiceDelta(index=d.index, text=d.text, token_ids=d.token_ids)
    if d.finish_reason is not None:
        out.finish_reason = _FINISH[d.finish_reason]
    if d.logprobs:
        out.logprobs.extend([score_to_pb(x) for x in d.logprobs])
    if d.tool_calls:
        out.tool_calls.extend([generation_pb2.ToolCallDelta(
            index=f.index, id=f.id, name=f.name, arguments=f.arguments) for f in d.tool_calls])
    if d.stop_sequence:
        out.stop_sequence = d.stop_sequence
    if d.reasoning:
        out.reasoning = d.reasoning
    return out


def _usage(event: GenerationFinished) -> generation_pb2.Usage:
    return generation_pb2.Usage(
        prompt_tokens=event.prompt_tokens,
        completion_tokens=event.completion_tokens,
        total_tokens=event.prompt_tokens + event.completion_tokens,
        cached_tokens=event.cached_tokens,
        reasoning_tokens=event.reasoning_tokens,
    )


def event_to_pb(event) -> generation_service_pb2.GenerateResponse:
    if type(event) is StepOutput:  # once a step a request: first
        return generation_service_pb2.GenerateResponse(choices=_deltas(event))
    if isinstance(event, GenerationStarted):
        metadata = generation_pb2.ResponseMetadata(
            id=event.id,
            created=event.created,
            model=event.model,
            system_fingerprint=event.system_fingerprint,
            prompt_tokens=event.prompt_tokens,
            ignored_fields=event.ignored_fields,
        )
        if event.constraint is not None:
            metadata.constraint = _CONSTRAINTS[event.constraint.kind]
            metadata.constraint_name = event.constraint.name
        if event.seed is not None:
            metadata.seed = event.seed
            metadata.seed_scope = _SEED_SCOPES[event.seed_scope]
        if event.steering_echo is not None:
            metadata.steering_intensity = event.steering_echo
        if event.circuit_rung is not None:
            metadata.circuit_rung.rung = event.circuit_rung
            metadata.circuit_rung.language = RUNG_LANGUAGE[event.circuit_rung]
        metadata.unsteered = event.unsteered
        if event.max_tokens_cap is not None:
            asked, applied = event.max_tokens_cap
            metadata.max_tokens_cap.requested, metadata.max_tokens_cap.applied = asked, applied
        return generation_service_pb2.GenerateResponse(metadata=metadata)
    if isinstance(event, ActivationsRead):
        return generation_service_pb2.GenerateResponse(
            sae_activations=activations_to_pb(event.result))
    if isinstance(event, ProbesRead):
        return generation_service_pb2.GenerateResponse(
            probe_verdicts=verdicts_to_pb(event.verdicts))
    if isinstance(event, StepOutput):
        return generation_service_pb2.GenerateResponse(choices=_deltas(event))
    if isinstance(event, UnsteeredStep):
        return generation_service_pb2.GenerateResponse(unsteered_choices=_deltas(event.step))
    if isinstance(event, Compared):
        return generation_service_pb2.GenerateResponse(comparison=generation_pb2.SteeringComparison(
            choices=[generation_pb2.ChoiceDivergence(index=index, tokens=[
                generation_pb2.TokenDivergence(
                    token_id=s.token_id, token=s.text, logprob=s.logprob,
                    unsteered_logprob=s.unsteered_logprob, kl=s.kl) for s in steps])
                for index, steps in event.choices],
            unsteered_usage=_usage(event.unsteered)))
    if isinstance(event, Echoed):
        return generation_service_pb2.GenerateResponse(echoed=[
            generation_pb2.EchoedPrompt(prompt_index=p.index, text=p.text,
                                        tokens=[score_to_pb(x) for x in p.scores])
            for p in event.prompts])
    if isinstance(event, GenerationFinished):
        return generation_service_pb2.GenerateResponse(usage=_usage(event))
    raise TypeError(f"unknown generation event {event!r}")


async def spaced(events, interval: int) -> AsyncIterator[generation_service_pb2.GenerateResponse]:
    """A stream of fewer, larger messages (GenerateRequest.stream_interval):
    the first step's tokens at once, then one message each time some choice
    has `interval` tokens held (and whatever is held before any other
    message, and at the end). Steering_compare's unsteered steps are held
    and joined the same way, each side counted on its own."""
    held: dict[str, list] = {"steps": [], "twin": []}
    counts: dict[str, dict[int, int]] = {"steps": {}, "twin": {}}
    first = True

    def flush(side: str):
        steps, held[side], counts[side] = held[side], [], {}
        joined = join_steps(steps)
        return event_to_pb(joined if side == "steps" else UnsteeredStep(joined))

    async for event in events:
        side = ("steps" if isinstance(event, StepOutput)
                else "twin" if isinstance(event, UnsteeredStep) else None)
        if side is None:
            for name in ("steps", "twin"):
                if held[name]:
                    yield flush(name)
            yield event_to_pb(event)
            continue
        step = event if side == "steps" else event.step
        if first and side == "steps":
            first = False
            yield event_to_pb(event)
            continue
        held[side].append(step)
        tally = counts[side]
        for d in step.deltas:
            tally[d.index] = tally.get(d.index, 0) + max(1, len(d.token_ids))
        if max(tally.values(), default=0) >= interval:
            yield flush(side)
    for name in ("steps", "twin"):
        if held[name]:
            yield flush(name)


async def coalesced(events) -> AsyncIterator[generation_service_pb2.GenerateResponse]:
    """For a caller that reads the answer whole: every step's output in one
    message (no per-token encoding, writes or reads on either side); the
    metadata before it and the rest after it, each alone as in a stream."""
    steps: list[StepOutput] = []
    twin: list[StepOutput] = []  # steering_compare's unsteered steps
    async for event in events:
        if isinstance(event, StepOutput):
            steps.append(event)
            continue
        if isinstance(event, UnsteeredStep):
            twin.append(event.step)
            continue
        if steps:
            yield event_to_pb(join_steps(steps))
            steps = []
        if twin:
            yield event_to_pb(UnsteeredStep(join_steps(twin)))
            twin = []
        yield event_to_pb(event)
    if steps:
        yield event_to_pb(join_steps(steps))
    if twin:
        yield event_to_pb(UnsteeredStep(join_steps(twin)))
