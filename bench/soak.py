"""A soak: 10,000 mixed requests through the bridge, watching for leaks.

One engine and bridge on the demo model. 16 concurrent clients send a mix:
chat and completions with n 1-4, 30 % of them dropped by the client mid-way
(a closed connection, streamed or not), 5 % structured output, some steered by
a saved profile, some scoring. Every 1,000 requests it prints the engine's and
the bridge's resident memory and the KV tokens the engine holds; at the end KV
must be back to 0, no request may have been answered 5xx, and resident memory
must have grown less than 10 % since the first report (the first 1,000
requests warm caches and allocators up). It exits 1 when a target is missed.

Usage: python bench/soak.py [--requests 10000] [--clients 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import random
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from millm.v1 import server_service_pb2, server_service_pb2_grpc  # noqa: E402
from tests import harness  # noqa: E402
from tests.http_helpers import call  # noqa: E402

MODEL = "millm-tiny"
SAE = "sae_millm-tiny-res-l1"
WORDS = ["river", "market", "lighthouse", "garden", "train", "cat", "storm", "letter"]


def rss_kib(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def body_for(rng: random.Random) -> tuple[str, dict]:
    word = rng.choice(WORDS)
    roll = rng.random()
    if roll < 0.05:
        return "/v1/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": f"A {word} as JSON."}],
            "response_format": {"type": "json_object"}, "max_tokens": 24}
    if roll < 0.12:
        return "/v1/completions", {"model": MODEL, "prompt": f"The {word}", "max_tokens": 1,
                                   "logprobs": 2}
    if roll < 0.25:
        return "/v1/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": f"Tell me of the {word}."}],
            "profile": "soak", "max_tokens": rng.randint(4, 24)}
    n = rng.randint(1, 4)
    stream = n == 1 and rng.random() < 0.5
    if rng.random() < 0.5:
        return "/v1/completions", {"model": MODEL, "prompt": f"The {word} was", "n": n,
                                   "max_tokens": rng.randint(4, 32), "stream": stream}
    return "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": f"Where is the {word}?"}],
        "n": n, "max_tokens": rng.randint(4, 32), "stream": stream}


async def send(port: int, path: str, body: dict, drop: bool, rng: random.Random) -> int:
    """One request on a bare connection; a dropped one closes it mid-way. Returns
    the HTTP status (0 when dropped before it came)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    await writer.drain()
    try:
        if drop:
            await asyncio.sleep(rng.uniform(0.0, 0.05))
            return 0
        head = await reader.readline()
        await reader.read()
        return int(head.split()[1])
    finally:
        writer.close()


async def soak(port: int, grpc_port: int, engine_pid: int, bridge_pid: int,
               requests: int, clients: int) -> list[dict]:
    rng = random.Random(20261201)
    reports, statuses = [], {}
    done = 0
    lock = asyncio.Lock()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        server = server_service_pb2_grpc.ServerServiceStub(channel)

        async def report():
            status = await server.GetInferenceStatus(
                server_service_pb2.GetInferenceStatusRequest())
            reports.append({"requests": done, "engine_rss_mib": rss_kib(engine_pid) / 1024,
                            "bridge_rss_mib": rss_kib(bridge_pid) / 1024,
                            "kv_tokens": status.kv_tokens_in_use,
                            "statuses": dict(statuses)})
            last = reports[-1]
            print(f"{done:>6} requests  engine {last['engine_rss_mib']:7.1f} MiB  bridge "
                  f"{last['bridge_rss_mib']:6.1f} MiB  KV tokens {last['kv_tokens']:>5}"
                  f"  statuses {dict(sorted(statuses.items()))}", flush=True)

        async def client(seed: int):
            nonlocal done
            own = random.Random(seed)
            while True:
                async with lock:
                    if done >= requests:
                        return
                    done += 1
                    if done % 1000 == 0:
                        await report()
                path, body = body_for(own)
                status = await send(port, path, body, own.random() < 0.3, own)
                statuses[status] = statuses.get(status, 0) + 1

        await asyncio.gather(*(client(rng.randrange(2**32)) for _ in range(clients)))
        # Dropped requests end at the engine's next step; then nothing is held.
        for _ in range(100):
            status = await server.GetInferenceStatus(
                server_service_pb2.GetInferenceStatusRequest())
            if status.active_generations == 0 and status.kv_tokens_in_use == 0:
                break
            await asyncio.sleep(0.1)
        await report()
    return reports


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stack = harness.OwnStack(pathlib.Path(tmp))
        try:
            for method, path, body in [
                    ("POST", f"/api/saes/{SAE}/attach", None),
                    ("POST", "/api/profiles", {"name": "soak", "entries": [
                        {"layer": 1, "feature": 3, "strength": 4}]})]:
                reply = call(stack.http_port, method, path, body)
                assert reply.status_code == 200, reply.text
            started = time.perf_counter()
            reports = asyncio.run(soak(stack.http_port, stack.grpc_port, stack.engine.proc.pid,
                                       stack.bridge.proc.pid, args.requests, args.clients))
            elapsed = time.perf_counter() - started
        finally:
            stack.stop()
    first, last = reports[0], reports[-1]
    engine_growth = last["engine_rss_mib"] / first["engine_rss_mib"] - 1
    bridge_growth = last["bridge_rss_mib"] / first["bridge_rss_mib"] - 1
    five_xx = sum(v for k, v in last["statuses"].items() if k >= 500)
    print(f"{args.requests} requests in {elapsed:.0f} s; 5xx: {five_xx}; KV tokens at the end: "
          f"{last['kv_tokens']} (target 0)")
    print(f"RSS growth since the first report: engine {engine_growth:+.1%}, bridge "
          f"{bridge_growth:+.1%} (target under +10%)")
    missed = [what for what, bad in (
        ("KV tokens held at the end", last["kv_tokens"] != 0),
        ("5xx answers", five_xx > 0),
        ("engine RSS growth", engine_growth >= 0.10),
        ("bridge RSS growth", bridge_growth >= 0.10)) if bad]
    if missed:
        print(f"missed: {', '.join(missed)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
