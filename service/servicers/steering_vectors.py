"""The vector builder's RPCs (steering/vector_builds.py), a mixin of
SteeringServicer: a build runs in the call, so cancelling the call stops it;
its progress and a cancel are separate calls, for another client (or the
console) to watch or stop it."""

from __future__ import annotations

import asyncio
import time

from millm.v1 import steering_service_pb2 as pb
from service.servicers.error_handling import unary_errors
from service.steering import control_vectors, vector_builds


class VectorRpcs:
    @unary_errors
    async def CreateControlVector(self, request, context):
        checked = vector_builds.check(
            request.name, request.model, request.layer, request.method,
            [(p.positive, p.negative) for p in request.pairs], list(request.positives),
            list(request.negatives),
            request.timeout_s if request.HasField("timeout_s") else None)
        built = await self._builds.build(checked, self._inference, dict(self._m.attached),
                                         self._m.decoder)
        c = built.combined
        return pb.CreateControlVectorResponse(
            control_vector=self._vector(built.vector), model=built.model,
            method=checked.method, layer=checked.layer,
            prompts=len(checked.positives) + len(checked.negatives), tokens=built.tokens,
            norm=c.norm, separation=c.separation, agreement=c.agreement,
            nearest_features=[pb.NearFeature(sae_id=n.sae_id, index=n.index, cosine=n.cosine)
                              for n in built.nearest])

    @unary_errors
    async def GetControlVectorBuild(self, request, context):
        running = self._builds.running
        reply = pb.GetControlVectorBuildResponse()
        if running is not None:
            r = running.request
            reply.build.CopyFrom(pb.ControlVectorBuild(
                name=r.name, model=running.model, layer=r.layer, method=r.method,
                prompts_done=running.done, prompts_total=running.total,
                elapsed_s=round(time.monotonic() - running.started, 3), timeout_s=r.timeout_s,
                cancelling=running.cancel.is_set()))
        return reply

    @unary_errors
    async def DeleteControlVector(self, request, context):
        removed = await asyncio.to_thread(control_vectors.delete_vector, self._m.vectors,
                                          request.id)
        return pb.DeleteControlVectorResponse(id=removed)

    @unary_errors
    async def CancelControlVectorBuild(self, request, context):
        return pb.CancelControlVectorBuildResponse(cancelled=self._builds.cancel())
