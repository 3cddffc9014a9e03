"""Fair admission, measured: the latency of small requests beside ordinary load,
and beside ordinary load plus a maximal request, side by side in one run.

Two engines from the same checkpoint, one after the other (never two busy at
once): "fair" (the defaults: a request holds at most half the batch, later
requests pass one that does not fit for MILLM_ADMISSION_AGING_S), and "fifo"
(one request may hold the whole batch and nothing passes: the admission before
issue 18). In each, 8 long streams run; then small requests (2 tokens) are sent
one after another, first alone beside the streams, then beside the streams and
an n=64 request. Printed: p50/p95 of the small requests, the decode step time
of the streams, and how many decode steps the maximal request adds to a small
request's p95 (target: a few).

Usage: python bench/admission.py [--small 20] [--stream-tokens 600]
"""

from __future__ import annotations

import argparse
import asyncio
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
from tests.grpc_helpers import prompt_request  # noqa: E402

ENGINES = {
    "fair": {},
    "fifo": {"MILLM_MAX_ROWS_PER_REQUEST": "64", "MILLM_ADMISSION_AGING_S": "0"},
}


async def stream_gaps(stub, request, gaps: list[float], stop: asyncio.Event) -> None:
    last = None
    async for response in stub.Generate(request, timeout=600):
        now = time.perf_counter()
        if response.choices and last is not None:
            gaps.append(now - last)
        last = now
        if stop.is_set():
            return


async def small_latencies(stub, count: int) -> list[float]:
    out = []
    for i in range(count):
        started = time.perf_counter()
        async for _ in stub.Generate(prompt_request(f"Small {i}", max_tokens=2, temperature=0),
                                     timeout=600):
            pass
        out.append(time.perf_counter() - started)
        await asyncio.sleep(0.05)
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def scenario(port: int, small: int, stream_tokens: int, maximal: bool) -> dict:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        gaps: list[float] = []
        stop = asyncio.Event()
        long = [asyncio.create_task(stream_gaps(
            stub, prompt_request(f"Stream {i} ran", max_tokens=stream_tokens,
                                 temperature=1.0, ignore_eos=True), gaps, stop))
            for i in range(8)]
        while len(gaps) < 40:
            await asyncio.sleep(0.01)
        big = None
        if maximal:
            big = asyncio.create_task(stream_gaps(stub, prompt_request(
                "The maximal request", n=64, max_tokens=stream_tokens, temperature=1.0,
                ignore_eos=True), [], asyncio.Event()))
            await asyncio.sleep(0.2)
        latencies = await small_latencies(stub, small)
        step = statistics.median(gaps)
        stop.set()
        for task in [*long, *([big] if big else [])]:
            task.cancel()
        await asyncio.gather(*long, *([big] if big else []), return_exceptions=True)
        await asyncio.sleep(0.5)
        return {"p50": pct(latencies, 0.5), "p95": pct(latencies, 0.95), "step": step}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", type=int, default=20)
    parser.add_argument("--stream-tokens", type=int, default=600)
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, env in ENGINES.items():
            folder = pathlib.Path(tmp) / name
            folder.mkdir()
            engine, port = harness.start_engine(folder, **env)
            try:
                harness.wait_serving(engine, port)
                for maximal in (False, True):
                    rows[(name, maximal)] = asyncio.run(
                        scenario(port, args.small, args.stream_tokens, maximal))
            finally:
                engine.stop()
    print(f"small requests (2 tokens), {args.small} each, beside 8 streams of "
          f"{args.stream_tokens} tokens; n=64 = plus one request with n=64")
    print(f"{'admission':<10}{'load':<14}{'p50 ms':>10}{'p95 ms':>10}{'step ms':>10}")
    for (name, maximal), r in rows.items():
        print(f"{name:<10}{'+ n=64' if maximal else '8 streams':<14}{r['p50'] * 1e3:>10.1f}"
              f"{r['p95'] * 1e3:>10.1f}{r['step'] * 1e3:>10.1f}")
    for name in ENGINES:
        plain, loaded = rows[(name, False)], rows[(name, True)]
        added = (loaded["p95"] - plain["p95"]) / loaded["step"]
        print(f"{name}: the n=64 request adds {added:.1f} decode steps to the small requests' "
              f"p95 ({loaded['p95'] / plain['p95']:.2f}x)")


if __name__ == "__main__":
    main()
