"""millm.v1.ServerService."""

from __future__ import annotations

import dataclasses
import importlib.metadata

from millm.v1 import generation_pb2, server_service_pb2, server_service_pb2_grpc
from service.inference import InferenceService
from service.requests import fields
from service.requests.checks import MAX_LOGPROBS
from service.servicers.error_handling import unary_errors
from service.servicers.load_reports import LoadReporter

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
    def __init__(self, inference: InferenceService, drain=None, replica_id: str | None = None):
        self._inference = inference
        self._load = LoadReporter(inference, drain, replica_id)

    async def WatchLoad(self, request, context):
        await self._load.watch(request, context)

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
        kind, caps = self._inference.capabilities()
        steering = self._inference.steering
        can_steer = steering is not None and caps.steer
        reply.features.CopyFrom(server_service_pb2.Features(
            scoring=caps.scoring, logprobs=caps.generation_logprobs, max_logprobs=MAX_LOGPROBS,
            structured_output=caps.grammar, embeddings=caps.embeddings, steering=can_steer,
            attached_saes=sorted(steering.attached) if can_steer else (),
            seed_scope=generation_pb2.SEED_SCOPE_REQUEST,
            max_batch=status.max_batch if status else 0, tokenization=True))
        for name, route, cell in fields.support_table(kind, caps):
            reply.fields.append(server_service_pb2.FieldSupport(
                field=name, route=route, honoured=cell.treatment is fields.Treatment.HONOURED,
                reported=cell.treatment is fields.Treatment.REPORTED, refusal_code=cell.code,
                reason=cell.reason))
        return reply

    @unary_errors
    async def ClearPrefixCache(self, request, context):
        freed = await self._inference.clear_prefix_cache()
        return server_service_pb2.ClearPrefixCacheResponse(tokens_freed=freed)
