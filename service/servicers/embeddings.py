"""millm.v1.EmbeddingService."""

from __future__ import annotations

from google.protobuf import json_format

from millm.v1 import embedding_service_pb2, embedding_service_pb2_grpc
from service.errors import invalid_parameter
from service.inference import InferenceService
from service.requests.params import EmbedParams
from service.servicers.error_handling import unary_errors
from service.servicers.generation import prompt_from_pb


def params_from_pb(request: embedding_service_pb2.EmbedRequest) -> EmbedParams:
    try:
        extra = json_format.MessageToDict(request.extra_fields)
    except ValueError as exc:  # NaN or infinity: not JSON
        raise invalid_parameter("extra_fields", f"'extra_fields' must hold JSON: {exc}") from None
    return EmbedParams(
        model=request.model,
        inputs=tuple(prompt_from_pb(p) for p in request.inputs),
        request_id=request.request_id,
        extra_fields=extra,
        unused_fields=tuple(request.unused_fields),
        user=request.user if request.HasField("user") else None,
        strict=request.strict,
    )


class EmbeddingServicer(embedding_service_pb2_grpc.EmbeddingServiceServicer):
    def __init__(self, inference: InferenceService):
        self._inference = inference

    @unary_errors
    async def Embed(self, request, context):
        result = await self._inference.embed(params_from_pb(request))
        return embedding_service_pb2.EmbedResponse(
            embeddings=[embedding_service_pb2.Embedding(index=i, values=v)
                        for i, v in enumerate(result.vectors)],
            prompt_tokens=result.prompt_tokens,
            model=result.model,
            ignored_fields=result.ignored_fields,
        )
