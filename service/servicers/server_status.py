"""millm.v1.ServerService."""

from __future__ import annotations

import dataclasses
import importlib.metadata

from millm.v1 import generation_pb2, server_service_pb2, server_service_pb2_grpc
from service import field_policy
from service.inference import InferenceService
from service.servicers.error_handling import unary_errors
from service.validation import MAX_LOGPROBS

_LIBRARIES = {"millm": "millm", "torch": "torch", "transformers": "transformers",
              "xgrammar": "xgrammar", "grpcio": "grpcio", "llama_cpp": "llama_cpp_python"}


def _versions() -> dict[str, str]:
    found = {}
    for label, dist in _LIBRARIES.items():
        try:
            found[label] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[label] = "unrecorded"
    return found


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
    async def GetCapabilities(self, request, context):
        loaded = self._inference.loaded
        reply = server_service_pb2.GetCapabilitiesResponse(versions=_versions())
        if loaded is None:
            return reply
        status = self._inference.status()
        reply.model, reply.engine = loaded.id, loaded.engine
        reply.context_window, reply.vocab_size = loaded.context_window, loaded.vocab_size
        reply.system_fingerprint = loaded.system_fingerprint
        on_transformers = loaded.engine == field_policy.TRANSFORMERS
        # GGUF scores and embeds too (engines/gguf_engine.py), but serves no
        # generation logprobs and cannot be steered.
        scores = on_transformers or loaded.engine == field_policy.GGUF
        steering = self._inference.steering
        can_steer = steering is not None and getattr(self._inference.engine, "can_steer", False)
        reply.features.CopyFrom(server_service_pb2.Features(
            scoring=scores, logprobs=on_transformers, max_logprobs=MAX_LOGPROBS,
            structured_output=on_transformers, embeddings=scores, steering=can_steer,
            attached_saes=sorted(steering.attached) if can_steer else (),
            seed_scope=generation_pb2.SEED_SCOPE_REQUEST,
            max_batch=status.max_batch if status else 0))
        for name, route, honoured, code, why in field_policy.support_table(loaded.engine):
            reply.fields.append(server_service_pb2.FieldSupport(
                field=name, route=route, honoured=honoured, refusal_code=code, reason=why))
        return reply

    @unary_errors
    async def ClearPrefixCache(self, request, context):
        freed = await self._inference.clear_prefix_cache()
        return server_service_pb2.ClearPrefixCacheResponse(tokens_freed=freed)
