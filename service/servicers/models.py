"""millm.v1.ModelService: the models on disk and the loaded one."""

from __future__ import annotations

from millm.v1 import model_pb2, model_service_pb2, model_service_pb2_grpc
from service.inference import InferenceService, ModelState, ModelView
from service.servicers.error_handling import unary_errors

_STATES = {
    ModelState.READY: model_pb2.MODEL_STATE_READY,
    ModelState.LOADING: model_pb2.MODEL_STATE_LOADING,
    ModelState.LOADED: model_pb2.MODEL_STATE_LOADED,
    ModelState.UNLOADING: model_pb2.MODEL_STATE_UNLOADING,
    ModelState.FAILED: model_pb2.MODEL_STATE_FAILED,
}


def model_to_pb(view: ModelView) -> model_pb2.Model:
    loaded, entry = view.loaded, view.entry
    return model_pb2.Model(
        id=entry.id,
        created=entry.created,
        owned_by=entry.owned_by,
        state=_STATES[view.state],
        engine=loaded.engine if loaded else entry.engine,
        context_window=loaded.context_window if loaded else 0,
        system_fingerprint=loaded.system_fingerprint if loaded else "",
        repo=entry.repo,
        quantization=entry.quantization,
        size_bytes=entry.size_bytes,
        error=view.error or entry.unsupported,
        locked_out=view.locked_out,
    )


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, inference: InferenceService):
        self._inference = inference

    @unary_errors
    async def ListModels(self, request, context):
        return model_service_pb2.ListModelsResponse(
            models=[model_to_pb(v) for v in self._inference.list_models()]
        )

    @unary_errors
    async def GetModel(self, request, context):
        return model_service_pb2.GetModelResponse(
            model=model_to_pb(self._inference.get_model(request.id))
        )

    @unary_errors
    async def LoadModel(self, request, context):
        info = await self._inference.load(request.id)
        return model_service_pb2.LoadModelResponse(
            model=model_to_pb(self._inference.get_model(info.id)))

    @unary_errors
    async def UnloadModel(self, request, context):
        entry = await self._inference.unload(request.id)
        return model_service_pb2.UnloadModelResponse(
            model=model_to_pb(self._inference.get_model(entry.id)))
