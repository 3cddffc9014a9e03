"""The engine's Prometheus metrics, served on MILLM_METRICS_PORT.

RPC counts and durations are recorded as calls end (servicers/access.py);
batch, queue, KV and model figures are read from the engine at scrape time,
so they are never stale. With API keys configured the endpoint needs an admin
key (`Authorization: Bearer`), unless MILLM_METRICS_OPEN=1: scrapers such as
GIE's endpoint picker send none, and the port is a separate one to expose only
inside the cluster. The same port answers /readyz (and /health) for probes
that speak HTTP: 200 while the engine serves.

Besides miLLM's own names, the figures autoscalers and GIE read are exported
under vLLM's names (`vllm:num_requests_waiting` and the rest, labelled
`model_name`; service/request_metrics.py says why).
"""

from __future__ import annotations

import json
import logging
import threading
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from common import api_keys
from service.engines.transformers.prefix_cache import BLOCK_TOKENS  # vLLM's cache block size
from service.request_metrics import RequestMetrics

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def kv_capacity(status, context_window: int) -> int:
    """KV slots the running batch may hold at most: every row at the full
    context window (no paged pool: lanes grow as rows do)."""
    return max(1, status.max_batch or 1) * max(1, context_window)


def _autoscaler_gauges(status, model: str, context_window: int):
    """The GIE model-server-protocol gauges under vLLM's names."""
    capacity = kv_capacity(status, context_window)
    for name, help_, value in (
        ("vllm:num_requests_waiting", "Requests waiting to join the running batch",
         status.queued_requests),
        ("vllm:num_requests_running", "Requests in the running batch", status.active_generations),
        ("vllm:kv_cache_usage_perc", "KV-cache slots in use, as a fraction (0-1) of the batch's "
         "most (max_batch x context window)", min(1.0, status.kv_tokens_in_use / capacity)),
    ):
        gauge = GaugeMetricFamily(name, help_, labels=["model_name"])
        gauge.add_metric([model], value)
        yield gauge
    info = GaugeMetricFamily("vllm:cache_config_info", "KV-cache layout",
                             labels=["block_size", "num_gpu_blocks"])
    info.add_metric([str(BLOCK_TOKENS), str(capacity // BLOCK_TOKENS)], 1)
    yield info
    tokens = CounterMetricFamily("vllm:generation_tokens", "Tokens generated",
                                 labels=["model_name"])
    tokens.add_metric([model], status.generated_tokens_total)
    yield tokens


class _StateCollector:
    """The state database as this replica sees it (steering/replication.py)."""

    def __init__(self, follower):
        self.follower = follower

    def collect(self):
        f = self.follower
        up = GaugeMetricFamily("millm_engine_state_store_up", "1 while the state database is "
                               "reachable and this replica has caught up with it",
                               labels=["backend"])
        up.add_metric([f.database.kind], 1 if f.available else 0)
        yield up
        yield GaugeMetricFamily("millm_engine_state_version", "the steering state version "
                                "this replica applies", value=f.applied_version)
        yield CounterMetricFamily("millm_engine_state_reloads", "times this replica reloaded "
                                  "the steering state after another replica's write",
                                  value=f.reloads)


class _EngineCollector:
    def __init__(self, inference, monitoring=None):
        self.inference = inference
        self.monitoring = monitoring

    def collect(self):
        yield from self._probes()
        loaded = GaugeMetricFamily("millm_engine_model_loaded",
                                   "1 for the model this engine serves", labels=["model"])
        if self.inference.loaded is not None:
            loaded.add_metric([self.inference.loaded.id], 1)
        yield loaded
        status = self.inference.status()
        if status is None:
            return
        loaded = self.inference.loaded
        if loaded is not None:
            yield from _autoscaler_gauges(status, loaded.id, loaded.context_window)
        for name, help_, value in (
            ("millm_engine_queued_requests", "requests waiting for the batch",
             status.queued_requests),
            ("millm_engine_running_rows", "choices being decoded", status.running_rows),
            ("millm_engine_active_generations", "requests being generated",
             status.active_generations),
            ("millm_engine_kv_tokens_in_use", "KV-cache token slots held (padding included)",
             status.kv_tokens_in_use),
            ("millm_engine_kv_padding_tokens", "KV-cache slots that are padding",
             status.kv_padding_tokens),
            ("millm_engine_prefix_cache_tokens", "tokens held by the prefix cache",
             status.prefix_cache_tokens),
            ("millm_engine_max_batch", "running rows allowed", status.max_batch),
        ):
            yield GaugeMetricFamily(name, help_, value=value)
        yield CounterMetricFamily("millm_engine_generated_tokens", "tokens generated",
                                  value=status.generated_tokens_total)
        outcomes = CounterMetricFamily("millm_engine_generations", "generations that ended",
                                       labels=["outcome"])
        outcomes.add_metric(["completed"], status.completed_generations_total)
        outcomes.add_metric(["cancelled"], status.cancelled_generations_total)
        outcomes.add_metric(["failed"], status.failed_generations_total)
        yield outcomes


    def _probes(self):
        """Monitoring: generations read and fired on, per probe, since start."""
        if self.monitoring is None:
            return
        monitored = CounterMetricFamily("millm_engine_monitored_generations",
                                        "generations read by monitoring probes",
                                        value=self.monitoring.total_requests)
        read = CounterMetricFamily("millm_engine_probe_reads", "generations a probe read",
                                   labels=["probe"])
        fired = CounterMetricFamily("millm_engine_probe_fired",
                                    "generations on which a probe fired", labels=["probe"])
        for name, (n_read, n_fired) in sorted(self.monitoring.totals.items()):  # a snapshot
            read.add_metric([name], n_read)
            fired.add_metric([name], n_fired)
        yield from (monitored, read, fired)


class EngineMetrics:
    def __init__(self, inference, follower=None, monitoring=None):
        self.registry = CollectorRegistry()
        self.rpcs = Counter("millm_engine_rpcs", "RPCs by method and status code",
                            ["method", "code"], registry=self.registry)
        self.rpc_seconds = Histogram("millm_engine_rpc_duration_seconds", "RPC duration",
                                     ["method"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(_EngineCollector(inference, monitoring))
        if follower is not None:
            self.registry.register(_StateCollector(follower))
        self.requests = RequestMetrics(self.registry)
        inference.request_metrics = self.requests
        self._server: WSGIServer | None = None

    def rpc_done(self, method: str, code: str, seconds: float) -> None:
        self.rpcs.labels(method, code).inc()
        self.rpc_seconds.labels(method).observe(seconds)

    def serve(self, host: str, port: int, keys: api_keys.KeyRing | None,
              ready=lambda: (True, {})) -> int:
        """Serve /metrics (behind `keys` when given) and /readyz, /health:
        ready() -> (serving, details)."""
        app = _with_probes(_guarded(make_wsgi_app(self.registry), keys), ready)
        self._server = make_server(host, port, app, handler_class=_QuietHandler)
        threading.Thread(target=self._server.serve_forever, name="millm-metrics",
                         daemon=True).start()
        return self._server.server_port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()


def _guarded(app, keys: api_keys.KeyRing | None):
    if keys is None:
        return app

    def guarded(environ, start_response):
        key = keys.identify(api_keys.bearer(environ.get("HTTP_AUTHORIZATION")))
        if key is None or not key.allows(api_keys.ADMIN):
            status = "401 Unauthorized" if key is None else "403 Forbidden"
            start_response(status, [("Content-Type", "text/plain")])
            return [b"an admin API key is needed\n"]
        return app(environ, start_response)

    return guarded


def _with_probes(app, ready):
    def probes(environ, start_response):
        if environ.get("PATH_INFO") not in ("/readyz", "/health"):
            return app(environ, start_response)
        serving, details = ready()
        body = json.dumps({"status": "ready" if serving else "not_ready", **details}).encode()
        start_response("200 OK" if serving else "503 Service Unavailable",
                       [("Content-Type", "application/json")])
        return [body]

    return probes


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - scrapes are not worth a log line
        pass
