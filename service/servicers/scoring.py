"""millm.v1.ScoringService: the scoring mode of generation, as its own RPC."""

from __future__ import annotations

from millm.v1 import scoring_service_pb2, scoring_service_pb2_grpc
from service.generation.events import GenerationFinished, GenerationStarted
from service.generation.job import StepOutput
from service.inference import InferenceService
from service.requests.params import GenerateParams
from service.servicers.error_handling import unary_errors
from service.servicers.generation import add_special_from_pb, prompt_from_pb, turns_from_pb
from service.servicers.generation_replies import score_to_pb


def params_from_pb(request: scoring_service_pb2.ScoreRequest) -> GenerateParams:
    which = request.WhichOneof("input")
    messages = turns_from_pb(request.chat) if which == "chat" else None
    prompts = (tuple(prompt_from_pb(p) for p in request.prompt.prompts)
               if which == "prompt" else None)
    add_special = add_special_from_pb(request.prompt) if which == "prompt" else None
    return GenerateParams(
        model=request.model,
        messages=messages,
        prompts=prompts,
        extra_chats=tuple(turns_from_pb(c) for c in request.extra_chats),
        temperature=request.temperature if request.HasField("temperature") else None,
        # Scoring mode is generation's max_tokens 1 with log-probabilities.
        max_tokens=1,
        logprobs=request.top_logprobs,
        allowed_token_ids=tuple(request.allowed_token_ids),
        parse_special_tokens=which == "prompt" and request.prompt.parse_special_tokens,
        add_special_tokens=add_special,
        request_id=request.request_id,
    )


class ScoringServicer(scoring_service_pb2_grpc.ScoringServiceServicer):
    def __init__(self, inference: InferenceService):
        self._inference = inference

    @unary_errors
    async def Score(self, request, context):
        reply = scoring_service_pb2.ScoreResponse()
        async with self._inference.generation(params_from_pb(request)) as generation:
            groups = generation.spec.groups
            async for event in generation.events():
                if isinstance(event, GenerationStarted):
                    reply.model = event.model
                    reply.system_fingerprint = event.system_fingerprint
                elif isinstance(event, StepOutput):
                    for delta, group in zip(event.deltas, groups, strict=True):
                        reply.choices.append(scoring_service_pb2.ScoredChoice(
                            index=len(reply.choices), next=score_to_pb(delta.logprobs[0]),
                            prompt_tokens=len(group.prompt_ids)))
                elif isinstance(event, GenerationFinished):
                    reply.prompt_tokens = event.prompt_tokens
        return reply


