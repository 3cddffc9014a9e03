"""The bridge's Prometheus metrics (GET /metrics; an admin key when keys are
configured): requests by route, method, status and error code, latency, and
time to first token of streamed responses, streams that failed after their 200,
engine calls retried after failover, and with several engines the router's
view of each (routing/router.py): requests it sent there and why, calls in
flight, and whether it is routable."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models",
          "/v1/responses", "/v1/messages", "/v1/messages/count_tokens", "/tokenize",
          "/detokenize",
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

    def watch_router(self, router) -> None:
        """Export the router's per-replica figures (several engines only)."""
        self.registry.register(_RouterCollector(router))


class _RouterCollector:
    def __init__(self, router):
        self.router = router

    def collect(self):
        routed = CounterMetricFamily("millm_bridge_routed_requests", "calls the router sent to "
                                     "each engine, by what decided (prefix or least_load)",
                                     labels=["replica", "reason"])
        in_flight = GaugeMetricFamily("millm_bridge_replica_in_flight", "this bridge's calls "
                                      "running on each engine", labels=["replica"])
        routable = GaugeMetricFamily("millm_bridge_replica_routable", "1 while the engine "
                                     "reports SERVING over a live load stream",
                                     labels=["replica"])
        load = GaugeMetricFamily("millm_bridge_replica_load", "the load the router weighs "
                                 "for each engine: this bridge's calls in flight, or the "
                                 "engine's last report of every bridge's when larger",
                                 labels=["replica"])
        now = time.monotonic()
        for replica in list(self.router.replicas.values()):
            for reason, count in sorted(replica.routed.items()):
                routed.add_metric([replica.target, reason], count)
            in_flight.add_metric([replica.target], replica.in_flight)
            routable.add_metric([replica.target], 1 if replica.routable(now) else 0)
            load.add_metric([replica.target], replica.load)
        yield from (routed, in_flight, routable, load)
