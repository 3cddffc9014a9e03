"""Routing benchmark: round-robin against the load/prefix router, side by side.

Two engines, one core each (pinned), each with a prefix cache that holds about
half of the workload's system prompts (--cache-tokens), and two bridges over
the same two engines: one with MILLM_ROUTING=round_robin, one with the default
load_prefix (rest_bridge/routing/). The workload is chat requests through the
OpenAI SDK, streamed, from --clients closed-loop clients; each request takes
one of --prompts long system prompts at random (seeded) and its own question.
Round-robin sends every prompt to both engines, so each cache churns through
all of them; the router keeps each prompt on one engine, so each cache holds
its share.

Rounds alternate the policies (round_robin, load_prefix, round_robin, ...),
and every round starts with both engines' prefix caches cleared
(ServerService.ClearPrefixCache), so neither policy inherits the other's cache.
Printed per policy: the prefix-cache hit rate (cached prompt tokens / prompt
tokens, from each stream's usage), TTFT p50/p95 (request sent to first content
token, client side), requests per second, and how the requests split over the
engines; then the router's ratios to round-robin.

Usage: python bench/routing.py [--clients 8] [--requests 160] [--rounds 2]
                               [--prompts 8] [--prompt-chars 1800] [--cache-tokens 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import random
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import openai  # noqa: E402

from millm.v1 import server_service_pb2, server_service_pb2_grpc  # noqa: E402
from tests import harness  # noqa: E402
from tests.http_helpers import call  # noqa: E402

MODEL = "millm-tiny"
POLICIES = ("round_robin", "load_prefix")
TOPICS = ["the harbour office", "a mountain hut", "the city library", "a night train",
          "the market hall", "a lighthouse keeper", "the weather station", "a river ferry",
          "the bakery", "a school garden", "the museum desk", "a forest ranger"]


def system_prompt(i: int, chars: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    text = f"You are assistant number {i}, the helper of {topic}. "
    filler = (f"Answer briefly and kindly about {topic}, name times and places, "
              "and never invent what you do not know. ")
    while len(text) < chars:
        text += filler
    return text[:chars]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def one_request(client: openai.AsyncOpenAI, system: str, question: str) -> tuple:
    started = time.perf_counter()
    ttft, usage = None, None
    stream = await client.chat.completions.create(
        model=MODEL, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}])
    async for chunk in stream:
        if ttft is None and chunk.choices and chunk.choices[0].delta.content:
            ttft = time.perf_counter() - started
        if chunk.usage is not None:
            usage = chunk.usage
    return ttft if ttft is not None else time.perf_counter() - started, usage


async def run_round(http: int, args, systems: list[str], seed: int) -> dict:
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{http}/v1", api_key="none",
                                max_retries=0, timeout=120)
    rng = random.Random(seed)
    jobs = [(rng.randrange(len(systems)), n) for n in range(args.requests)]
    queue = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    ttfts, prompt_tokens, cached = [], 0, 0

    async def worker():
        nonlocal prompt_tokens, cached
        while not queue.empty():
            which, n = queue.get_nowait()
            ttft, usage = await one_request(client, systems[which],
                                            f"Question {n}: what should I know today?")
            ttfts.append(ttft)
            prompt_tokens += usage.prompt_tokens
            cached += usage.prompt_tokens_details.cached_tokens

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(args.clients)))
    elapsed = time.perf_counter() - started
    await client.close()
    return {"ttfts": ttfts, "prompt_tokens": prompt_tokens, "cached": cached,
            "seconds": elapsed, "requests": len(ttfts)}


def routable(http: int, replicas: int, timeout: float = 30.0) -> None:
    """Wait until a load_prefix bridge's metrics call every replica routable
    (a round_robin bridge has no router, nor these metrics)."""
    deadline = time.monotonic() + timeout
    while True:
        up = sum(line.startswith("millm_bridge_replica_routable{") and line.endswith(" 1.0")
                 for line in call(http, "GET", "/metrics").text.splitlines())
        if up == replicas:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"only {up} of {replicas} replicas became routable")
        time.sleep(0.05)


def served(stubs, before: list[int], requests: int, timeout: float = 10.0) -> list[int]:
    """Per engine, the generations completed since `before`, once they add up to
    the round's requests (or after `timeout` seconds, as they are then)."""
    deadline = time.monotonic() + timeout
    while True:
        split = [completed(s) - b for s, b in zip(stubs, before, strict=True)]
        if sum(split) >= requests or time.monotonic() > deadline:
            return split
        time.sleep(0.02)


