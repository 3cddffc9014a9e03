"""The bridge's Prometheus metrics (GET /metrics; an admin key when keys are
configured): requests by route, method, status and error code, latency, and
time to first token of streamed responses, streams that failed after their 200,
and engine calls retried after failover."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models",
          "/v1/responses",
          "/healthz", "/readyz", "/health", "/metrics", "/api/health/inference",
          "/api/prefix-cache/clear",
          "/api/capabilities")


def route_label(path: str) -> str:
    """A bounded label: the route, not the path (model ids and typos stay out)."""
    if path in ROUTES:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{id}"
    if path.startswith("/v1/responses/"):
        # Response ids stay out of the labels, like model ids.
        return ("/v1/responses/{id}/input_items" if path.endswith("/input_items")
                else "/v1/responses/{id}")
    return "other"


METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


def method_label(method: str) -> str:
    """A bounded label: any method a client invents counts as "other"."""
    return method if method in METHODS else "other"


class BridgeMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("millm_bridge_requests", "HTTP requests answered",
                                ["route", "method", "status", "code"], registry=self.registry)
        self.seconds = Histogram("millm_bridge_request_duration_seconds",
                                 "time to the end of the response", ["route"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.first_token = Histogram("millm_bridge_time_to_first_token_seconds",
                                     "time to the first streamed event", ["route"],
                                     buckets=LATENCY_BUCKETS, registry=self.registry)
        self.stream_failures = Counter(
            "millm_bridge_stream_failures", "streams that ended with an error event after "
            "their 200 was sent", ["route", "code"], registry=self.registry)
        self.engine_retries = Counter(
            "millm_bridge_engine_retries", "engine calls tried again on another engine after "
            "the first one was lost before it produced anything", ["rpc"],
            registry=self.registry)
        self.in_flight = Gauge("millm_bridge_requests_in_flight", "requests being answered",
                               registry=self.registry)
        self.draining = Gauge("millm_bridge_draining", "1 while shutting down",
                              registry=self.registry)
