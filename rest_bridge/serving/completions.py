"""POST /v1/completions: raw prompts, no chat template."""

from __future__ import annotations

from millm.v1 import generation_pb2, generation_service_pb2
from rest_bridge.protocol.completions import CompletionRequest
from rest_bridge.serving.generation import GenerationHandler, sampling_to_pb


def _prompts(prompt) -> list[generation_pb2.Prompt]:
    if isinstance(prompt, str):
        return [generation_pb2.Prompt(text=prompt)]
    if prompt and all(isinstance(p, int) for p in prompt):
        return [generation_pb2.Prompt(token_ids=generation_pb2.TokenIds(ids=prompt))]
    return [
        generation_pb2.Prompt(text=p)
        if isinstance(p, str)
        else generation_pb2.Prompt(token_ids=generation_pb2.TokenIds(ids=p))
        for p in prompt
    ]


class CompletionHandler(GenerationHandler):
    id_prefix = "cmpl-"
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def to_pb(self, request: CompletionRequest) -> generation_service_pb2.GenerateRequest:
        return generation_service_pb2.GenerateRequest(
            model=request.model,
            prompt=generation_pb2.PromptInput(
                prompts=_prompts(request.prompt),
                parse_special_tokens=bool(request.parse_special_tokens)),
            sampling=sampling_to_pb(request),
        )

    def choice_count(self, request: CompletionRequest) -> int:
        return len(_prompts(request.prompt)) * (request.n or 1)

    def final_choice(self, index: int, text: str, finish: str | None) -> dict:
        return {"index": index, "text": text, "logprobs": None, "finish_reason": finish}

    def opening_choices(self, count: int) -> list[dict]:
        return []

    def delta_choice(self, index: int, text: str, finish: str | None) -> dict:
        return self.final_choice(index, text, finish)
