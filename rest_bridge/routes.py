"""HTTP routes. Each one reads the body, calls a handler, and returns its answer;
every failure is an OpenAIError turned into the envelope by the app."""

from __future__ import annotations

import grpc
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from grpc_health.v1 import health_pb2
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.datastructures import URL
from starlette.routing import Match

from millm.v1 import server_service_pb2
from rest_bridge.access import call_metadata
from rest_bridge.errors import OpenAIError, from_rpc_error
from rest_bridge.protocol.base import parse_body
from rest_bridge.protocol.batches import BatchRequest
from rest_bridge.protocol.chat import ChatCompletionRequest
from rest_bridge.protocol.completions import CompletionRequest
from rest_bridge.protocol.embeddings import EmbeddingRequest
from rest_bridge.protocol.messages import CountTokensRequest, MessagesRequest
from rest_bridge.protocol.ranking import ClassifyRequest, RerankRequest, ScoreRequest
from rest_bridge.protocol.responses import ResponsesRequest
from rest_bridge.protocol.tokenize import DetokenizeRequest, TokenizeRequest
from rest_bridge.unserved import is_openai_endpoint

router = APIRouter()


async def read_body(request: Request) -> bytes:
    limit = request.app.state.config.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


def _too_large(limit: int) -> OpenAIError:
    return OpenAIError(413, f"The request body is larger than {limit} bytes.",
                       code="request_too_large")


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    body = parse_body(await read_body(request), ChatCompletionRequest)
    return await request.app.state.chat.handle(body, request)


@router.post("/v1/completions")
async def completions(request: Request):
    body = parse_body(await read_body(request), CompletionRequest)
    return await request.app.state.completions.handle(body, request)


@router.post("/v1/files")
async def upload_file(request: Request):
    return await request.app.state.files.upload(request)


@router.get("/v1/files")
async def list_files(request: Request):
    return await request.app.state.files.list_files(request)


@router.get("/v1/files/{file_id}")
async def get_file(file_id: str, request: Request):
    return await request.app.state.files.get_file(file_id, request)


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, request: Request):
    return await request.app.state.files.content(file_id, request)


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, request: Request):
    return await request.app.state.files.delete_file(file_id, request)


@router.post("/v1/batches")
async def create_batch(request: Request):
    body = parse_body(await read_body(request), BatchRequest)
    return await request.app.state.files.create_batch(body, request)


@router.get("/v1/batches")
async def list_batches(request: Request):
    return await request.app.state.files.list_batches(request)


@router.get("/v1/batches/{batch_id}")
async def get_batch(batch_id: str, request: Request):
    return await request.app.state.files.get_batch(batch_id, request)


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request):
    return await request.app.state.files.cancel_batch(batch_id, request)


@router.post("/v1/rerank")
@router.post("/rerank")
async def rerank(request: Request):
    body = parse_body(await read_body(request), RerankRequest)
    return await request.app.state.ranking.rerank(body, request)


@router.post("/v1/score")
@router.post("/score")
async def score(request: Request):
    body = parse_body(await read_body(request), ScoreRequest)
    return await request.app.state.ranking.score(body, request)


@router.post("/v1/classify")
@router.post("/classify")
async def classify(request: Request):
    body = parse_body(await read_body(request), ClassifyRequest)
    return await request.app.state.ranking.classify(body, request)


@router.post("/v1/embeddings")
async def embeddings(request: Request):
    body = parse_body(await read_body(request), EmbeddingRequest)
    return await request.app.state.embeddings.handle(body, request)


# vLLM serves these at the root, not under /v1; so does llama.cpp's server.
@router.post("/tokenize")
async def tokenize(request: Request):
    body = parse_body(await read_body(request), TokenizeRequest)
    return await request.app.state.tokenize.tokenize(body, request)


@router.post("/detokenize")
async def detokenize(request: Request):
    body = parse_body(await read_body(request), DetokenizeRequest)
    return await request.app.state.tokenize.detokenize(body, request)


@router.post("/v1/responses")
async def create_response(request: Request):
    body = parse_body(await read_body(request), ResponsesRequest)
    return await request.app.state.responses.create(body, request)


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, request: Request):
    return await request.app.state.responses.retrieve(response_id, request.query_params)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request):
    return await request.app.state.responses.delete(response_id)


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(response_id: str, request: Request):
    return await request.app.state.responses.input_items(response_id, request.query_params)


@router.post("/v1/messages")
async def create_message(request: Request):
    """Anthropic's Messages API (serving/messages.py)."""
    body = parse_body(await read_body(request), MessagesRequest)
    return await request.app.state.messages.create(body, request)


@router.post("/v1/messages/count_tokens")
async def count_message_tokens(request: Request):
    body = parse_body(await read_body(request), CountTokensRequest)
    return await request.app.state.messages.count_tokens(body, request)


def anthropic_client(request: Request) -> bool:
    """Anthropic's SDKs send anthropic-version; they get its shapes of /v1/models."""
    return "anthropic-version" in request.headers


