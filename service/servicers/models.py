"""millm.v1.ModelService."""

from __future__ import annotations

from millm.v1 import model_pb2, model_service_pb2, model_service_pb2_grpc
from service.inference import InferenceService, ModelState, ModelView
from service.servicers.error_handling import unary_errors

_STATES = {
    ModelState.READY: model_pb2.MODEL_STATE_READY,
    ModelState.LOADING: model_pb2.MODEL_STATE_LOADING,
    ModelState.LOADED: model_pb2.MODEL_STATE_LOADED,
}


def model_to_pb(view: ModelView) -> model_pb2.Model:
    loaded = view.loaded
    return model_pb2.Model(
        id=view.entry.id,
        created=view.entry.created,
        owned_by=view.entry.owned_by,
        state=_STATES[view.state],
        engine=loaded.engine if loaded else "transformers",
        context_window=loaded.context_window if loaded else 0,
        system_fingerprint=loaded.system_fingerprint if loaded else "",
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
