"""Fair admission, measured: the latency of small requests beside ordinary load,
and beside ordinary load plus a maximal request, side by side in one run.

Transformers engines from the same checkpoint, then a GGUF one, one after the
other (never two busy at once): "fair" (the defaults: a request holds at most half the batch, later
requests pass one that does not fit for MILLM_ADMISSION_AGING_S), and "fifo"
(one request may hold the whole batch and nothing passes: the admission before
issue 18). In each, 8 long streams run; then small requests (2 tokens) are sent
one after another, first alone beside the streams, then beside the streams and
an n=64 request. Printed: p50/p95 of the small requests, the decode step time
of the streams, and how many decode steps the maximal request adds to a small
request's p95 (target: a few).

"gguf" (the GGUF export, Q8_0): one seeded request of 800 tokens starts, and
once its first token is back a 4-token unseeded request is sent beside it.
Seeded rows decode in lanes of their own (engines/gguf/lanes.py), so the
short request should not wait for the long one. Printed per run: the short
request's latency, the long request's whole time, and their ratio (target:
at most 0.2; while seeded GGUF requests ran alone it was 0.78).

"long" (issue 27): one greedy stream runs; a long prompt (--long-rules, about
20 tokens a rule with the demo tokenizer; the default 1,000 make ~20,000, an
agent's system prompt and tools) is sent beside it. Printed per engine, side by side: the stream's
median step before, its longest gap between tokens while the long prompt was
read (from sending it to its first token), the tokens it got meanwhile, and
the long request's time to first token. Engines: the transformers engine with
prefill chunks of 512 (the default) and 64 tokens, with chunking off (the
whole prompt in one forward pass, as before), and the GGUF engine (its batch
takes decoding rows first and at most n_batch = 512 prompt tokens a step).
Target: the longest gap stays within a few steps when chunked.

"priority" (issue 46): each engine with 8 rows runs 12 background streams
(priority 1, a batch's lines: 7 run, the reserve row stays free, 5 wait) and
the same 12 at priority 0 (8 run, 4 wait); small requests at priority 0 are
sent one after another beside each, and alone. Printed per engine: their p50
and p95 time to first token alone, beside the background and beside the
same load at priority 0, and the p95 beside background over alone (target:
under 2, "within a few decode steps").

Usage: python bench/admission.py [--small 20] [--stream-tokens 600]
                                 [--engines fair,fifo,gguf,long,priority] [--gguf-runs 5]
                                 [--long-rules 1000] [--long-runs 3]
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
GGUF_MODEL = "millm-tiny-gguf:Q8_0"
LONG_ENGINES = {
    "chunk 512": {},
    "chunk 64": {"MILLM_PREFILL_CHUNK_TOKENS": "64"},
    "one pass": {"MILLM_PREFILL_CHUNK_TOKENS": "1000000"},
    "gguf": {"MILLM_MODEL": GGUF_MODEL},
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


async def small_latencies(stub, count: int, model: str | None = None,
                         first: bool = False) -> list[float]:
    """Each small request's whole time (`first`: its time to first token)."""
    out = []
    extra = {"model": model} if model else {}
    for i in range(count):
        started = time.perf_counter()
        async for response in stub.Generate(prompt_request(f"Small {i}", max_tokens=2,
                                                           temperature=0, **extra),
                                            timeout=600):
            if first and response.choices:
                break
        out.append(time.perf_counter() - started)
        await asyncio.sleep(0.05)
    return out


