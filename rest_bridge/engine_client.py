"""The bridge's connection to one or more engines.

With several targets, gRPC itself balances: a round_robin channel over every
engine address with client-side health checking, so a replica that is loading
or draining (NOT_SERVING) gets no traffic.
"""

from __future__ import annotations

import ipaddress
import json
import pathlib

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from millm.client import AsyncClient


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


SERVICE_CONFIG = json.dumps(
    {
        "loadBalancingConfig": [{"round_robin": {}}],
        "healthCheckConfig": {"serviceName": ""},
    }
)


def _read(path: str | None) -> bytes | None:
    return pathlib.Path(path).read_bytes() if path else None


class EngineClient(AsyncClient):
    """The bridge's way to the engines: the Python client (clients/python) over a
    channel that balances round-robin across the targets with gRPC health
    checking. Handlers use its stubs directly: they need the raw responses for
    SSE, and pass each request's key and id as call metadata."""

    def __init__(self, targets: tuple[str, ...], tls_ca: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None):
        self.target = channel_target(targets)
        credentials = None
        if tls_ca is not None:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(tls_ca), private_key=_read(tls_key),
                certificate_chain=_read(tls_cert))
        super().__init__(self.target, credentials=credentials, options=[
            ("grpc.service_config", SERVICE_CONFIG), ("grpc.enable_retries", 1)])
        self.health = health_pb2_grpc.HealthStub(self.channel)

    async def is_serving(self, timeout: float = 2.0) -> bool:
        try:
            reply = await self.health.Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout
            )
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING
