"""The stack's own ceiling: tokens a second when the model costs almost nothing.

On a GPU a small model's decode step is a fraction of a millisecond, so what a
token costs beyond the model (gRPC messages, the bridge's parsing and SSE
writes, the engine's per-row Python) is the first limit a user hits. This
bench measures it where the model is also almost free: the demo model's Q8_0
GGUF file (2 layers, 64 wide: a decode step is about 0.1 ms of llama.cpp), served
three ways on the same cores, the clients on the others:

- miLLM through its REST bridge (what OpenAI clients use), streamed;
- miLLM's engine over gRPC directly (internal services), streamed;
- llama.cpp's llama-server on the same file, streamed (its whole C++ process).

At each number of closed-loop streams (default 1, 4, 16, 64, 256; every
request greedy, `ignore_eos`, the same completion length) it prints tokens a
second and the CPU each process spends per token (from /proc, so it holds on a
busy machine): miLLM's engine and bridge, the engine alone over gRPC, and
llama-server. Settings are gguf_peer.py's, pinned and printed (8 slots, one
unified KV cache, flash attention off on both, one llama.cpp thread per stack
core). Medians of --rounds rounds; the servers alternate which goes first.

Usage: python bench/ceiling.py [--streams 1,4,16,64,256] [--rounds 3] [--tokens 32]
       [--stack-cpus 1] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import gguf_peer  # noqa: E402
from bench.proc_cpu import process_seconds  # noqa: E402
from tests.grpc_helpers import chat_request, timed_generate  # noqa: E402

MODEL = "demo-Q8_0"
SIDES = ("miLLM REST", "miLLM gRPC", "llama-server")


def requests_per_stream(streams: int) -> int:
    """About 256 or more tokens' worth of requests a cell at 32 tokens each."""
    return max(1, 8 // streams) if streams < 8 else 1


async def grpc_cell(stacks: gguf_peer.Stacks, streams: int, per_stream: int,
                    tokens: int) -> dict:
    """Closed-loop gRPC streams straight to the engine: tokens/s and the
    engine's CPU per token."""
    import grpc

    from millm.v1 import generation_service_pb2_grpc

    generated = 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{stacks.grpc_port}") as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)

        async def stream(c: int):
            nonlocal generated
            for r in range(per_stream):
                request = chat_request(gguf_peer.PROMPTS[(c + r) % len(gguf_peer.PROMPTS)],
                                       model=stacks.model_id, temperature=0,
                                       max_tokens=tokens, ignore_eos=True)
                request.stream = True
                _, produced = await timed_generate(stub, request)
                generated += produced

        engine = stacks.pids["miLLM"]["engine"]
        before, started = process_seconds(engine), time.perf_counter()
        await asyncio.gather(*(stream(c) for c in range(streams)))
        elapsed, cpu = time.perf_counter() - started, process_seconds(engine) - before
    return {"tokens_per_s": generated / elapsed,
            "cpu_ms_per_token": {"engine": 1000 * cpu / generated}}


def one_cell(side: str, stacks: gguf_peer.Stacks, streams: int, tokens: int) -> dict:
    per_stream = requests_per_stream(streams)
    if side == "miLLM gRPC":
        return asyncio.run(grpc_cell(stacks, streams, per_stream, tokens))
    server = "miLLM" if side == "miLLM REST" else "llama-server"
    return asyncio.run(gguf_peer.cell(server, stacks, streams, per_stream, tokens, True))


def measure(stacks: gguf_peer.Stacks, levels: list[int], rounds: int, tokens: int) -> dict:
    runs: dict = {}
    for side in SIDES:  # warm-up
        one_cell(side, stacks, 2, 8)
    for r in range(rounds):
        order = SIDES if r % 2 == 0 else SIDES[::-1]
        for side in order:
            for streams in levels:
                runs.setdefault((side, streams), []).append(one_cell(side, stacks, streams,
                                                                     tokens))
        print(f"  round {r + 1}/{rounds} done", flush=True)
    return runs


def summary(runs: dict, levels: list[int]) -> list[dict]:
    rows = []
    for streams in levels:
        row = {"streams": streams}
        for side in SIDES:
            cells = runs[(side, streams)]
            row[side] = {
                "tokens_per_s": statistics.median(c["tokens_per_s"] for c in cells),
                "cpu_ms_per_token": {
                    name: statistics.median(c["cpu_ms_per_token"][name] for c in cells)
                    for name in cells[0]["cpu_ms_per_token"]}}
        rows.append(row)
    return rows


def report(rows: list[dict], args) -> None:
    print(f"\nthe stack's ceiling on the demo model's Q8_0 file (decode ~0.1 ms a step): "
          f"{args.tokens} tokens a request, streamed, greedy, ignore_eos; stacks on "
          f"{args.stack_cpus} core(s); medians of {args.rounds} rounds")
    print(f"{'streams':>7} | {'REST tok/s':>10} {'gRPC tok/s':>10} {'llama-server':>12} | "
          f"{'REST/llama':>10} {'gRPC/llama':>10} | CPU ms/token: engine+bridge (REST), "
          "engine (gRPC), llama-server")
    for row in rows:
        rest, grpc_, native = (row[s] for s in SIDES)
        cpu = rest["cpu_ms_per_token"]
        print(f"{row['streams']:>7} | {rest['tokens_per_s']:>10.0f} "
              f"{grpc_['tokens_per_s']:>10.0f} {native['tokens_per_s']:>12.0f} | "
              f"{rest['tokens_per_s'] / native['tokens_per_s']:>10.2f} "
              f"{grpc_['tokens_per_s'] / native['tokens_per_s']:>10.2f} | "
              f"{cpu['engine']:.3f}+{cpu['bridge']:.3f}, "
              f"{grpc_['cpu_ms_per_token']['engine']:.3f}, "
              f"{native['cpu_ms_per_token']['llama-server']:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", default="1,4,16,64,256")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--stack-cpus", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    levels = [int(s) for s in args.streams.split(",") if s]
    cpus = gguf_peer.cpu_sets(args.stack_cpus)
    with tempfile.TemporaryDirectory() as tmp:
        models, model_id = gguf_peer.model_files(pathlib.Path(tmp), [MODEL], None)[MODEL]
        stacks = gguf_peer.Stacks(pathlib.Path(tmp), models, model_id, cpus,
                                  gguf_peer.FLASH_ATTN)
        try:
            print(f"llama-server flags: {' '.join(stacks.flags)}", flush=True)
            rows = summary(measure(stacks, levels, args.rounds, args.tokens), levels)
        finally:
            stacks.stop()
    report(rows, args)
    if args.json:
        print(json.dumps({"model": MODEL, "tokens": args.tokens, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
