"""Steering benchmark on the demo model: what per-request steering costs, side by side.

Starts one engine with continuous batching and one forced to serve a single
request at a time (MILLM_BATCHING=serial, which is how servers that swap a
global steering configuration per request have to run them), attaches the demo
SAE on both, saves one profile per client, and drives closed-loop gRPC clients
(each sends its next request when the previous one ends) in three mixes:

  - unsteered: no request names a profile;
  - steered: every request names its client's own profile (all different);
  - mixed: every other client names its profile.

It prints aggregate tokens/s and time to first token (p50) for each mix on
both engines, and the ratios: steered / unsteered on the batched engine
(what per-row deltas cost; target >= 0.8) and batched / serial for steered
traffic (what batching steered requests together gains).

Usage: python bench/steering.py [--clients 16] [--tokens 48] [--requests 4]
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from millm.v1 import (  # noqa: E402
    steering_pb2,
    steering_service_pb2,
    steering_service_pb2_grpc,
)
from tests import harness  # noqa: E402
from tests.grpc_helpers import chat_request, closed_loop  # noqa: E402

SAE = "sae_millm-tiny-res-l1"
PROMPTS = ["Tell me about the sea.", "What is a library?", "Describe a garden.",
           "How do trains work?"]


async def setup(target: str, clients: int) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = steering_service_pb2_grpc.SteeringServiceStub(channel)
        await stub.AttachSae(steering_service_pb2.AttachSaeRequest(sae_id=SAE))
        for c in range(clients):
            await stub.CreateProfile(steering_service_pb2.CreateProfileRequest(
                name=f"client-{c}", entries=[
                    steering_pb2.SteeringEntry(layer=1, feature=(7 * c) % 256, strength=4.0),
                    steering_pb2.SteeringEntry(layer=1, feature=(7 * c + 3) % 256,
                                               strength=-2.0)]))


async def load(target: str, mix: str, clients: int, requests: int, tokens: int) -> dict:
    def request(c: int, r: int):
        pb = chat_request(PROMPTS[(c + r) % len(PROMPTS)], max_tokens=tokens,
                          temperature=1.0, ignore_eos=True)
        if mix == "steered" or (mix == "mixed" and c % 2 == 0):
            pb.profile = f"client-{c}"
        return pb

    return await closed_loop(target, clients, requests, request)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--requests", type=int, default=4, help="per client")
    args = parser.parse_args()
    engines = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for kind in ("batched", "serial"):
                data = pathlib.Path(tmp) / kind
                data.mkdir()
                env = {"MILLM_BATCHING": "serial"} if kind == "serial" else {}
                engines[kind] = harness.start_engine(data, MILLM_LOG_LEVEL="WARNING", **env)
            for process, port in engines.values():
                harness.wait_serving(process, port)
                asyncio.run(setup(f"127.0.0.1:{port}", args.clients))
            results = {}
            # Alternate the engines and mixes so drift in machine speed hits all alike.
            for mix in ("unsteered", "steered", "mixed"):
                for kind, (_, port) in engines.items():
                    results[(kind, mix)] = asyncio.run(load(
                        f"127.0.0.1:{port}", mix, args.clients, args.requests, args.tokens))
        finally:
            for process, _ in engines.values():
                process.stop()

    print(f"steering benchmark: {args.clients} clients x {args.requests} requests x "
          f"{args.tokens} tokens, chat, temperature 1, one profile per client")
    print(f"{'mix':<10} {'batched tok/s':>14} {'p50 ms':>8} {'serial tok/s':>13} {'p50 ms':>8}")
    for mix in ("unsteered", "steered", "mixed"):
        b, s = results[("batched", mix)], results[("serial", mix)]
        print(f"{mix:<10} {b['tok_s']:>14.0f} {b['p50']:>8.1f} {s['tok_s']:>13.0f} "
              f"{s['p50']:>8.1f}")
    cost = results[("batched", "steered")]["tok_s"] / results[("batched", "unsteered")]["tok_s"]
    gain = results[("batched", "steered")]["tok_s"] / results[("serial", "steered")]["tok_s"]
    print(f"steered / unsteered (batched): {cost:.2f}  (target >= 0.80)")
    print(f"batched / serial (steered):    {gain:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
