"""GET /v1/models and GET /v1/models/{id}."""

from __future__ import annotations

import grpc

from millm.v1 import model_pb2, model_service_pb2
from rest_bridge.access import call_metadata
from rest_bridge.engine_client import EngineClient
from rest_bridge.errors import from_rpc_error

# OpenAI lists what can be served: models on disk, loading or loaded.
_LISTED = (model_pb2.MODEL_STATE_READY, model_pb2.MODEL_STATE_LOADING, model_pb2.MODEL_STATE_LOADED)


def model_json(model: model_pb2.Model) -> dict:
    return {"id": model.id, "object": "model", "created": model.created, "owned_by": model.owned_by}


class ModelsHandler:
    def __init__(self, engine: EngineClient):
        self.engine = engine

    async def list(self) -> dict:
        try:
            reply = await self.engine.models.ListModels(model_service_pb2.ListModelsRequest(),
                                                        metadata=call_metadata.get())
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        return {
            "object": "list",
            "data": [model_json(m) for m in reply.models if m.state in _LISTED],
        }

    async def get(self, model_id: str) -> dict:
        try:
            reply = await self.engine.models.GetModel(
                model_service_pb2.GetModelRequest(id=model_id), metadata=call_metadata.get()
            )
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        return model_json(reply.model)