def engine_stub(port: int):
    return server_service_pb2_grpc.ServerServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))


def completed(stub) -> int:
    return stub.GetInferenceStatus(
        server_service_pb2.GetInferenceStatusRequest()).completed_generations_total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=160, help="per round")
    parser.add_argument("--rounds", type=int, default=2, help="per policy")
    parser.add_argument("--prompts", type=int, default=8, help="distinct system prompts")
    parser.add_argument("--prompt-chars", type=int, default=1800)
    parser.add_argument("--cache-tokens", type=int, default=3000,
                        help="each engine's MILLM_PREFIX_CACHE_TOKENS")
    args = parser.parse_args()
    systems = [system_prompt(i, args.prompt_chars) for i in range(args.prompts)]
    cores = sorted(os.sched_getaffinity(0))
    pins = [{cores[0]}, {cores[1 % len(cores)]}]
    processes = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = pathlib.Path(tmp_name)
        try:
            engines = []
            for i, pin in enumerate(pins):
                (tmp / f"e{i}").mkdir()
                process, port = harness.start_engine(
                    tmp / f"e{i}", cpus=pin, MILLM_PREFIX_CACHE_TOKENS=str(args.cache_tokens))
                processes.append(process)
                engines.append(port)
            for process, port in zip(processes, engines, strict=True):
                harness.wait_serving(process, port)
            targets = ",".join(f"127.0.0.1:{p}" for p in engines)
            bridges = {}
            for policy in POLICIES:
                process, http = harness.start_bridge(tmp, engines[0], MILLM_ROUTING=policy,
                                                     MILLM_ENGINE_TARGETS=targets)
                processes.append(process)
                harness.wait_http(process, f"http://127.0.0.1:{http}/readyz")
                bridges[policy] = http
            routable(bridges["load_prefix"], len(engines))  # its load streams are up
            stubs = [engine_stub(p) for p in engines]
            results = {p: [] for p in POLICIES}
            splits = {p: [0, 0] for p in POLICIES}
            print(f"2 engines (cores {pins[0]} and {pins[1]}), prefix cache {args.cache_tokens} "
                  f"tokens each; {args.prompts} system prompts of {args.prompt_chars} chars; "
                  f"{args.clients} clients, {args.requests} requests a round", flush=True)
            for round_ in range(args.rounds):
                for policy in POLICIES:
                    for stub in stubs:
                        stub.ClearPrefixCache(server_service_pb2.ClearPrefixCacheRequest())
                    before = [completed(s) for s in stubs]
                    result = asyncio.run(run_round(bridges[policy], args, systems,
                                                   seed=round_))
                    # An engine counts a generation just after answering it.
                    split = served(stubs, before, result["requests"])
                    for i, n in enumerate(split):
                        splits[policy][i] += n
                    results[policy].append(result)
                    print(f"  round {round_ + 1} {policy:12s} hit rate "
                          f"{result['cached'] / result['prompt_tokens']:.3f}  TTFT p50 "
                          f"{statistics.median(result['ttfts']) * 1000:.1f} ms", flush=True)
            report(results, splits)
        finally:
            for process in processes:
                process.stop()


def report(results: dict, splits: dict) -> None:
    summary = {}
    print(f"\n{'policy':12s} {'hit rate':>9s} {'TTFT p50':>10s} {'TTFT p95':>10s} "
          f"{'req/s':>7s}  split (engine 0 / engine 1)")
    for policy, rounds in results.items():
        ttfts = [t for r in rounds for t in r["ttfts"]]
        hit = sum(r["cached"] for r in rounds) / sum(r["prompt_tokens"] for r in rounds)
        rate = sum(r["requests"] for r in rounds) / sum(r["seconds"] for r in rounds)
        p50, p95 = statistics.median(ttfts), percentile(ttfts, 95)
        summary[policy] = (hit, p50, p95, rate)
        print(f"{policy:12s} {hit:9.3f} {p50 * 1000:8.1f}ms {p95 * 1000:8.1f}ms {rate:7.1f}  "
              f"{splits[policy][0]} / {splits[policy][1]}")
    rr, lp = summary["round_robin"], summary["load_prefix"]
    print(f"\nload_prefix vs round_robin: hit rate {lp[0]:.3f} vs {rr[0]:.3f}; "
          f"TTFT p50 x{lp[1] / rr[1]:.2f}, p95 x{lp[2] / rr[2]:.2f}; "
          f"throughput x{lp[3] / rr[3]:.2f}")


if __name__ == "__main__":
    main()
