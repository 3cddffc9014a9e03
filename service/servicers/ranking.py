"""millm.v1.RankingService: rerank and classify (service/ranking.py)."""

from __future__ import annotations

from millm.v1 import ranking_service_pb2 as pb
from millm.v1 import ranking_service_pb2_grpc
from service.ranking import Ranking
from service.servicers.error_handling import unary_errors


class RankingServicer(ranking_service_pb2_grpc.RankingServiceServicer):
    def __init__(self, ranking: Ranking):
        self._ranking = ranking

    @unary_errors
    async def Rerank(self, request, context):
        ranked = await self._ranking.rerank(
            request.model, request.query, list(request.documents),
            request.top_n if request.HasField("top_n") else None)
        return pb.RerankResponse(
            results=[pb.RerankResult(index=i, relevance_score=s) for i, s in ranked.results],
            prompt_tokens=ranked.prompt_tokens, model=ranked.model)

    @unary_errors
    async def Classify(self, request, context):
        labelled = await self._ranking.classify(request.model, list(request.inputs),
                                                request.probe, list(request.labels))
        return pb.ClassifyResponse(
            data=[pb.Classification(index=d.index, label=d.label, probs=d.probs,
                                    score=d.score, threshold=d.threshold)
                  for d in labelled.data],
            prompt_tokens=labelled.prompt_tokens, model=labelled.model)
