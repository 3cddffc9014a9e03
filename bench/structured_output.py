"""Structured-output benchmark on the demo model, measured side by side in one run.

1. Decode throughput of constrained vs unconstrained generation: closed-loop
   gRPC clients against one batched engine, the same number of tokens per
   request either way (a fixed-length JSON array of digits vs free text run to
   the same length with ignore_eos). Target: the constrained path costs under
   25 % of unconstrained throughput once its grammar is cached.
2. Grammar compile time, cold (a schema never seen) vs cached (the same
   schema again, key order shuffled), over the test corpus of schemas.

Usage: python bench/structured_output.py [--clients 1,8,32] [--requests 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from millm.v1 import generation_service_pb2_grpc  # noqa: E402
from tests import harness  # noqa: E402
from tests.grpc_helpers import chat_request  # noqa: E402
from tests.schema_corpus import SCHEMAS  # noqa: E402

DIGITS = 48  # array length: "[d,d,...]" is about 2 tokens per item
ARRAY = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
         "minItems": DIGITS, "maxItems": DIGITS}


async def one(stub, constrained: bool, tokens: int) -> tuple[int, float]:
    request = chat_request("Count for me.", temperature=1.0,
                           **({} if constrained else {"max_tokens": tokens, "ignore_eos": True}))
    if constrained:
        request.response_format.json_schema.name = "digits"
        request.response_format.json_schema.schema_json = json.dumps(ARRAY)
    started, produced, text = time.perf_counter(), 0, []
    async for response in stub.Generate(request, timeout=600):
        text.extend(c.text for c in response.choices)
        if response.HasField("usage"):
            produced = response.usage.completion_tokens
    if constrained:
        assert len(json.loads("".join(text))) == DIGITS
    return produced, time.perf_counter() - started


async def load(stub, clients: int, requests: int, constrained: bool, tokens: int) -> float:
    produced = 0

    async def client():
        nonlocal produced
        for _ in range(max(1, requests // clients)):
            got, _ = await one(stub, constrained, tokens)
            produced += got  # after the await: `x += await f()` would lose updates

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return produced / (time.perf_counter() - started)


async def throughput(port: int, clients_list: list[int], requests: int, rounds: int):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        tokens, _ = await one(stub, True, 0)  # warms the grammar cache; the length to match
        rows = []
        for clients in clients_list:
            free, constrained = [], []
            for _ in range(rounds):  # alternate, and report medians
                free.append(await load(stub, clients, requests, False, tokens))
                constrained.append(await load(stub, clients, requests, True, tokens))
            rows.append((clients, statistics.median(free), statistics.median(constrained)))
        return tokens, rows


def compile_times() -> tuple[float, float, int]:
    import transformers

    from service.grammars import GrammarCache
    from service.structured_output import JSON_SCHEMA, Constraint, check_schema

    tokenizer = transformers.AutoTokenizer.from_pretrained(harness.models_dir() / "millm-tiny")
    cache = GrammarCache.for_huggingface(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    constraints = [Constraint(JSON_SCHEMA, "s", check_schema(json.dumps(s)))
                   for s in SCHEMAS.values()]
    shuffled = [Constraint(JSON_SCHEMA, "s", dict(reversed(list(c.schema.items()))))
                for c in constraints]
    cold, cached = [], []
    for c in constraints:
        started = time.perf_counter()
        cache.get(c)
        cold.append(time.perf_counter() - started)
    for c in shuffled:
        started = time.perf_counter()
        cache.get(c)
        cached.append(time.perf_counter() - started)
    return statistics.median(cold) * 1000, statistics.median(cached) * 1000, len(constraints)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    cpus = sorted(os.sched_getaffinity(0))
    engine_cpus = {cpus[0]} if len(cpus) > 1 else None
    if engine_cpus:
        os.sched_setaffinity(0, set(cpus[1:]))
    with tempfile.TemporaryDirectory() as tmp:
        engine, port = harness.start_engine(pathlib.Path(tmp), engine_cpus)
        try:
            harness.wait_serving(engine, port)
            tokens, rows = asyncio.run(throughput(port, clients, args.requests, args.rounds))
        finally:
            engine.stop()
    cold, cached, count = compile_times()

    print(f"\nmillm-tiny over gRPC, {tokens} tokens per request (a {DIGITS}-digit JSON array vs "
          f"free text of the same length), medians of {args.rounds} alternating rounds\n")
    print(f"{'clients':>7} | {'free tok/s':>10} | {'constrained tok/s':>17} | {'cost':>6}")
    for n, free, constrained in rows:
        print(f"{n:>7} | {free:>10.0f} | {constrained:>17.0f} | {1 - constrained / free:>6.0%}")
    print(f"\ngrammar compile over {count} corpus schemas, median: cold {cold:.2f} ms, "
          f"cached {cached:.3f} ms ({cold / cached:.0f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
