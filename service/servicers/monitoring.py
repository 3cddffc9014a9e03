"""millm.v1.MonitoringService: protobuf in, MonitoringManager calls, protobuf out."""

from __future__ import annotations

from millm.v1 import monitoring_pb2, monitoring_service_pb2, monitoring_service_pb2_grpc
from service.errors import model_not_loaded
from service.inference import InferenceService
from service.servicers.error_handling import unary_errors
from service.steering import monitoring as monitor
from service.steering.monitoring import MonitoringManager


def _probe(status: monitor.ProbeStatus) -> monitoring_service_pb2.Probe:
    p = status.probe
    return monitoring_service_pb2.Probe(
        name=p.name, description=p.description, sae_id=p.sae_id, layer=p.layer,
        features=[monitoring_pb2.ProbeFeature(index=i, weight=w) for i, w in p.features],
        threshold=p.threshold, reading=status.reading, reason=status.reason, created=p.created)


def _state(s: monitor.MonitoringState) -> monitoring_service_pb2.MonitoringState:
    return monitoring_service_pb2.MonitoringState(
        model=s.model, enabled=s.enabled, active=s.active, reason=s.reason,
        probes=[_probe(p) for p in s.probes], window_requests=s.window_requests,
        total_requests=s.total_requests,
        probe_stats=[monitoring_service_pb2.ProbeStats(
            probe=p.probe, requests=p.requests, fired=p.fired, hit_rate=p.hit_rate,
            total_requests=p.total_requests, total_fired=p.total_fired)
            for p in s.probe_stats],
        feature_frequencies=[monitoring_service_pb2.FeatureFrequency(
            sae_id=f.sae_id, layer=f.layer, index=f.index, tokens=f.tokens,
            frequency=f.frequency) for f in s.feature_frequencies],
        keep_contexts=s.keep_contexts)


class MonitoringServicer(monitoring_service_pb2_grpc.MonitoringServiceServicer):
    def __init__(self, monitoring: MonitoringManager, inference: InferenceService):
        self._m = monitoring
        self._inference = inference

    def _model(self, name: str) -> str:
        """The model a switch is for: named (and known), or the loaded one."""
        if name:
            return self._inference.get_model(name).entry.id
        loaded = self._inference.loaded
        if loaded is None:
            raise model_not_loaded("No model is loaded; name one in 'model'.")
        return loaded.id

    def _view(self, model: str) -> monitoring_service_pb2.MonitoringState:
        loaded = self._inference.loaded
        return _state(self._m.state(model, loaded.id if loaded is not None else None))

    @unary_errors
    async def ListProbes(self, request, context):
        return monitoring_service_pb2.ListProbesResponse(
            probes=[_probe(p) for p in self._m.list_probes()])

    @unary_errors
    async def CreateProbe(self, request, context):
        status = await self._m.create_probe(
            request.name, request.description, request.sae_id,
            request.layer if request.HasField("layer") else None,
            [(f.index, f.weight) for f in request.features] or None,
            request.feature if request.HasField("feature") else None,
            request.threshold if request.HasField("threshold") else None)
        return monitoring_service_pb2.CreateProbeResponse(probe=_probe(status))

    @unary_errors
    async def DeleteProbe(self, request, context):
        await self._m.delete_probe(request.name)
        return monitoring_service_pb2.DeleteProbeResponse()

    @unary_errors
    async def SetMonitoring(self, request, context):
        model = self._model(request.model)
        await self._m.set_enabled(model, request.enabled, request.keep_contexts
                                  if request.HasField("keep_contexts") else None)
        return monitoring_service_pb2.SetMonitoringResponse(monitoring=self._view(model))

    @unary_errors
    async def GetMonitoring(self, request, context):
        return monitoring_service_pb2.GetMonitoringResponse(
            monitoring=self._view(self._model(request.model)))


# RPCs that change monitoring state: admin scope when keys are configured.
ADMIN_METHODS = frozenset(f"/millm.v1.MonitoringService/{name}"
                          for name in ("CreateProbe", "DeleteProbe", "SetMonitoring"))
