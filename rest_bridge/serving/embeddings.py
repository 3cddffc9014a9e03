"""POST /v1/embeddings."""

from __future__ import annotations

import base64
import struct
import time

import grpc
from fastapi.responses import JSONResponse
from starlette.requests import Request

from millm.v1 import embedding_service_pb2, generation_pb2
from rest_bridge.access import call_metadata, request_id
from rest_bridge.engine_client import EngineClient
from rest_bridge.errors import OpenAIError, from_rpc_error
from rest_bridge.protocol.embeddings import EmbeddingRequest
from rest_bridge.serving import ignored_fields
from rest_bridge.serving.disconnect import unless_disconnected
from rest_bridge.serving.failover import count_retry
from rest_bridge.serving.request_fields import forward_unmapped, strict_mode

ENCODINGS = ("float", "base64")


def _inputs(value) -> list[generation_pb2.Prompt]:
    if isinstance(value, str):
        return [generation_pb2.Prompt(text=value)]
    if value and all(isinstance(v, int) for v in value):
        return [generation_pb2.Prompt(token_ids=generation_pb2.TokenIds(ids=value))]
    return [generation_pb2.Prompt(text=v) if isinstance(v, str)
            else generation_pb2.Prompt(token_ids=generation_pb2.TokenIds(ids=v)) for v in value]


def _encode(values, encoding: str):
    if encoding == "float":
        return list(values)
    # OpenAI's SDK decodes base64 as little-endian float32.
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


class EmbeddingsHandler:
    def __init__(self, engine: EngineClient):
        self.engine = engine

    def request_pb(self, request: EmbeddingRequest,
                   http_request: Request) -> embedding_service_pb2.EmbedRequest:
        if (request.encoding_format or "float") not in ENCODINGS:
            raise OpenAIError(400, "'encoding_format' must be 'float' or 'base64'.",
                              param="encoding_format", code="invalid_parameter")
        pb = embedding_service_pb2.EmbedRequest(model=request.model, request_id=request_id.get(),
                                                inputs=_inputs(request.input),
                                                strict=strict_mode(http_request))
        forward_unmapped(request, pb)
        return pb

    async def handle(self, request: EmbeddingRequest, http_request: Request):
        encoding = request.encoding_format or "float"
        pb = self.request_pb(request, http_request)
        try:
            # A client that leaves cancels the call; the engine stops the read
            # at its next chunk (engines/model_thread.py).
            started = time.time()

            def retried(attempt: int) -> None:
                nonlocal started
                count_retry(http_request.app.state.metrics, "Embed", attempt, started)
                started = time.time()

            reply = await unless_disconnected(http_request, self.engine.embed(
                pb, timeout=http_request.app.state.config.engine_deadline_max_s,
                metadata=call_metadata.get(), on_retry=retried))
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        body = {
            "object": "list",
            "data": [{"object": "embedding", "index": e.index,
                      "embedding": _encode(e.values, encoding)} for e in reply.embeddings],
            "model": reply.model,
            "usage": {"prompt_tokens": reply.prompt_tokens, "total_tokens": reply.prompt_tokens},
        }
        headers = {}
        ignored = ignored_fields.header_value(list(reply.ignored_fields))
        if ignored is not None:
            headers[ignored_fields.HEADER] = ignored
        return JSONResponse(body, headers=headers)