async def beside_background(port: int, model: str, small: int, stream_tokens: int,
                            priority: int | None) -> list[float]:
    """Small requests' times to first token beside 12 streams at `priority`
    (None: alone)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        gaps: list[float] = []
        stop = asyncio.Event()
        load = [] if priority is None else [asyncio.create_task(stream_gaps(
            stub, prompt_request(f"Background {i} ran", model=model, priority=priority,
                                 max_tokens=stream_tokens, temperature=1.0, ignore_eos=True),
            gaps, stop)) for i in range(12)]
        while load and len(gaps) < 40:
            await asyncio.sleep(0.01)
        latencies = await small_latencies(stub, small, model, first=True)
        stop.set()
        for task in load:
            task.cancel()
        await asyncio.gather(*load, return_exceptions=True)
        await asyncio.sleep(0.5)
        return latencies


def priority_rows(args, tmp: pathlib.Path) -> None:
    print("priority: small requests' time to first token (ms, p50 / p95), 8 rows, reserve 1")
    for model in ("millm-tiny", GGUF_MODEL):
        folder = tmp / f"priority-{len(model)}"
        folder.mkdir()
        engine, port = harness.start_engine(folder, None,
                                            MILLM_MODEL=model, MILLM_MAX_BATCH="8",
                                            MILLM_GGUF_SLOTS="8")
        try:
            harness.wait_serving(engine, port)
            runs = {name: asyncio.run(beside_background(port, model, args.small,
                                                        args.stream_tokens, priority))
                    for name, priority in (("alone", None), ("beside background", 1),
                                           ("beside the same at 0", 0))}
        finally:
            engine.stop()
        cells = "  ".join(f"{name}: {pct(v, 0.5) * 1e3:.1f} / {pct(v, 0.95) * 1e3:.1f}"
                          for name, v in runs.items())
        ratio = pct(runs["beside background"], 0.95) / pct(runs["alone"], 0.95)
        print(f"  {model:<22} {cells}  p95 beside background / alone: {ratio:.2f} "
              f"(target: under 2)")


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


async def short_beside_seeded(port: int, long_tokens: int, short_tokens: int
                              ) -> tuple[float, float, float]:
    """(the short request alone, the short request beside the seeded one, the
    seeded one's whole time), in seconds."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)

        def short():
            return prompt_request("The short one", model=GGUF_MODEL, max_tokens=short_tokens,
                                  temperature=0, ignore_eos=True)

        async def timed(request) -> float:
            started = time.perf_counter()
            async for _ in stub.Generate(request, timeout=600):
                pass
            return time.perf_counter() - started

        alone = await timed(short())
        first = asyncio.Event()
        started = time.perf_counter()

        async def seeded() -> float:
            async for response in stub.Generate(prompt_request(
                    "A seeded story", model=GGUF_MODEL, max_tokens=long_tokens, temperature=1.0,
                    seed=7, ignore_eos=True), timeout=600):
                if response.choices:
                    first.set()
            return time.perf_counter() - started

        long = asyncio.create_task(seeded())
        await first.wait()
        beside = await timed(short())
        return alone, beside, await long


def long_text(rules: int, run: int) -> str:
    return " ".join(f"Rule {i}: keeper {run} lights lamp {i} at dusk and logs ship {i * 7}."
                    for i in range(rules))


async def stall_beside_long(port: int, model: str, rules: int, run: int) -> dict:
    """A stream's gaps while a long prompt is read (module docstring)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        times: list[float] = []  # arrival of each stream token
        stop = asyncio.Event()

        async def stream() -> None:
            async for response in stub.Generate(prompt_request(
                    f"Stream {run}", model=model, max_tokens=900, temperature=0,
                    ignore_eos=True), timeout=600):
                now = time.perf_counter()
                times.extend(now for c in response.choices for _ in c.token_ids)
                if stop.is_set():
                    return

        task = asyncio.create_task(stream())
        while len(times) < 30:
            await asyncio.sleep(0.005)
        step = (times[-1] - times[-21]) / 20  # (a slow reader gets merged steps)
        sent = time.perf_counter()
        first = None
        async for response in stub.Generate(prompt_request(
                long_text(rules, run), model=model, max_tokens=4, temperature=0,
                ignore_eos=True), timeout=600):
            if first is None and any(c.token_ids for c in response.choices):
                first = time.perf_counter()
        stop.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        during = [t for t in times if sent <= t <= first]
        edges = [sent, *during, first]
        return {"step": step, "gap": max(b - a for a, b in zip(
            edges, edges[1:], strict=False)), "tokens": len(during), "ttft": first - sent}


def long_rows(args, tmp: pathlib.Path) -> None:
    rows = {}
    for name, env in LONG_ENGINES.items():
        folder = tmp / name.replace(" ", "-")
        folder.mkdir()
        engine, port = harness.start_engine(folder, **env)
        model = env.get("MILLM_MODEL", "millm-tiny")
        try:
            harness.wait_serving(engine, port)
            asyncio.run(stall_beside_long(port, model, 2, -1))  # warm up
            runs = [asyncio.run(stall_beside_long(port, model, args.long_rules, i))
                    for i in range(args.long_runs)]
        finally:
            engine.stop()
        rows[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"a long prompt ({args.long_rules} rules, ~{args.long_rules * 20} tokens) sent "
          f"beside one greedy stream; medians of {args.long_runs} runs")
    print(f"{'engine':<11}{'step ms':>9}{'max gap ms':>12}{'gap/step':>10}{'tokens':>8}"
          f"{'TTFT ms':>9}")
    for name, r in rows.items():
        print(f"{name:<11}{r['step'] * 1e3:>9.1f}{r['gap'] * 1e3:>12.1f}"
              f"{r['gap'] / r['step']:>10.1f}{r['tokens']:>8.0f}{r['ttft'] * 1e3:>9.1f}")


def transformers_rows(args, tmp: pathlib.Path, names: list[str]) -> None:
    rows = {}
    for name in names:
        folder = tmp / name
        folder.mkdir()
        engine, port = harness.start_engine(folder, **ENGINES[name])
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
    for name in names:
        plain, loaded = rows[(name, False)], rows[(name, True)]
        added = (loaded["p95"] - plain["p95"]) / loaded["step"]
        print(f"{name}: the n=64 request adds {added:.1f} decode steps to the small requests' "
              f"p95 ({loaded['p95'] / plain['p95']:.2f}x)")


def gguf_rows(args, tmp: pathlib.Path) -> None:
    folder = tmp / "gguf"
    folder.mkdir()
    engine, port = harness.start_engine(folder, MILLM_MODEL=GGUF_MODEL)
    try:
        harness.wait_serving(engine, port)
        runs = [asyncio.run(short_beside_seeded(port, 800, 4)) for _ in range(args.gguf_runs)]
    finally:
        engine.stop()
    print(f"GGUF ({GGUF_MODEL}): a 4-token request sent beside one seeded 800-token request")
    print(f"{'run':<5}{'alone ms':>10}{'beside ms':>11}{'seeded ms':>11}{'ratio':>8}")
    for i, (alone, beside, whole) in enumerate(runs):
        print(f"{i:<5}{alone * 1e3:>10.1f}{beside * 1e3:>11.1f}{whole * 1e3:>11.1f}"
              f"{beside / whole:>8.3f}")
    worst = max(beside / whole for _, beside, whole in runs)
    print(f"gguf: the short request took at most {worst:.3f} of the seeded request's time "
          f"(target: at most 0.2)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", type=int, default=20)
    parser.add_argument("--stream-tokens", type=int, default=600)
    parser.add_argument("--engines", default="fair,fifo,gguf,long,priority")
    parser.add_argument("--gguf-runs", type=int, default=5)
    parser.add_argument("--long-rules", type=int, default=1000)
    parser.add_argument("--long-runs", type=int, default=3)
    args = parser.parse_args()
    names = args.engines.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        chosen = [name for name in ENGINES if name in names]
        if chosen:
            transformers_rows(args, pathlib.Path(tmp), chosen)
        if "gguf" in names:
            gguf_rows(args, pathlib.Path(tmp))
        if "long" in names:
            long_rows(args, pathlib.Path(tmp))
        if "priority" in names:
            priority_rows(args, pathlib.Path(tmp))


if __name__ == "__main__":
    main()
