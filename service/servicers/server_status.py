"""millm.v1.ServerService."""

from __future__ import annotations

import dataclasses

from millm.v1 import server_service_pb2, server_service_pb2_grpc
from service.inference import InferenceService
from service.servicers.error_handling import unary_errors


class ServerServicer(server_service_pb2_grpc.ServerServiceServicer):
    def __init__(self, inference: InferenceService):
        self._inference = inference

    @unary_errors
    async def GetInferenceStatus(self, request, context):
        status = self._inference.status()
        response = server_service_pb2.GetInferenceStatusResponse(
            model=self._inference.loaded.id if self._inference.loaded else ""
        )
        if status is not None:
            for name, value in dataclasses.asdict(status).items():
                setattr(response, name, value)
        return response

    @unary_errors
    async def ClearPrefixCache(self, request, context):
        freed = await self._inference.clear_prefix_cache()
        return server_service_pb2.ClearPrefixCacheResponse(tokens_freed=freed)
