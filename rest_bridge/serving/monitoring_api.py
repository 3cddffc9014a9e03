"""The management API for monitoring under /api: probes and the per-model
switch with its aggregates, each route a thin translation into a
MonitoringService request and back (the same machinery as steering_api.py).
Every rule lives in the engine; /api needs an admin key when keys are
configured."""

from __future__ import annotations

from fastapi import APIRouter

from millm.v1 import monitoring_service_pb2 as pb
from rest_bridge.serving.steering_api import Route, _body, _parse, _path, register


def _get_monitoring(path, raw, query):
    return pb.GetMonitoringRequest(model=query.get("model", ""))


def _set_monitoring(path, raw):
    return _parse(_body(raw), pb.SetMonitoringRequest())


def _create_probe(path, raw):
    return _parse(_body(raw), pb.CreateProbeRequest())


ROUTES = (
    Route("GET", "/api/monitoring", "GetMonitoring", _get_monitoring, service="monitoring",
          query=True),
    Route("PUT", "/api/monitoring", "SetMonitoring", _set_monitoring, service="monitoring"),
    Route("GET", "/api/probes", "ListProbes", lambda path, raw: pb.ListProbesRequest(),
          service="monitoring"),
    Route("POST", "/api/probes", "CreateProbe", _create_probe, service="monitoring"),
    Route("DELETE", "/api/probes/{name}", "DeleteProbe", _path(pb.DeleteProbeRequest,
                                                                name="name"),
          service="monitoring"),
)

router = APIRouter()
register(router, ROUTES)
