"""The bridge's picker over several engines (MILLM_ROUTING=load_prefix).

Why not gRPC's own balancing: grpcio's policies (pick_first, round_robin) can
check health but cannot weigh load, loaded model or prompt prefix, and Python
has no custom load-balancing policies or ORCA. So with several engines the
bridge keeps one channel per engine, follows each engine's load stream
(ServerService.WatchLoad), and picks per call with picker.py's policy. It is
used for the calls that carry a prompt (Generate, Embed); every other call
(management, reads) stays on the balanced channel in engine_client.py.

Engines come from MILLM_ENGINE_TARGETS: each host:port is one replica, and a
`dns:///name:port` target is resolved again every RESOLVE_S, so replicas
behind a Kubernetes headless Service come and go as pods do. A replica whose
process restarted (a new replica_id) or that left is forgotten by the prefix
index: its cache is gone. A replica the name no longer lists (a pod that
started draining) gets no new calls at once, but its channel closes only
after the calls running on it end, within the bridge's longest engine deadline
(`drain_grace_s`), so their streams finish instead of being cut off.

The per-engine channels have no retry policy: a call that fails UNAVAILABLE
before any reply is sent again by the caller (serving/failover.py for
Generate, EngineClient.embed for Embed), which asks the router for another
replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time

import grpc

from common import grpc_limits
from millm.client import AsyncClient
from millm.v1 import server_service_pb2
from rest_bridge.engine_mux import Mux
from rest_bridge.routing.picker import Replica, choose
from rest_bridge.routing.prefix import PrefixIndex, block_hashes, cache_key

log = logging.getLogger("millm.bridge")

REPORT_INTERVAL_MS = 100
RECONNECT_S = 0.5
RESOLVE_S = 5.0
# How long a replica dropped from DNS keeps its channel for the calls running on
# it; EngineClient passes MILLM_ENGINE_DEADLINE_MAX_S, whose default this is.
DRAIN_GRACE_S = 600.0


def dns_name(target: str) -> tuple[str, int] | None:
    """(host, port) of a dns: target, else None."""
    if not target.startswith("dns:"):
        return None
    rest = target[4:].lstrip("/")
    if "/" in rest:  # dns://authority/host:port
        rest = rest.split("/", 1)[1]
    # gRPC's default port when the name has none: dns:///engines is engines:443.
    if rest.startswith("["):  # [v6 address] or [v6 address]:port
        host, _, after = rest[1:].partition("]")
        return host, int(after[1:]) if after.startswith(":") else 443
    if rest.count(":") != 1:  # no port, or a bare v6 address
        return rest, 443
    host, _, port = rest.rpartition(":")
    return host, int(port or 443)


class Router:
    def __init__(self, targets: tuple[str, ...], credentials=None, options=(),
                 drain_grace_s: float = DRAIN_GRACE_S, mux: bool = True,
                 stall_s: float = grpc_limits.STREAM_STALL_S):
        self.targets, self.credentials, self.options = targets, credentials, list(options)
        self.mux = mux  # each replica's generations on one GenerateMany stream
        self.stall_s = stall_s
        self.drain_grace_s = drain_grace_s
        self.replicas: dict[str, Replica] = {}
        self.index = PrefixIndex()
        self._tasks: dict[str, asyncio.Task] = {}
        self._resolver: asyncio.Task | None = None
        self._draining: dict[asyncio.Task, AsyncClient] = {}  # dropped replicas' closes

    def start(self) -> None:
        names = [dns_name(t) for t in self.targets]
        for target, name in zip(self.targets, names, strict=True):
            if name is None:
                self._add(target)
        if any(names):
            self._resolver = asyncio.create_task(self._resolve([n for n in names if n]))

    async def close(self) -> None:
        if self._resolver is not None:
            self._resolver.cancel()
        for target in list(self.replicas):
            await self._remove(target)
        for task, client in list(self._draining.items()):  # shutdown: no more grace
            task.cancel()
            with contextlib.suppress(Exception):
                await client.close()
        self._draining.clear()

    # -- picking ----------------------------------------------------------------------

    def pick(self, model: str, prompt: str = "",
             exclude: frozenset[str] = frozenset()) -> Replica | None:
        """The replica for a call asking for `model` with this prompt text
        (prefix.prompt_text); None when no replica is routable (the caller
        falls back to the balanced channel)."""
        key = cache_key.get()
        hashes = block_hashes(prompt, key) if prompt or key else []
        choice = choose(list(self.replicas.values()), model,
                        self.index.matches(hashes) if hashes else {}, exclude)
        if choice is None:
            return None
        replica = choice.replica
        replica.routed[choice.reason] = replica.routed.get(choice.reason, 0) + 1
        if hashes:
            self.index.record(hashes, replica.target)
        return replica

    @staticmethod
    def track(replica: Replica, call) -> None:
        """Count the call in flight on its replica until it ends, however it ends."""
        replica.in_flight += 1

        def done(_call) -> None:
            replica.in_flight -= 1
            replica.done_at = time.monotonic()

        call.add_done_callback(done)

    # -- replicas ---------------------------------------------------------------------

    def _add(self, target: str, host: str | None = None) -> None:
        options = self.options
        if host is not None and self.credentials is not None:
            # An address found through DNS: its certificate names the host, not the IP.
            options = [*options, ("grpc.ssl_target_name_override", host)]
        client = AsyncClient(target, credentials=self.credentials, options=options)
        replica = Replica(target, client,
                          mux=Mux(client.channel, self.stall_s) if self.mux else None)
        self.replicas[target] = replica
        self._tasks[target] = asyncio.create_task(self._watch(replica))

    async def _remove(self, target: str) -> None:
        """Forget a replica and close its channel at once (shutdown)."""
        replica = self.replicas.pop(target)
        self._tasks.pop(target).cancel()
        self.index.forget(target)
        with contextlib.suppress(Exception):
            if replica.mux is not None:
                await replica.mux.close()
            await replica.client.close()

    def _drop(self, target: str) -> None:
        """A replica DNS no longer lists: no new calls from now on, while the
        calls running on it finish (within drain_grace_s) before its channel
        closes."""
        replica = self.replicas.pop(target)
        watch = self._tasks.pop(target)
        watch.cancel()
        self.index.forget(target)

        async def drain() -> None:
            with contextlib.suppress(asyncio.CancelledError):
                await watch  # its load stream ends first: it is no call to wait for
            with contextlib.suppress(Exception):
                if replica.mux is not None:  # its calls end, then its stream
                    await replica.mux.close(grace=self.drain_grace_s)
                await replica.client.channel.close(grace=self.drain_grace_s)

        task = asyncio.create_task(drain())
        self._draining[task] = replica.client
        task.add_done_callback(lambda done: self._draining.pop(done, None))

    async def _watch(self, replica: Replica) -> None:
        request = server_service_pb2.WatchLoadRequest(interval_ms=REPORT_INTERVAL_MS)
        while True:
            call = replica.client.server.WatchLoad(request)
            try:
                async for report in call:
                    if replica.report is not None and \
                            report.replica_id != replica.report.replica_id:
                        self.index.forget(replica.target)  # restarted: cold cache
                    replica.report, replica.seen_at = report, time.monotonic()
                    replica.streaming = True
            except grpc.aio.AioRpcError as exc:
                if replica.streaming:
                    log.warning("load stream from %s ended: %s", replica.target,
                                exc.code().name)
            finally:
                # Cancelled before grpc's own send task first ran, the call
                # would stay open and hold the channel's close for its grace.
                call.cancel()
                replica.streaming = False
            await asyncio.sleep(RECONNECT_S)

    async def _resolve(self, names: list[tuple[str, int]]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            found: dict[str, str] = {}
            for host, port in names:
                try:
                    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                except OSError as exc:
                    log.warning("cannot resolve %s: %s", host, exc)
                    found = dict.fromkeys(self.replicas, "")  # keep what we have
                    break
                for family, *_rest, address in infos:
                    found[f"ipv6:[{address[0]}]:{address[1]}" if family == socket.AF_INET6
                          else f"ipv4:{address[0]}:{address[1]}"] = host
            for target in found.keys() - self.replicas.keys():
                self._add(target, found[target])
            for target in self.replicas.keys() - found.keys():
                self._drop(target)
            await asyncio.sleep(RESOLVE_S)
