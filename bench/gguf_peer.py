"""GGUF peer benchmark: miLLM (bridge + GGUF engine) against llama.cpp's own
C++ server (llama-server, 8 parallel slots with continuous batching) and
llama-cpp-python's OpenAI server (llama_cpp.server), serving the same GGUF
file side by side.

Each server gets the same streamed chat requests at temperature 0 (so all
generate the same tokens: tests/test_gguf_peer.py checks the text is equal
for llama_cpp.server), with 1, 8 and 32 concurrent closed-loop clients, and
the script prints tokens/s and time to first token (p50/p95) for each, and
miLLM's throughput as a share of each peer's. All run llama.cpp with one
thread; with two or more cores the servers get the first core and the
clients the rest. Only one server is busy at a time. llama-server is built
once by tools/build_llama_server.sh (`make llama-server`); without it, its
rows are left out and the script says so.

Usage: python bench/gguf_peer.py [--model millm-tiny-gguf:Q8_0] [--requests 24]
       [--clients 1,8,32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import re
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import harness, http_helpers  # noqa: E402

PROMPTS = ["Tell me a story about the river.", "What does the miller do in the morning?",
           "Hello!", "Where is the lighthouse?", "Tell me about the market.",
           "What is in the garden?"]
# llama_cpp.server's own defaults are not OpenAI's; neutral values for it.
PEER_NEUTRAL = {"repeat_penalty": 1.0, "top_k": 0, "min_p": 0.0}


_CONTENT = re.compile(rb'"content":\s?"[^"]')
_FINISHED = re.compile(rb'"finish_reason":\s?"')


async def one(port: int, body: dict) -> float:
    """Seconds to the first non-empty content of one streamed chat, over a bare
    connection read to its [DONE]."""
    payload = json.dumps(body).encode()
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    await writer.drain()
    first, buffer = None, b""
    while True:
        piece = await reader.read(65536)
        if not piece:
            break
        buffer += piece
        if first is None and _CONTENT.search(buffer):
            first = time.perf_counter() - started
        if b"data: [DONE]" in buffer:
            break
    writer.close()
    if b" 200 " not in buffer.split(b"\r\n", 1)[0] or not _FINISHED.search(buffer):
        raise RuntimeError(f"request failed or ended early: {buffer[:300]!r}")
    return first or 0.0


async def drive(port: int, model: str, extra: dict, clients: int, requests: int,
                tokens: dict[str, int], max_tokens: int) -> dict:
    ttfts: list[float] = []
    generated = 0

    async def worker(c: int):
        nonlocal generated
        for r in range(c, requests, clients):
            prompt = PROMPTS[r % len(PROMPTS)]
            ttfts.append(await one(port, {
                "model": model, "messages": [{"role": "user", "content": prompt}],
                "temperature": 0, "max_tokens": max_tokens, "stream": True, **extra}))
            generated += tokens[prompt]

    started = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in range(clients)))
    elapsed = time.perf_counter() - started
    ttfts.sort()
    return {"tokens_per_s": generated / elapsed,
            "ttft_p50_ms": 1000 * statistics.median(ttfts),
            "ttft_p95_ms": 1000 * ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))]}


def completion_tokens(port: int, model: str, extra: dict, max_tokens: int,
                      counts_end_token: bool) -> dict[str, int]:
    """Text tokens of each prompt's greedy answer (the same on both servers).
    miLLM's usage counts the end-of-turn token it generated, llama_cpp.server's
    does not; it is left out here so both are measured on the same tokens."""
    counts = {}
    for prompt in PROMPTS:
        reply, content = http_helpers.post(port, "/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": prompt}],
            "temperature": 0, "max_tokens": max_tokens, **extra})
        assert reply.status == 200, content
        answer = json.loads(content)
        ended = answer["choices"][0]["finish_reason"] == "stop"
        counts[prompt] = answer["usage"]["completion_tokens"] - (counts_end_token and ended)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="millm-tiny-gguf:Q8_0")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--clients", default="1,8,32")
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    cpus = sorted(os.sched_getaffinity(0))
    server_cpus, client_cpus = ({cpus[0]}, set(cpus[1:])) if len(cpus) > 1 else (None, None)
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
    results, lengths = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        engine, grpc_port = harness.start_engine(tmp, server_cpus, MILLM_MODEL=args.model)
        peer, peer_port = harness.start_llama_cpp_server(tmp, harness.gguf_file(args.model),
                                                         cpus=server_cpus)
        native = native_port = None
        if harness.llama_server_binary() is not None:
            native, native_port = harness.start_llama_server(
                tmp, harness.gguf_file(args.model), parallel=8, cpus=server_cpus)
        bridge = None
        try:
            harness.wait_serving(engine, grpc_port)
            bridge, http_port = harness.start_bridge(tmp, grpc_port, client_cpus)
            harness.wait_http(bridge, f"http://127.0.0.1:{http_port}/readyz")
            harness.wait_http(peer, f"http://127.0.0.1:{peer_port}/v1/models")
            servers = {"miLLM": (http_port, {}, True),
                       "llama_cpp.server": (peer_port, PEER_NEUTRAL, False)}
            if native is not None:
                harness.wait_http(native, f"http://127.0.0.1:{native_port}/health")
                servers["llama-server -np 8"] = (native_port, PEER_NEUTRAL, True)
            for name, (port, extra, counts_end) in servers.items():
                tokens = completion_tokens(port, args.model, extra, args.max_tokens, counts_end)
                lengths[name] = statistics.mean(tokens.values())
                for clients in levels:
                    results[(name, clients)] = asyncio.run(drive(
                        port, args.model, extra, clients, max(args.requests, clients),
                        tokens, args.max_tokens))
        finally:
            for process in (bridge, native, peer, engine):
                if process is not None:
                    process.stop()
    print(f"GGUF peer benchmark: {args.model}, {args.requests} streamed greedy chats per "
          f"cell, max_tokens {args.max_tokens}, llama.cpp with 1 thread; answers average "
          + ", ".join(f"{n:.1f} tokens on {name}" for name, n in lengths.items()))
    if harness.llama_server_binary() is None:
        print("llama-server not built (make llama-server): its rows are left out")
    print(f"{'server':<20} {'clients':>7} {'tokens/s':>9} {'TTFT p50':>10} {'TTFT p95':>10} "
          f"{'miLLM / it':>11}")
    for (name, clients), r in results.items():
        ours = results[("miLLM", clients)]["tokens_per_s"]
        print(f"{name:<20} {clients:>7} {r['tokens_per_s']:>9.0f} {r['ttft_p50_ms']:>8.1f}ms "
              f"{r['ttft_p95_ms']:>8.1f}ms {ours / r['tokens_per_s']:>10.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
