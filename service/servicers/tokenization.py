"""millm.v1.TokenizationService: the loaded model's tokenizer, through the
same encoders generation uses (InferenceService.tokenize)."""

from __future__ import annotations

from millm.v1 import tokenization_service_pb2, tokenization_service_pb2_grpc
from service.inference import InferenceService
from service.requests.tokenization import DetokenizeParams, TokenizeParams
from service.servicers.error_handling import unary_errors
from service.servicers.generation import function_from_pb, turns_from_pb


def _opt(request, name: str) -> bool | None:
    return getattr(request, name) if request.HasField(name) else None


def params_from_pb(request: tokenization_service_pb2.TokenizeRequest) -> TokenizeParams:
    which = request.WhichOneof("input")
    functions = tuple(function_from_pb(t) for t in request.tools)
    return TokenizeParams(
        model=request.model,
        messages=turns_from_pb(request.chat) if which == "chat" else None,
        prompt=request.prompt if which == "prompt" else None,
        add_generation_prompt=_opt(request, "add_generation_prompt"),
        continue_final_message=_opt(request, "continue_final_message"),
        add_special_tokens=_opt(request, "add_special_tokens"),
        parse_special_tokens=request.parse_special_tokens,
        tools=functions,
        return_token_strs=request.return_token_strs,
        request_id=request.request_id,
    )


class TokenizationServicer(tokenization_service_pb2_grpc.TokenizationServiceServicer):
    def __init__(self, inference: InferenceService):
        self._inference = inference

    @unary_errors
    async def Tokenize(self, request, context):
        result = await self._inference.tokenize(params_from_pb(request))
        return tokenization_service_pb2.TokenizeResponse(
            tokens=result.tokens, count=len(result.tokens), max_model_len=result.max_model_len,
            token_strs=result.token_strs or (), model=result.model)

    @unary_errors
    async def Detokenize(self, request, context):
        text, model = await self._inference.detokenize(DetokenizeParams(
            model=request.model, tokens=tuple(request.tokens), request_id=request.request_id))
        return tokenization_service_pb2.DetokenizeResponse(prompt=text, model=model)
