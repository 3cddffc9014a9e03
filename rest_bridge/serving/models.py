"""GET /v1/models and GET /v1/models/{id} (OpenAI's view, or Anthropic's for
a request that carries anthropic-version), and the management view
/api/models: every model on disk with its state, and load/unload."""

from __future__ import annotations

import datetime

import grpc
from google.protobuf import json_format

from millm.v1 import model_pb2, model_service_pb2
from rest_bridge.access import call_metadata
from rest_bridge.engine_client import EngineClient
from rest_bridge.errors import OpenAIError, from_rpc_error

# OpenAI lists what can be served: models on disk, loading or loaded.
_LISTED = (model_pb2.MODEL_STATE_READY, model_pb2.MODEL_STATE_LOADING, model_pb2.MODEL_STATE_LOADED)
# A model change waits for running requests (up to the graceful unload
# timeout) and then for the load itself.
CHANGE_TIMEOUT_S = 600
READ_TIMEOUT_S = 30


def model_json(model: model_pb2.Model) -> dict:
    return {"id": model.id, "object": "model", "created": model.created, "owned_by": model.owned_by}


def anthropic_model_json(model: model_pb2.Model) -> dict:
    """Anthropic's ModelInfo: the id doubles as the display name."""
    created = datetime.datetime.fromtimestamp(model.created, datetime.UTC)
    return {"type": "model", "id": model.id, "display_name": model.id,
            "created_at": created.isoformat().replace("+00:00", "Z")}


def listed(model: model_pb2.Model) -> bool:
    # A server locked to one model presents only that one.
    return model.state in _LISTED and not model.locked_out


def management_json(model: model_pb2.Model) -> dict:
    out = json_format.MessageToDict(model, preserving_proto_field_name=True,
                                    always_print_fields_with_no_presence=True)
    out["state"] = model_pb2.ModelState.Name(model.state).removeprefix("MODEL_STATE_").lower()
    # Plain JSON numbers (proto's JSON mapping writes int64 as strings).
    for name in ("created", "context_window", "size_bytes"):
        out[name] = getattr(model, name)
    return out


def _not_found(model_id: str) -> OpenAIError:
    return OpenAIError(404, f"The model '{model_id}' does not exist.", param="model",
                       code="model_not_found")


class ModelsHandler:
    def __init__(self, engine: EngineClient):
        self.engine = engine

    async def _all(self) -> list[model_pb2.Model]:
        try:
            reply = await self.engine.models.ListModels(model_service_pb2.ListModelsRequest(),
                                                        timeout=READ_TIMEOUT_S,
                                                        metadata=call_metadata.get())
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        return list(reply.models)

    async def _one(self, model_id: str) -> model_pb2.Model:
        try:
            reply = await self.engine.models.GetModel(
                model_service_pb2.GetModelRequest(id=model_id), timeout=READ_TIMEOUT_S,
                metadata=call_metadata.get())
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        return reply.model

    async def list(self) -> dict:
        return {"object": "list", "data": [model_json(m) for m in await self._all() if listed(m)]}

    async def get(self, model_id: str) -> dict:
        model = await self._one(model_id)
        if model.locked_out:
            raise _not_found(model_id)
        return model_json(model)

    async def anthropic_list(self) -> dict:
        """Anthropic's page shape; every model fits one page."""
        data = [anthropic_model_json(m) for m in await self._all() if listed(m)]
        return {"data": data, "has_more": False, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None}

    async def anthropic_get(self, model_id: str) -> dict:
        model = await self._one(model_id)
        if model.locked_out:
            raise _not_found(model_id)
        return anthropic_model_json(model)

    # -- /api/models -------------------------------------------------------------------

    async def manage_list(self) -> dict:
        return {"object": "list", "data": [management_json(m) for m in await self._all()]}

    async def manage_get(self, model_id: str) -> dict:
        return management_json(await self._one(model_id))

    async def load(self, model_id: str) -> dict:
        try:
            reply = await self.engine.models.LoadModel(
                model_service_pb2.LoadModelRequest(id=model_id), timeout=CHANGE_TIMEOUT_S,
                metadata=call_metadata.get())
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        return management_json(reply.model)

    async def unload(self, model_id: str) -> dict:
        try:
            reply = await self.engine.models.UnloadModel(
                model_service_pb2.UnloadModelRequest(id=model_id), timeout=CHANGE_TIMEOUT_S,
                metadata=call_metadata.get())
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        return management_json(reply.model)
