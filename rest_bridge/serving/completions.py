"""POST /v1/completions: raw prompts, no chat template."""

from __future__ import annotations

from millm.v1 import generation_pb2, generation_service_pb2
from rest_bridge.protocol.completions import CompletionRequest
from rest_bridge.serving.generation import GenerationHandler
from rest_bridge.serving.logprobs import CompletionLogprobs, merge_blocks
from rest_bridge.serving.request_fields import sampling_to_pb


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
        prompt = generation_pb2.PromptInput(
            prompts=_prompts(request.prompt),
            parse_special_tokens=bool(request.parse_special_tokens),
            echo=bool(request.echo))
        if request.add_special_tokens is not None:
            prompt.add_special_tokens = request.add_special_tokens
        pb = generation_service_pb2.GenerateRequest(
            model=request.model, prompt=prompt, sampling=sampling_to_pb(request))
        if request.logprobs is not None:
            pb.sampling.logprobs = request.logprobs
        return pb

    def choice_count(self, request: CompletionRequest) -> int:
        return len(_prompts(request.prompt)) * (request.n or 1)

    # Choice index i * n + j answers prompt i; with echo its text and
    # log-probabilities start with that prompt's.

    def _echoed(self, reply, index: int) -> generation_pb2.EchoedPrompt | None:
        if not reply.request.echo:
            return None
        return reply.echoed.get(index // (reply.request.n or 1))

    def _shaper(self, reply, index: int) -> CompletionLogprobs:
        shapers = reply.state.setdefault("logprobs", {})
        if index not in shapers:
            echoed = self._echoed(reply, index)
            token_ids = bool(reply.request.return_tokens_as_token_ids)
            if echoed is not None:
                shapers[index] = CompletionLogprobs(token_ids)
            else:
                shapers[index] = CompletionLogprobs(token_ids, self._prompt_chars(reply, index))
        return shapers[index]

    def _prompt_chars(self, reply, index: int) -> int:
        # Without echo, the first generated token sits after the prompt.
        prompts = _prompts(reply.request.prompt)
        prompt = prompts[index // (reply.request.n or 1)]
        return len(prompt.text) if prompt.WhichOneof("kind") == "text" else 0

    def _logprobs(self, reply, index: int, scores: list, with_echo: bool) -> dict | None:
        if reply.request.logprobs is None:
            return None
        shaper = self._shaper(reply, index)
        echoed = self._echoed(reply, index) if with_echo else None
        block = shaper.block(list(echoed.tokens)) if echoed is not None else None
        return merge_blocks(block, shaper.block(scores))

    def final_choice(self, reply, index: int, text: str, finish: str | None,
                     scores: list) -> dict:
        echoed = self._echoed(reply, index)
        return {"index": index, "text": (echoed.text if echoed else "") + text,
                "logprobs": self._logprobs(reply, index, scores, with_echo=True),
                "finish_reason": finish}

    def opening_choices(self, reply, count: int) -> list[dict]:
        if not reply.request.echo:
            return []
        # The echoed prompts come first, before anything generated.
        return [{"index": i, "text": self._echoed(reply, i).text,
                 "logprobs": self._logprobs(reply, i, [], with_echo=True),
                 "finish_reason": None}
                for i in range(count) if self._echoed(reply, i) is not None]

    def delta_choice(self, reply, index: int, text: str, finish: str | None,
                     scores: list) -> dict:
        return {"index": index, "text": text,
                "logprobs": (self._logprobs(reply, index, scores, with_echo=False)
                             if scores else None),
                "finish_reason": finish}
