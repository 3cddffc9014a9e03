"""ServerService.WatchLoad: this replica's load, streamed to the bridge's router.

Why: with several replicas the bridge picks one per request by model, state
and load (rest_bridge/routing/). gRPC's own balancers in Python cannot read
per-replica load (no ORCA server in grpcio), so each engine streams a small
report instead: one at once, then one per interval, from the same counters the
metrics endpoint shows. The state folds the model lifecycle and the drain into
one value, SERVING only while a model is loaded and nothing changes it.

A report holds counts and model names, nothing of any request, so it is served
without a key like health checks (servicers/access.py); watchers are bounded so
no caller can make the engine run many report loops.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from millm.v1 import server_service_pb2
from service.errors import EngineError, internal_error, invalid_parameter
from service.metrics import kv_capacity
from service.models.lifecycle import Phase
from service.models.registry import GGUF

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_MS = 250
MIN_INTERVAL_MS, MAX_INTERVAL_MS = 50, 10_000
MAX_WATCHERS = 64

_SWITCHING = (Phase.FIRST_LOAD, Phase.LOADING, Phase.DRAINING, Phase.RELEASING)
_STATE = server_service_pb2


class LoadReporter:
    """Builds reports and bounds the number of streams that send them."""

    def __init__(self, inference, drain, replica_id: str | None = None):
        self.inference, self.drain = inference, drain
        # This process, as load reports and the state database's replica
        # registry (steering/acks.py) both name it.
        self.replica_id = replica_id or uuid.uuid4().hex
        self.watchers = 0

    def state(self) -> int:
        if self.drain is not None and self.drain.draining:
            return _STATE.REPLICA_STATE_DRAINING
        phase = self.inference.lifecycle.phase
        if phase in _SWITCHING:
            return _STATE.REPLICA_STATE_SWITCHING
        if phase is Phase.LOADED:
            return _STATE.REPLICA_STATE_SERVING
        return _STATE.REPLICA_STATE_STARTING

    def report(self) -> server_service_pb2.WatchLoadResponse:
        reply = server_service_pb2.WatchLoadResponse(replica_id=self.replica_id, state=self.state())
        loaded, engine = self.inference.loaded, self.inference.engine
        if loaded is None or engine is None:
            return reply
        reply.model = loaded.id
        reply.model_names.append(loaded.id)
        entry = getattr(engine, "entry", None)
        if entry is not None and entry.engine == GGUF and entry.repo and entry.repo != loaded.id:
            reply.model_names.append(entry.repo)
        status = engine.status()
        reply.running_requests, reply.waiting_requests = (status.active_generations,
                                                          status.queued_requests)
        reply.running_rows, reply.max_batch = status.running_rows, status.max_batch
        reply.kv_cache_utilization = min(
            1.0, status.kv_tokens_in_use / kv_capacity(status, loaded.context_window))
        return reply

    async def watch(self, request, context):
        interval = request.interval_ms or DEFAULT_INTERVAL_MS
        refusal = None
        if not MIN_INTERVAL_MS <= interval <= MAX_INTERVAL_MS:
            refusal = invalid_parameter("interval_ms", f"interval_ms must be {MIN_INTERVAL_MS} "
                                        f"to {MAX_INTERVAL_MS} (0 for the default).")
        elif self.watchers >= MAX_WATCHERS:
            refusal = EngineError("rate_limit_exceeded", f"This engine serves at most "
                                  f"{MAX_WATCHERS} load watchers at once.")
        if refusal is not None:
            status = refusal.to_status()
            await context.abort(status.code, status.details, status.trailing_metadata)
        self.watchers += 1
        try:
            while True:
                try:
                    report = self.report()
                except Exception:  # never the exception's text to the caller
                    log.exception("a load report failed")
                    status = internal_error().to_status()
                    await context.abort(status.code, status.details, status.trailing_metadata)
                await context.write(report)
                await asyncio.sleep(interval / 1000)
        finally:
            self.watchers -= 1
