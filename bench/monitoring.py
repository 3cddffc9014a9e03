"""What monitoring costs: throughput with every generation read by probes,
against the same traffic unmonitored.

Starts one engine, attaches both demo SAEs, defines four probes (two per SAE,
one of them over 16 weighted features), and drives closed-loop gRPC clients
(each sends its next request when the previous one ends) with monitoring off
and on, alternately, ROUNDS times each; each side's figure is the median of
its runs, so drift and other load on the machine hit both sides alike. Monitored rows are read at
pre_steering on both layers, prompt and generated tokens, inside the running
batch, and skip the prefix cache (a monitor must see every prompt position).

Target (issue 21): monitored throughput at least 90 % of unmonitored.

Usage: python bench/monitoring.py [--clients 16] [--tokens 48] [--requests 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from millm.v1 import (  # noqa: E402
    monitoring_pb2,
    monitoring_service_pb2,
    monitoring_service_pb2_grpc,
    steering_service_pb2,
    steering_service_pb2_grpc,
)
from tests import harness  # noqa: E402
from tests.grpc_helpers import chat_request, closed_loop  # noqa: E402

SAES = ("sae_millm-tiny-res-l1", "sae_millm-tiny-res-l0")
PROMPTS = ["Tell me about the sea.", "What is a library?", "Describe a garden.",
           "How do trains work?"]


async def setup(target: str) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        steering = steering_service_pb2_grpc.SteeringServiceStub(channel)
        monitoring = monitoring_service_pb2_grpc.MonitoringServiceStub(channel)
        for sae in SAES:
            await steering.AttachSae(steering_service_pb2.AttachSaeRequest(sae_id=sae))
        for sae in SAES:
            await monitoring.CreateProbe(monitoring_service_pb2.CreateProbeRequest(
                name=f"{sae}-one", sae_id=sae, feature=3, threshold=0.5))
            await monitoring.CreateProbe(monitoring_service_pb2.CreateProbeRequest(
                name=f"{sae}-many", sae_id=sae, threshold=2.0, features=[
                    monitoring_pb2.ProbeFeature(index=i, weight=1.0 if i % 2 else -0.5)
                    for i in range(16)]))


async def switch(target: str, enabled: bool) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = monitoring_service_pb2_grpc.MonitoringServiceStub(channel)
        state = (await stub.SetMonitoring(monitoring_service_pb2.SetMonitoringRequest(
            enabled=enabled))).monitoring
        assert state.active == enabled, state.reason


async def load(target: str, clients: int, requests: int, tokens: int) -> dict:
    return await closed_loop(target, clients, requests, lambda c, r: chat_request(
        PROMPTS[(c + r) % len(PROMPTS)], max_tokens=tokens, temperature=1.0, ignore_eos=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--requests", type=int, default=8, help="per client")
    parser.add_argument("--rounds", type=int, default=3, help="runs per side")
    args = parser.parse_args()
    runs: dict[bool, list[dict]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        process, port = harness.start_engine(pathlib.Path(tmp), MILLM_LOG_LEVEL="WARNING")
        target = f"127.0.0.1:{port}"
        try:
            harness.wait_serving(process, port)
            asyncio.run(setup(target))
            for _ in range(args.rounds):
                for enabled in (False, True):
                    asyncio.run(switch(target, enabled))
                    runs[enabled].append(asyncio.run(load(target, args.clients, args.requests,
                                                          args.tokens)))
        finally:
            process.stop()
    off, on = ({k: statistics.median(r[k] for r in runs[side]) for k in ("tok_s", "p50")}
               for side in (False, True))
    print(f"monitoring benchmark: {args.clients} clients x {args.requests} requests x "
          f"{args.tokens} tokens, chat, temperature 1, 4 probes on 2 SAEs (layers 0 and 1), "
          f"median of {args.rounds} alternating runs per side")
    print(f"{'':<12} {'tok/s':>8} {'p50 TTFT ms':>12}  runs (tok/s)")
    for name, side, figures in (("unmonitored", False, off), ("monitored", True, on)):
        print(f"{name:<12} {figures['tok_s']:>8.0f} {figures['p50']:>12.1f}  "
              + ", ".join(f"{r['tok_s']:.0f}" for r in runs[side]))
    print(f"monitored / unmonitored: {on['tok_s'] / off['tok_s']:.2f}  (goal >= 0.90)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
