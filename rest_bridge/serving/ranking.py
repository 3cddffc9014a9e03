"""POST /v1/rerank, /rerank, /v1/score and /v1/classify: RankingService's
answers in the shapes vLLM and llama.cpp's server use (rerank: Jina's and
Cohere's). The engine validates and ranks (service/ranking.py); this
translates. Body keys these shapes do not declare are named in
X-miLLM-Ignored-Fields, as the other routes report what they did not use."""

from __future__ import annotations

import time
import uuid

import grpc
from fastapi.responses import JSONResponse
from starlette.requests import Request

from millm.v1 import ranking_service_pb2 as pb
from rest_bridge.access import call_metadata, request_id
from rest_bridge.engine_client import EngineClient
from rest_bridge.errors import OpenAIError, from_rpc_error
from rest_bridge.protocol.ranking import ClassifyRequest, RerankRequest, ScoreRequest
from rest_bridge.serving import ignored_fields
from rest_bridge.serving.disconnect import unless_disconnected

MAX_SCORE_PAIRS = 1024


def _answer(body: dict, request) -> JSONResponse:
    unused = sorted(request.top_level_extras()) + request.nested_unused()
    value = ignored_fields.header_value(unused)
    headers = {ignored_fields.HEADER: value} if value is not None else {}
    return JSONResponse(body, headers=headers)


class RankingHandler:
    def __init__(self, engine: EngineClient):
        self.engine = engine

    async def _call(self, method: str, message, http_request: Request):
        try:
            return await unless_disconnected(http_request, self.engine.unary(
                "ranking", method, message,
                timeout=http_request.app.state.config.engine_deadline_max_s,
                metadata=call_metadata.get()))
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None

    async def rerank(self, request: RerankRequest, http_request: Request):
        texts = [d if isinstance(d, str) else d.text for d in request.documents]
        message = pb.RerankRequest(model=request.model, query=request.query, documents=texts,
                                   request_id=request_id.get())
        if request.top_n is not None:
            message.top_n = request.top_n
        reply = await self._call("Rerank", message, http_request)
        results = []
        for r in reply.results:
            result = {"index": r.index, "relevance_score": r.relevance_score}
            if request.return_documents is not False:
                result["document"] = {"text": texts[r.index]}
            results.append(result)
        return _answer({"id": f"rerank-{uuid.uuid4().hex}", "model": reply.model,
                        "usage": {"prompt_tokens": reply.prompt_tokens,
                                  "total_tokens": reply.prompt_tokens},
                        "results": results}, request)

    async def score(self, request: ScoreRequest, http_request: Request):
        first = [request.text_1] if isinstance(request.text_1, str) else request.text_1
        second = [request.text_2] if isinstance(request.text_2, str) else request.text_2
        for name, texts in (("text_1", first), ("text_2", second)):
            if not texts:
                raise OpenAIError(400, f"'{name}' must hold at least one text.", param=name,
                                  code="invalid_parameter")
        if len(first) == 1:
            pairs = [(first[0], second)]
        elif len(first) == len(second):
            pairs = [(a, [b]) for a, b in zip(first, second, strict=True)]
        else:
            raise OpenAIError(400, "'text_1' must be one text, or as many texts as 'text_2' "
                              f"(paired in order); got {len(first)} and {len(second)}.",
                              param="text_1", code="invalid_parameter")
        if len(pairs) > MAX_SCORE_PAIRS:
            raise OpenAIError(400, f"At most {MAX_SCORE_PAIRS} pairs in one request.",
                              param="text_1", code="invalid_parameter")
        data, tokens, model, offset = [], 0, request.model, 0
        for query, documents in pairs:
            reply = await self._call("Rerank", pb.RerankRequest(
                model=request.model, query=query, documents=documents,
                request_id=request_id.get()), http_request)
            for r in sorted(reply.results, key=lambda r: r.index):
                data.append({"index": offset + r.index, "object": "score",
                             "score": r.relevance_score})
            offset += len(documents)
            tokens += reply.prompt_tokens
            model = reply.model
        return _answer({"id": f"score-{uuid.uuid4().hex}", "object": "list",
                        "created": int(time.time()), "model": model, "data": data,
                        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}, request)

    async def classify(self, request: ClassifyRequest, http_request: Request):
        inputs = [request.input] if isinstance(request.input, str) else request.input
        reply = await self._call("Classify", pb.ClassifyRequest(
            model=request.model, inputs=inputs, probe=request.probe or "",
            labels=request.labels or [], request_id=request_id.get()), http_request)
        data = []
        for d in reply.data:
            item = {"index": d.index, "label": d.label}
            if d.probs:
                item["probs"] = list(d.probs)
                item["num_classes"] = len(d.probs)
            if d.HasField("score"):
                item["score"], item["threshold"] = d.score, d.threshold
            data.append(item)
        return _answer({"id": f"classify-{uuid.uuid4().hex}", "object": "list",
                        "created": int(time.time()), "model": reply.model, "data": data,
                        "usage": {"prompt_tokens": reply.prompt_tokens,
                                  "total_tokens": reply.prompt_tokens}}, request)