@router.get("/v1/models")
async def list_models(request: Request):
    if anthropic_client(request):
        return await request.app.state.models.anthropic_list()
    return await request.app.state.models.list()


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request):
    if anthropic_client(request):
        return await request.app.state.models.anthropic_get(model_id)
    return await request.app.state.models.get(model_id)


@router.get("/api/models")
async def manage_models(request: Request):
    """Every model on disk with its state (ModelService.ListModels; admin)."""
    return await request.app.state.models.manage_list()


@router.get("/api/models/{model_id}")
async def manage_model(model_id: str, request: Request):
    return await request.app.state.models.manage_get(model_id)


@router.post("/api/models/{model_id}/load")
async def load_model(model_id: str, request: Request):
    """Make the model the loaded one (ModelService.LoadModel; admin)."""
    return await request.app.state.models.load(model_id)


@router.post("/api/models/{model_id}/unload")
async def unload_model(model_id: str, request: Request):
    """Unload the loaded model (ModelService.UnloadModel; admin)."""
    return await request.app.state.models.unload(model_id)


@router.get("/healthz")
async def healthz():
    return {"status": "ok"}


# The engines' health entry for their shared state database (not a service).
STATE_STORE_HEALTH = "millm.state_store"


async def _state_store(engine) -> str:
    """Whether the engines' state database is reachable: available,
    unavailable (generation works on the last state; writes answer 503) or
    unknown (an engine without the entry)."""
    try:
        reply = await engine.health.Check(
            health_pb2.HealthCheckRequest(service=STATE_STORE_HEALTH), timeout=1)
    except grpc.aio.AioRpcError:
        return "unknown"
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    return "available" if serving else "unavailable"


@router.get("/readyz")
@router.get("/health")
async def readyz(request: Request):
    """Ready while an engine serves. A state database that is away does not
    make the bridge unready (generation still works); the body says so."""
    if request.app.state.access.draining:
        return JSONResponse({"status": "draining"}, status_code=503,
                            headers={"Retry-After": "1"})
    engine = request.app.state.engine
    if await engine.is_serving():
        return {"status": "ready", "state_store": await _state_store(engine)}
    return JSONResponse({"status": "not_ready", "reason": "no engine is SERVING"},
                        status_code=503, headers={"Retry-After": "1"})


@router.get("/api/health/inference")
async def inference_health(request: Request):
    """What the engine's inference backend is doing (ServerService.GetInferenceStatus)."""
    try:
        reply = await request.app.state.engine.server.GetInferenceStatus(
            server_service_pb2.GetInferenceStatusRequest(), timeout=5,
            metadata=call_metadata.get(),
        )
    except grpc.aio.AioRpcError as exc:
        raise from_rpc_error(exc) from None
    # Plain JSON numbers (proto's JSON mapping would write int64 as strings).
    return {field.name: getattr(reply, field.name) for field in reply.DESCRIPTOR.fields}


@router.get("/api/capabilities")
async def capabilities(request: Request):
    """What the loaded model and engine honour (ServerService.GetCapabilities)."""
    from google.protobuf import json_format

    try:
        reply = await request.app.state.engine.server.GetCapabilities(
            server_service_pb2.GetCapabilitiesRequest(), timeout=10,
            metadata=call_metadata.get())
    except grpc.aio.AioRpcError as exc:
        raise from_rpc_error(exc) from None
    return json_format.MessageToDict(reply, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


@router.post("/api/prefix-cache/clear")
async def clear_prefix_cache(request: Request):
    """Drop the engine's prefix cache (ServerService.ClearPrefixCache; admin)."""
    try:
        reply = await request.app.state.engine.server.ClearPrefixCache(
            server_service_pb2.ClearPrefixCacheRequest(), timeout=30,
            metadata=call_metadata.get())
    except grpc.aio.AioRpcError as exc:
        raise from_rpc_error(exc) from None
    return {"tokens_freed": reply.tokens_freed}


@router.get("/metrics")
async def metrics(request: Request):
    registry = request.app.state.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def not_served(method: str, path: str) -> OpenAIError:
    if is_openai_endpoint(method, path):
        return OpenAIError(
            404, f"{method} {path} is part of the OpenAI API but is not served by miLLM.",
            code="endpoint_not_served",
        )
    return OpenAIError(404, f"Invalid URL ({method} {path}).", code="unknown_url")


def slash_redirect(request: Request) -> RedirectResponse | None:
    """A 307 to the same URL without its trailing slash, when that one is a route.

    Starlette's own redirect (switched off in app.py) works on the decoded path,
    so `/api/clusters/%2F` (a cluster named "/") was sent to the list of
    clusters with an empty body; only a slash the client actually typed
    redirects here, anything else is a 404 in the API's error shape.
    """
    path, raw = request.scope["path"], request.scope.get("raw_path", b"")
    if path == "/" or not path.endswith("/") or not raw.endswith(b"/"):
        return None
    scope = {**request.scope, "path": path.rstrip("/") or "/"}
    if any(route.matches(scope)[0] != Match.NONE for route in request.app.router.routes):
        return RedirectResponse(URL(scope=scope), status_code=307)
    return None
