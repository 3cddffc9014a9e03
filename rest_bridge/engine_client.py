"""The bridge's connection to one or more engines.

With several targets, gRPC itself balances: a round_robin channel over every
engine address with client-side health checking, so a replica that is loading
or draining (NOT_SERVING) gets no traffic. Over replicas (several targets, or
a dns:/// name that resolves to several) the check is the engines'
`millm.routable` entry, NOT_SERVING while a replica changes its model too, so
a switch sends its traffic to the others instead of answering model_busy. A
lone engine is checked on "" instead: it must still take the request that
asks it for another model.

Over several engines, a call that fails UNAVAILABLE before the engine sent
anything back (the engine died, or refused while draining or loading) is
retried by gRPC on the next engine, for the calls that change nothing:
generation, scoring, embeddings, tokenization and the Get/List reads. A call
that changes state (loading a model, saving a profile) is not: the dead engine may have
done it. gRPC stops retrying once the first reply message arrives, which for
a Generate stream is its metadata; rest_bridge/serving/failover.py carries
generation on from there. The channel pings the engines
(common/grpc_limits.py), so a half-open connection is dropped in seconds. A
lone engine's channel has no retry policy: there is no other engine, and its
own refusals (draining, model_busy) should reach the client at once rather
than after three tries.

Over replicas with MILLM_ROUTING=load_prefix (the default), the calls that
carry a prompt (Generate, Embed) do not use that balanced channel: `generate`
and `embed` ask rest_bridge/routing/ for a replica by state, loaded model,
load and prompt prefix, and call it on its own channel. That channel has no
retry policy: a Generate lost or refused there is sent on by
serving/failover.py, an Embed by `embed` itself; Tokenize and Detokenize
(`tokenization_for`) go to the replica the router picks for their model, and
are not retried there. MILLM_ROUTING=round_robin
keeps every call on the balanced channel.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import pathlib
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common import grpc_limits
from millm.client import AsyncClient
from millm.v1 import (
    embedding_service_pb2,
    generation_service_pb2,
    model_service_pb2,
    ranking_service_pb2,
    scoring_service_pb2,
    server_service_pb2,
    steering_service_pb2,
    tokenization_service_pb2,
)
from rest_bridge.engine_mux import Mux
from rest_bridge.routing.prefix import prompt_text
from rest_bridge.routing.router import Router, dns_name


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def channel_target(targets: tuple[str, ...]) -> str:
    if len(targets) == 1:
        return targets[0]
    hosts = [t.rsplit(":", 1)[0] for t in targets]
    if not all(_is_ip_literal(h) for h in hosts):
        raise ValueError(
            "several engine targets must be IP:port literals; for hostnames use one DNS name "
            "that resolves to every engine (dns:///engines:50051)"
        )
    scheme = "ipv6" if any(":" in h.strip("[]") for h in hosts) else "ipv4"
    return f"{scheme}:{','.join(targets)}"


# Services whose every call may run twice, and the read calls of the others.
_RETRIED_SERVICES = (generation_service_pb2, scoring_service_pb2, embedding_service_pb2,
                     server_service_pb2, tokenization_service_pb2, ranking_service_pb2)
_READS_OF = (model_service_pb2, steering_service_pb2)
RETRY_POLICY = {
    "maxAttempts": 3,
    "initialBackoff": "0.05s",
    "maxBackoff": "0.5s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}


# An Embed the router sent to a replica that failed UNAVAILABLE goes to
# another, as gRPC's policy (RETRY_POLICY) does on the balanced channel.
EMBED_ATTEMPTS = 3
EMBED_BACKOFF_S = 0.05  # times the attempt number


def _retried_names() -> list[dict]:
    names = []
    for module in _RETRIED_SERVICES:
        names += [{"service": s.full_name} for s in module.DESCRIPTOR.services_by_name.values()]
    for module in _READS_OF:
        for service in module.DESCRIPTOR.services_by_name.values():
            names += [{"service": service.full_name, "method": m.name} for m in service.methods
                      if m.name.startswith(("Get", "List"))]
    return names


# The engines' health entries (service/server.py) the balancer checks.
LONE_ENGINE_HEALTH = ""
ROUTABLE_HEALTH = "millm.routable"


def are_replicas(targets: tuple[str, ...]) -> bool:
    return len(targets) > 1 or dns_name(targets[0]) is not None


def health_service(targets: tuple[str, ...]) -> str:
    return ROUTABLE_HEALTH if are_replicas(targets) else LONE_ENGINE_HEALTH


def service_config(health: str, retries: bool = True) -> str:
    return json.dumps({
        "loadBalancingConfig": [{"round_robin": {}}],
        "healthCheckConfig": {"serviceName": health},
        "methodConfig": [{"name": _retried_names(), "retryPolicy": RETRY_POLICY}]
        if retries else [],
        # gRPC's retry budget: each failed attempt costs a token, each success
        # earns half of one, and retries pause below 50 tokens. A single dead
        # engine (a burst of in-flight failures) stays within it; a dead fleet
        # is not hammered three times over.
        "retryThrottling": {"maxTokens": 100, "tokenRatio": 0.5},
    })


def _generate(mux: Mux | None, stub, request, *, metadata=None, timeout=None):
    """A Generate call on `mux`'s stream, else (no stream, or an engine
    without one) on `stub`."""
    if mux is None or mux.unsupported:
        return stub.Generate(request, metadata=metadata, timeout=timeout)
    deadline = time.monotonic() + timeout if timeout else None

    def fallback():
        left = max(0.001, deadline - time.monotonic()) if deadline is not None else None
        return stub.Generate(request, metadata=metadata, timeout=left)

    return mux.start(request, metadata, timeout, fallback)


def _read(path: str | None) -> bytes | None:
    return pathlib.Path(path).read_bytes() if path else None


class EngineClient(AsyncClient):
    """The bridge's way to the engines: the Python client (clients/python) over a
    channel that balances round-robin across the targets with gRPC health
    checking. Handlers use its stubs directly: they need the raw responses for
    SSE, and pass each request's key and id as call metadata."""

    def __init__(self, targets: tuple[str, ...], tls_ca: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None,
                 routing: str = "load_prefix", drain_grace_s: float = 600.0,
                 mux: bool = True, stall_s: float = grpc_limits.STREAM_STALL_S):
        self.target = channel_target(targets)
        credentials = None
        if tls_ca is not None:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(tls_ca), private_key=_read(tls_key),
                certificate_chain=_read(tls_cert))
        super().__init__(self.target, credentials=credentials, options=[
            ("grpc.service_config", service_config(health_service(targets),
                                                   retries=are_replicas(targets))),
            ("grpc.enable_retries", 1),
            *grpc_limits.channel_options()])
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.router: Router | None = None
        if routing == "load_prefix" and are_replicas(targets):
            self.router = Router(targets, credentials, options=[
                ("grpc.enable_retries", 0), *grpc_limits.channel_options()],
                drain_grace_s=drain_grace_s, mux=mux, stall_s=stall_s)
            self.router.start()
        # A lone engine's generations ride one stream; over replicas balanced
        # per call (round_robin, or no replica routable) each is a call.
        self.mux = Mux(self.channel, stall_s) if mux and not are_replicas(targets) else None

    async def close(self) -> None:
        if self.router is not None:
            await self.router.close()
        if self.mux is not None:
            await self.mux.close()
        await super().close()

    def generate(self, request, exclude: frozenset[str] = frozenset(), **kwargs):
        """(the Generate call, the replica's target or None): on the replica
        the router picks, else on the balanced channel."""
        replica = None
        if self.router is not None:
            replica = self.router.pick(request.model, prompt_text(request), exclude)
        if replica is None:
            return _generate(self.mux, self.generation, request, **kwargs), None
        call = _generate(replica.mux, replica.client.generation, request, **kwargs)
        self.router.track(replica, call)
        return call, replica.target

    async def embed(self, request, *, timeout: float, metadata=None, on_retry=None):
        """The EmbedReply (`unary`)."""
        return await self.unary("embeddings", "Embed", request, timeout=timeout,
                                metadata=metadata, on_retry=on_retry)

    async def unary(self, stub: str, method: str, request, *, timeout: float, metadata=None,
                    on_retry=None):
        """The reply of a read-only unary call (`stub` the client's attribute:
        embeddings, ranking). On the router's replica, whose channel has no
        gRPC retry policy, a call failing UNAVAILABLE (lost, or refused while
        draining or switching) is sent to a replica not tried yet, at most
        EMBED_ATTEMPTS in all within `timeout`; `on_retry(attempt)` is told of
        each. On the balanced channel gRPC's own policy does the same."""
        deadline = time.monotonic() + timeout
        tried: frozenset[str] = frozenset()
        attempt = 1
        while True:
            left = max(0.001, deadline - time.monotonic())
            replica = (self.router.pick(request.model, exclude=tried)
                       if self.router is not None else None)
            if replica is None:
                return await getattr(getattr(self, stub), method)(request, timeout=left,
                                                                  metadata=metadata)
            tried |= {replica.target}
            call = getattr(getattr(replica.client, stub), method)(request, timeout=left,
                                                                  metadata=metadata)
            self.router.track(replica, call)
            try:
                return await call
            except grpc.aio.AioRpcError as exc:
                if (exc.code() != grpc.StatusCode.UNAVAILABLE or attempt >= EMBED_ATTEMPTS
                        or time.monotonic() >= deadline):
                    raise
            if on_retry is not None:
                on_retry(attempt)
            await asyncio.sleep(EMBED_BACKOFF_S * attempt)
            attempt += 1

    def tokenization_for(self, model: str):
        """The TokenizationService stub of the replica the router picks for
        `model` (one that has it loaded, so tokenizing never switches a
        replica's model when another serves it), else the balanced channel's."""
        replica = self.router.pick(model) if self.router is not None else None
        return replica.client.tokenization if replica is not None else self.tokenization

    async def is_serving(self, timeout: float = 2.0) -> bool:
        try:
            reply = await self.health.Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout
            )
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING
