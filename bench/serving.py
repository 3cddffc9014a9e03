"""Serving benchmark on the demo model: everything measured side by side in one run.

Starts two engines from the same checkpoint, one with continuous batching and
one forced to serve a single request at a time (MILLM_BATCHING=serial), each
with its own bridge, then drives closed-loop streaming clients (each sends its
next request when the previous one ends) and prints:

  1. aggregate tokens/s and time to first token (p50/p95) for 1, 4, 16 and 64
     clients through the bridge, batched vs serial (target: batched >= 8x
     serial at 16 clients);
  2. the same load over gRPC directly, and what the bridge keeps of it
     (target: >= 85% of the throughput, < 5 ms added to p50 TTFT);
  3. a plain transformers generate() loop over the same requests, in this
     process, as the baseline a user would write by hand;
  4. time to first token with a 512-token shared system prompt, prefix cache
     cold vs warm (target: warm / cold <= 0.3). Warm is the next conversation
     under the same system prompt, with a different question.

Every generation runs to its max_tokens (ignore_eos); lengths vary around
--tokens (see request_length). The clients run in this
process. With two or more cores the engines get the first core to themselves
and the bridges and the clients share the rest, as in a deployment where the
engine owns its cores (only one engine is busy at a time); --no-pin lets the
OS schedule everything everywhere, which on two cores measures scheduling
contention between three busy processes more than the bridge.

Usage: python bench/serving.py [--tokens 64] [--clients 1,4,16,64] [--no-pin]
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
import uuid

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from millm.v1 import generation_service_pb2_grpc  # noqa: E402
from tests import harness  # noqa: E402
from tests.grpc_helpers import chat_request, prompt_request, timed_generate  # noqa: E402

MODEL = "millm-tiny"
PROMPTS = ["The river ran", "In the morning the market", "The lighthouse keeper",
           "Gardens need patience", "The train left the station", "Cats sleep"]


# -- clients -----------------------------------------------------------------------------


async def http_stream(port: int, body: dict) -> tuple[float, int]:
    """One streamed completion over a bare connection: (seconds to first token, tokens)."""
    payload = json.dumps(body).encode()
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    await writer.drain()
    first, buffer, tokens = None, b"", 0
    while True:
        piece = await reader.read(65536)
        if not piece:
            break
        if first is None and b"data: {" in piece:
            first = time.perf_counter() - started
        buffer += piece
        if b"data: [DONE]" in buffer:
            break
    writer.close()
    if not buffer.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"request failed: {buffer[:400]!r}")
    for line in buffer.split(b"\n"):
        if line.startswith(b'data: {"id"') and b'"usage":{' in line:
            tokens = json.loads(line[6:])["usage"]["completion_tokens"]
    if not tokens:  # an error in the stream: no usage chunk came
        raise RuntimeError(f"the stream carried no usage: {buffer[-400:]!r}")
    return first or 0.0, tokens


async def grpc_stream(stub, prompt: str, tokens: int, system: str | None = None):
    if system is None:
        request = prompt_request(prompt, max_tokens=tokens, temperature=1.0, ignore_eos=True)
    else:
        request = chat_request(prompt, max_tokens=tokens, temperature=1.0, ignore_eos=True)
        request.chat.messages.insert(0, request.chat.messages[0].__class__(role=1,
                                                                          content=system))
    return await timed_generate(stub, request)


def request_length(client: int, request: int, mean: int) -> int:
    """Lengths spread evenly over [mean/2, 3*mean/2], the same sequence on every
    path. Equal lengths would keep closed-loop clients in lockstep: all finishing
    on one step and arriving again as one burst, which measures bursts rather
    than steady serving."""
    return mean // 2 + (client * 7 + request * 13) % (mean + 1)


async def load(kind: str, target, clients: int, per_client: int, tokens: int):
    """Closed loop: `clients` concurrent clients, `per_client` requests each."""
    samples: list[tuple[float, int]] = []

    async def client(c: int):
        for r in range(per_client):
            prompt = PROMPTS[(c + r) % len(PROMPTS)]
            length = request_length(c, r, tokens)
            if kind == "rest":
                body = {"model": MODEL, "prompt": prompt, "max_tokens": length,
                        "temperature": 1.0, "ignore_eos": True, "stream": True,
                        "stream_options": {"include_usage": True}}
                samples.append(await http_stream(target, body))
            else:
                samples.append(await grpc_stream(target, prompt, length))

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    wall = time.perf_counter() - started
    ttfts = sorted(s[0] * 1000 for s in samples)
    produced = sum(s[1] for s in samples)
    return {
        "tokens": produced,
        "tok_s": produced / wall,
        "p50": statistics.median(ttfts),
        "p95": ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))],
    }


# -- the plain transformers baseline -------------------------------------------------------


def transformers_baseline(requests: int, tokens: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    path = harness.models_dir() / MODEL
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    produced, started = 0, time.perf_counter()
    for r in range(requests):
        ids = tokenizer(PROMPTS[r % len(PROMPTS)], return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, do_sample=True, temperature=1.0, max_new_tokens=tokens,
                                 min_new_tokens=tokens, pad_token_id=tokenizer.pad_token_id)
        produced += out.shape[1] - ids.shape[1]
    return produced / (time.perf_counter() - started)


# -- prefix cache ----------------------------------------------------------------------------


# Cold/warm pairs measured. A pair takes about 15 ms; a figure moves by a few
# per cent from run to run on a shared machine, so five pairs (as before) could
# read either side of a goal. The median of many is steadier.
PREFIX_PAIRS = 60


def shared_system_prompt(tokens: int) -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(harness.models_dir() / MODEL)
    corpus = (ROOT / "service" / "demo_model" / "corpus.txt").read_text()
    words, text = corpus.split(), ""
    i = 0
    while len(tokenizer(text)["input_ids"]) < tokens:
        text += words[i % len(words)] + " "
        i += 1
    return text


async def prefix_ttft(stub, system: str, trials: int = PREFIX_PAIRS) -> tuple[float, float]:
    """Median time to first token of a chat with a new system prompt (cold:
    nothing cached) and of the next chat with the same system prompt and a
    different question (warm), as conversations sharing a system prompt are.
    The same request twice would be warmer than any real one: its whole
    prompt, question and all, would be cached."""
    cold, warm = [], []
    for _ in range(trials):
        unique = f"{uuid.uuid4().hex} {system}"  # a new first block: nothing cached
        cold.append((await grpc_stream(stub, "What do you see?", 1, unique))[0])
        warm.append((await grpc_stream(stub, "What is it made of?", 1, unique))[0])
    return statistics.median(cold) * 1000, statistics.median(warm) * 1000


def split_cpus(pin: bool) -> tuple[set[int] | None, set[int] | None]:
    """(engine cores, everything else); (None, None) when not pinning."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return None, None
    return {cpus[0]}, set(cpus[1:])


# -- main ---------------------------------------------------------------------------------------


async def measure(args, ports) -> dict:
    results = {}
    channels = {k: grpc.aio.insecure_channel(f"127.0.0.1:{p['grpc']}") for k, p in ports.items()}
    stubs = {k: generation_service_pb2_grpc.GenerationServiceStub(c) for k, c in channels.items()}
    for stub in stubs.values():
        await grpc_stream(stub, "warm up", 8)
    for clients in args.clients:
        per_client = max(1, args.requests // clients)
        # REST and gRPC against the batched engine take turns, and each figure
        # is the median of its rounds, so drift on a noisy machine hits both.
        rounds: dict[str, list[dict]] = {"rest": [], "grpc": []}
        for _ in range(args.rounds):
            rounds["rest"].append(await load("rest", ports["batched"]["http"], clients,
                                             per_client, args.tokens))
            rounds["grpc"].append(await load("grpc", stubs["batched"], clients,
                                             per_client, args.tokens))
        for kind, samples in rounds.items():
            results[(kind, "batched", clients)] = {
                key: statistics.median(s[key] for s in samples) for key in samples[0]}
        results[("rest", "serial", clients)] = await load(
            "rest", ports["serial"]["http"], clients, per_client, args.tokens)
    system = shared_system_prompt(512)
    results["prefix"] = await prefix_ttft(stubs["batched"], system)
    for channel in channels.values():
        await channel.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=128,
                        help="requests per load level (at least one per client)")
    parser.add_argument("--clients", default="1,4,16,64")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating REST/gRPC rounds per load level (medians reported)")
    parser.add_argument("--no-pin", action="store_true",
                        help="do not give the engines a core of their own")
    args = parser.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    engine_cpus, other_cpus = split_cpus(pin=not args.no_pin)
    if other_cpus:
        os.sched_setaffinity(0, other_cpus)
    processes, ports = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        try:
            for mode in ("batched", "serial"):
                batching = "continuous" if mode == "batched" else "serial"
                engine, grpc_port = harness.start_engine(tmp, engine_cpus,
                                                         MILLM_BATCHING=batching)
                processes.append(engine)
                harness.wait_serving(engine, grpc_port)
                bridge, http_port = harness.start_bridge(tmp, grpc_port, other_cpus)
                processes.append(bridge)
                harness.wait_http(bridge, f"http://127.0.0.1:{http_port}/readyz")
                ports[mode] = {"grpc": grpc_port, "http": http_port}
            results = asyncio.run(measure(args, ports))
        finally:
            for process in processes:
                process.stop()
    if engine_cpus:
        os.sched_setaffinity(0, engine_cpus)  # the baseline gets the engine's core
    baseline = transformers_baseline(max(4, args.requests // 8), args.tokens)

    placement = (f"engines on CPU {sorted(engine_cpus)}, bridges and clients on "
                 f"{sorted(other_cpus)}" if engine_cpus else "no CPU pinning")
    print(f"\nmillm-tiny, {args.tokens // 2}-{args.tokens * 3 // 2} tokens per request, "
          f"closed-loop streaming clients, {placement}\n")
    print(f"{'clients':>7} | {'REST batched':>20} | {'REST serial':>20} | {'gRPC batched':>20} "
          f"| {'batched/serial':>14} | {'REST/gRPC':>9} | {'+p50 TTFT':>9}")
    print(f"{'':>7} | {'tok/s  p50/p95 ms':>20} | {'tok/s  p50/p95 ms':>20} | "
          f"{'tok/s  p50/p95 ms':>20} |")
    for clients in args.clients:
        rb, rs, gb = (results[(k, m, clients)] for k, m in
                      (("rest", "batched"), ("rest", "serial"), ("grpc", "batched")))

        def cell(r):
            return f"{r['tok_s']:6.0f} {r['p50']:6.1f}/{r['p95']:6.1f}"

        print(f"{clients:>7} | {cell(rb):>20} | {cell(rs):>20} | {cell(gb):>20} | "
              f"{rb['tok_s'] / rs['tok_s']:>13.2f}x | {rb['tok_s'] / gb['tok_s']:>8.0%} | "
              f"{rb['p50'] - gb['p50']:>7.1f}ms")
    print(f"\nplain transformers generate() loop: {baseline:.0f} tok/s; REST batched at 16 "
          f"clients is {results[('rest', 'batched', 16)]['tok_s'] / baseline:.1f}x that"
          if 16 in args.clients else f"\nplain transformers generate() loop: {baseline:.0f} tok/s")
    cold, warm = results["prefix"]
    print(f"prefix cache, 512-token system prompt, time to first token: cold {cold:.1f} ms, "
          f"warm {warm:.1f} ms: warm / cold {warm / cold:.2f} ({cold / warm:.1f}x faster; "
          f"medians of {PREFIX_PAIRS} pairs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
