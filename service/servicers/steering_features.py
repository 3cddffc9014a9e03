"""SteeringService's feature workbench RPCs (issue 43): the record, search,
cards and explanations. A mixin of SteeringServicer (servicers/steering.py),
whose state it uses: the manager (`_m`), the records (`_features`), the
explanations (`_explanations`), the description vectors (`_meanings`) and
the inference service (`_inference`)."""

from __future__ import annotations

import asyncio

from millm.v1 import steering_service_pb2 as pb
from service.errors import invalid_parameter, model_not_loaded
from service.servicers.error_handling import unary_errors
from service.steering import cards, explanations, meaning, search
from service.steering.features import check_page


def _tokens(f: dict) -> list[pb.FeatureToken]:
    return [pb.FeatureToken(token=str(t.get("token", "")), count=int(t.get("count", 0)),
                            max=float(t.get("max", 0.0))) for t in f.get("top_tokens", ())]


def _examples(f: dict) -> list[pb.FeatureExample]:
    return [pb.FeatureExample(value=float(e.get("value", 0.0)), token=str(e.get("token", "")),
                              left=str(e.get("left", "")), right=str(e.get("right", "")))
            for e in f.get("examples", ())]


def _feature(f: dict) -> pb.SaeFeature:
    return pb.SaeFeature(index=f["index"], density=float(f.get("density", 0.0)),
                         max_activation=float(f.get("max", 0.0)), top_tokens=_tokens(f),
                         examples=_examples(f))


def _match(m: search.Match) -> pb.FeatureMatch:
    return pb.FeatureMatch(index=m.index, score=m.score)


def _explanation(e: explanations.Explanation) -> pb.FeatureExplanation:
    return pb.FeatureExplanation(text=e.text, source=e.source, updated=e.updated)


class FeatureRpcs:
    @unary_errors
    async def ListSaeFeatures(self, request, context):
        info = self._info(request.sae_id)
        page = await asyncio.to_thread(
            self._features.page, info, request.query, request.offset,
            request.limit if request.HasField("limit") else None)
        return pb.ListSaeFeaturesResponse(
            sae=self._sae(info), recorded=page.recorded, total=page.total,
            tokens_read=page.tokens_read, features=[_feature(f) for f in page.features])

    @unary_errors
    async def SearchSaeFeatures(self, request, context):
        info = self._info(request.sae_id)
        limit = check_page(request.offset,
                                  request.limit if request.HasField("limit") else None)
        which, tokens, strings = request.WhichOneof("by"), [], []
        if which == "query":
            words = search.query_words(request.query)
            document = await asyncio.to_thread(self._features.document, info)
            matches = search.by_words(document, info, words,
                                      await self._explanations.of_sae(info.id))
        elif which == "example":
            matches, tokens, strings = await search.run_example(
                self._inference, self._m.attached, info, request.example, request.model)
        elif which == "meaning":
            text = meaning.check_meaning(request.meaning)
            model = request.model or (self._inference.loaded.id if self._inference.loaded
                                      else "")
            if not model:
                raise model_not_loaded("No model is loaded; name one in 'model'.")
            document = await asyncio.to_thread(self._features.document, info)
            described = meaning.descriptions(document, info,
                                             await self._explanations.of_sae(info.id))
            matches = await self._meanings.search(self._inference, info, described, text, model)
        elif which == "neighbours_of":
            decoder = await asyncio.to_thread(self._m.decoder, info)
            matches = search.neighbours(decoder, info, request.neighbours_of)
        else:
            raise invalid_parameter("query", "Search by one of 'query', 'meaning', 'example' "
                                    "or 'neighbours_of'.")
        return pb.SearchSaeFeaturesResponse(
            sae=self._sae(info), total=len(matches),
            data=[_match(m) for m in matches[request.offset:request.offset + limit]],
            tokens=[pb.TokenFeatures(
                position=t.position, token_id=t.token_id,
                token=strings[t.position] if t.position < len(strings) else "",
                features=[_match(m) for m in t.features]) for t in tokens])

    @unary_errors
    async def GetSaeFeature(self, request, context):
        info = self._info(request.sae_id)
        k = cards.check(info, request.index,
                        request.top_tokens if request.HasField("top_tokens") else None)
        document = await asyncio.to_thread(self._features.document, info)
        reply = pb.GetSaeFeatureResponse(sae=self._sae(info), index=request.index,
                                         recorded=document is not None)
        record = cards.record_of(document, request.index)
        if record is not None:
            reply.density = float(record.get("density", 0.0))
            reply.max_activation = float(record.get("max", 0.0))
            reply.top_tokens.extend(_tokens(record))
            reply.top_contexts.extend(_examples(record))
        engine, loaded = self._inference.engine, self._inference.loaded
        unembedding = await asyncio.to_thread(engine.unembedding) if engine else None
        if unembedding is not None and unembedding.shape[1] == info.d_in:
            decoder = await asyncio.to_thread(self._m.decoder, info)
            promoted, suppressed = cards.token_logits(decoder[request.index], unembedding, k)
            ids = [i for i, _ in promoted + suppressed]
            strings = dict(zip(ids, await asyncio.to_thread(engine.token_strings, ids),
                               strict=True))
            reply.model = loaded.id
            reply.promoted_tokens.extend(pb.TokenLogit(token_id=i, token=strings[i], value=v)
                                         for i, v in promoted)
            reply.suppressed_tokens.extend(pb.TokenLogit(token_id=i, token=strings[i], value=v)
                                           for i, v in suppressed)
        monitoring = getattr(self._inference, "monitoring", None)
        if monitoring is not None:
            reply.traffic_contexts.extend(
                pb.FeatureExample(value=c.value, token=c.token, left=c.left, right=c.right)
                for c in monitoring.contexts_of(info.id, request.index))
        explanation = await self._explanations.get(info.id, request.index)
        if explanation is not None:
            reply.explanation.CopyFrom(_explanation(explanation))
        return reply

    @unary_errors
    async def SetFeatureExplanation(self, request, context):
        info = self._info(request.sae_id)
        stored = await self._explanations.set(info, request.index, request.text)
        reply = pb.SetFeatureExplanationResponse()
        if stored is not None:
            reply.explanation.CopyFrom(_explanation(stored))
        return reply

    @unary_errors
    async def ImportFeatureExplanations(self, request, context):
        info = self._info(request.sae_id)
        records = explanations.parse_import(request.document_json, info)
        return pb.ImportFeatureExplanationsResponse(
            imported=await self._explanations.import_records(info, records))
