"""GGUF peer benchmark: miLLM's whole stack against llama.cpp's own server, on equal cores.

What a user comparing the two would run: the same GGUF file, the same
OpenAI chat requests, each server's whole stack (miLLM: its engine *and* its
REST bridge; llama-server: its one process, HTTP threads included) confined
to the same CPU set, and the clients on the other cores. Only one server is
busy at a time; the rounds alternate which goes first.

Every knob that could differ is pinned on both sides and printed: llama.cpp
threads (decode and batch), batch and ubatch sizes, slots (8), the context per
slot, flash attention, the KV cache's layout and type, llama-server's HTTP
threads and sampler chain (reduced to greedy: top-k 1, as miLLM's temperature
0), and the threads' Linux scheduling policy (miLLM's default SCHED_BATCH on
both). Both ban the same tokens: miLLM never generates a control token other
than end-of-generation, and `ignore_eos` bans those too, so llama-server gets the
same ban as a logit bias. Before timing, each prompt's non-streamed greedy
answer is fetched from both and compared; a difference is printed with where
it starts.

Each cell is closed-loop clients (each sends its next request when its last
ends), greedy, `ignore_eos`, a fixed number of completion tokens, streamed
(with usage in the last chunk) and not; tokens are counted from each
response's `usage` on both sides. Cells run --rounds times, alternating; the
table gives the median tokens/s, the spread (max/min over rounds), streamed
time to first token, and miLLM / llama-server from the medians. CPU time per
token comes from /proc for each side's processes, and separately for each
side's decode thread (the busiest thread of miLLM's engine and of
llama-server: the one that calls llama_decode), so the table shows what each
stack spends beyond decoding: miLLM's gRPC hop and bridge, llama-server's HTTP
threads and task queue.

Models: the ~100M Llama of bench/hardware_limit.py exported as Q8_0 and F16
(built here, a minute or two), and the demo model's Q8_0 export.

Usage: python bench/gguf_peer.py [--models 100m-Q8_0,100m-F16,demo-Q8_0]
       [--clients 1,8,32] [--rounds 3] [--tokens 64] [--stack-cpus 1] [--json]
       [--models-dir DIR] [--flash-attn off|on] [--sched-policy batch|normal]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import peer_http  # noqa: E402
from bench.proc_cpu import process_seconds, thread_seconds  # noqa: E402
from tests import harness  # noqa: E402

PROMPTS = ["Tell me a story about the river.", "What does the miller do in the morning?",
           "Hello!", "Where is the lighthouse?", "Tell me about the market.",
           "What is in the garden?", "Who keeps the lighthouse?", "Describe the train."]
MODELS = ("100m-Q8_0", "100m-F16", "demo-Q8_0")
SLOTS, WINDOW, BATCH = 8, 1024, 512
# Flash attention: off on both by default, as miLLM ships (its text then
# equals the transformers engine's, and a request's text is the same alone or
# batched); --flash-attn on runs both with it (llama-server's `auto` picks it
# on a CPU; miLLM's MILLM_GGUF_FLASH_ATTN=on): with 8 sequences in one KV
# cache it skips the other sequences' cells, where the plain path multiplies
# them all.
FLASH_ATTN = "off"
# The threads' Linux scheduling policy, the same on both stacks: miLLM's
# default (common/scheduling.py: SCHED_BATCH, a waking thread does not preempt
# the busy one on a shared core); --sched-policy normal runs both under the
# kernel's default.
SCHED_POLICY = "batch"
SERVERS = ("miLLM", "llama-server")


def cpu_sets(stack_cpus: int) -> dict[str, list[int]]:
    """The same cores for each server's stack, the rest for the clients."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) <= stack_cpus:
        raise SystemExit(f"needs more than {stack_cpus} CPUs (has {len(cpus)}): the clients "
                         "must not share the servers' cores")
    stack = cpus[:stack_cpus]
    return {"millm": stack, "llama-server": stack, "clients": cpus[stack_cpus:]}


def model_files(tmp: pathlib.Path, names: list[str],
                kept: pathlib.Path | None) -> dict[str, tuple[pathlib.Path, str]]:
    """name -> (models dir, model id) for miLLM; the file is the same for both.
    The 100M exports are built under `kept` (reused when already there) or tmp."""
    out = {}
    if any(n.startswith("100m-") for n in names):
        from bench import hardware_limit

        models = kept or tmp / "models"
        quants = tuple(n.split("-", 1)[1] for n in names if n.startswith("100m-"))
        if not all(gguf_path(models, f"{hardware_limit.GGUF_REPO}:{q}").is_file()
                   for q in quants):
            shutil.rmtree(models, ignore_errors=True)
            models.mkdir(parents=True)
            started = time.perf_counter()
            hardware_limit.build(models, "float32", True, quants=quants)
            shutil.rmtree(models / hardware_limit.MODEL)  # only the export's source
            print(f"built {hardware_limit.GGUF_REPO} {', '.join(quants)} in "
                  f"{time.perf_counter() - started:.0f}s", flush=True)
        for quant in quants:
            out[f"100m-{quant}"] = (models, f"{hardware_limit.GGUF_REPO}:{quant}")
    if "demo-Q8_0" in names:
        out["demo-Q8_0"] = (harness.models_dir(), "millm-tiny-gguf:Q8_0")
    return out


def gguf_path(models: pathlib.Path, model_id: str) -> pathlib.Path:
    repo, quant = model_id.split(":")
    return models / repo / f"{repo}-{quant}.gguf"


def banned_tokens(path: pathlib.Path) -> dict[str, float]:
    """The file's control tokens (llama.cpp's token type 3): miLLM never
    generates one (end-of-generation ones only end a turn, and ignore_eos
    bans those too), so llama-server gets the same ban as a logit bias."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    field = reader.fields["tokenizer.ggml.token_type"]
    types = [int(field.parts[i][0]) for i in field.data]
    return {str(i): -100 for i, kind in enumerate(types) if kind == 3}


def llama_server_flags(threads: int, flash_attn: str = FLASH_ATTN) -> list[str]:
    """Every knob of llama-server that could differ from miLLM's, pinned."""
    return ["--threads", str(threads), "--threads-batch", str(threads),
            "--threads-http", str(SLOTS + 2),  # its default for --parallel 8
            "--parallel", str(SLOTS), "--ctx-size", str(SLOTS * WINDOW),
            "--batch-size", str(BATCH), "--ubatch-size", str(BATCH),
            "--flash-attn", flash_attn, "--kv-unified", "--cache-type-k", "f16",
            "--cache-type-v", "f16", "--cont-batching", "--no-webui",
            "--samplers", "top_k", "--top-k", "1", "--temp", "0",
            "--cache-ram", "0", "--no-warmup", "--log-disable"]


def millm_settings(threads: int, flash_attn: str = FLASH_ATTN,
                   sched_policy: str = SCHED_POLICY) -> dict[str, str]:
    return {"MILLM_GGUF_THREADS": str(threads), "MILLM_GGUF_SLOTS": str(SLOTS),
            "MILLM_GGUF_CONTEXT": str(WINDOW), "MILLM_GGUF_FLASH_ATTN": flash_attn,
            "MILLM_SCHED_POLICY": sched_policy, "MILLM_LOG_LEVEL": "WARNING"}


class Stacks:
    """Both servers on one model, started together, stopped together."""

    def __init__(self, tmp: pathlib.Path, models: pathlib.Path, model_id: str,
                 cpus: dict[str, list[int]], flash_attn: str,
                 sched_policy: str = SCHED_POLICY):
        stack = set(cpus["millm"])
        threads = len(stack)
        self.path = gguf_path(models, model_id)
        self.model_id = model_id
        self.processes = []
        engine, grpc_port = harness.start_engine(
            tmp, stack, MILLM_MODELS_DIR=str(models), MILLM_MODEL=model_id,
            MILLM_LOCK_MODEL=model_id, **millm_settings(threads, flash_attn, sched_policy))
        self.processes.append(engine)
        self.grpc_port = grpc_port  # bench/ceiling.py's gRPC side
        port = harness.free_port()
        self.flags = llama_server_flags(threads, flash_attn)
        native = harness.Process([str(harness.llama_server_binary()), "--model", str(self.path),
                                  "--host", "127.0.0.1", "--port", str(port), *self.flags],
                                 dict(os.environ), tmp / f"llama-server-{port}.log",
                                 set(cpus["llama-server"]), sched_batch=sched_policy == "batch")
        self.processes.append(native)
        harness.wait_serving(engine, grpc_port, timeout=300)
        bridge, http_port = harness.start_bridge(tmp, grpc_port, stack,
                                                 MILLM_SCHED_POLICY=sched_policy)
        self.processes.append(bridge)
        harness.wait_http(bridge, f"http://127.0.0.1:{http_port}/readyz")
        harness.wait_http(native, f"http://127.0.0.1:{port}/health", timeout=300)
        self.ports = {"miLLM": http_port, "llama-server": port}
        # Whose CPU time each side spends (every thread of each process).
        self.pids = {"miLLM": {"engine": engine.proc.pid, "bridge": bridge.proc.pid},
                     "llama-server": {"llama-server": native.proc.pid}}
        # The process whose busiest thread is each side's decode thread.
        self.decoders = {"miLLM": engine.proc.pid, "llama-server": native.proc.pid}
        self.extra = {"miLLM": {}, "llama-server": {"logit_bias": banned_tokens(self.path)}}

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()


def body(server: str, stacks: Stacks, prompt: str, tokens: int, stream: bool) -> dict:
    out = {"model": stacks.model_id, "messages": [{"role": "user", "content": prompt}],
           "temperature": 0, "max_tokens": tokens, "ignore_eos": True, "stream": stream,
           **stacks.extra[server]}
    if stream:
        out["stream_options"] = {"include_usage": True}
    return out


def compare_texts(stacks: Stacks, tokens: int) -> tuple[bool, list[str]]:
    """Each prompt's greedy answer from both servers; (all equal, differences)."""
    differences, notes = [], set()
    for prompt in PROMPTS:
        answers = {}
        for server in SERVERS:
            reply = peer_http.post_json(stacks.ports[server],
                                        body(server, stacks, prompt, tokens, False))
            answers[server] = (reply["choices"][0]["message"]["content"],
                               reply["usage"]["completion_tokens"])
        ours, theirs = answers["miLLM"], answers["llama-server"]
        if ours[1] == theirs[1] and ours[0].endswith("\ufffd") and ours[0][:-1] == theirs[0]:
            # The same tokens, cut by max_tokens inside a character: miLLM
            # writes what the bytes so far are (one U+FFFD), llama-server drops
            # them. (Only the last one: a random-weight model's text is often
            # U+FFFD throughout, which both write.)
            notes.add("equal but where the token limit cut a character: miLLM ends with "
                      "U+FFFD, llama-server drops the unfinished bytes")
            continue
        if ours != theirs:
            (a, n), (b, m) = ours, theirs
            pairs = enumerate(zip(a, b, strict=False))
            at = next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))
            differences.append(f"{prompt!r}: {n} vs {m} tokens, first difference at "
                               f"character {at}: miLLM {a[at:at + 30]!r}, llama-server "
                               f"{b[at:at + 30]!r}")
    return not differences, differences or sorted(notes)


async def cell(server: str, stacks: Stacks, clients: int, per_client: int, tokens: int,
               stream: bool) -> dict:
    """Closed-loop clients; tokens/s from the responses' usage, and TTFTs."""
    port = stacks.ports[server]
    ttfts: list[float] = []
    generated = events = 0

    async def client(c: int):
        nonlocal generated, events
        for r in range(per_client):
            prompt = PROMPTS[(c + r) % len(PROMPTS)]
            request = body(server, stacks, prompt, tokens, stream)
            if stream:
                first, usage, sent = await peer_http.stream(port, request)
                ttfts.append(first)
                events += sent
            else:
                usage = (await peer_http.post(port, request))["usage"]
            if usage["completion_tokens"] != tokens:  # ignore_eos: every answer runs to the end
                raise RuntimeError(f"{server} answered {usage['completion_tokens']} tokens, "
                                   f"not {tokens}: the cell would not compare like with like")
            generated += usage["completion_tokens"]

    pids = stacks.pids[server]
    cpu_before = {name: process_seconds(pid) for name, pid in pids.items()}
    threads_before = thread_seconds(stacks.decoders[server])
    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    elapsed = time.perf_counter() - started
    cpu = {name: process_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
    threads = thread_seconds(stacks.decoders[server])
    decode = max(seconds - threads_before.get(tid, 0.0) for tid, seconds in threads.items())
    return {"tokens_per_s": generated / elapsed, "tokens": generated,
            "ttft_ms": 1000 * statistics.median(ttfts) if ttfts else None,
            "events_per_token": events / generated if stream else None,
            "cpu_ms_per_token": {name: 1000 * s / generated for name, s in cpu.items()},
            "decode_thread_ms_per_token": 1000 * decode / generated}


def per_client_requests(clients: int) -> int:
    """Requests each client sends in a cell: about 256 to 2048 tokens a cell."""
    return 4 if clients == 1 else 2 if clients <= 8 else 1


def measure_model(stacks: Stacks, levels: list[int], rounds: int, tokens: int) -> dict:
    """rounds x (each server, alternating which first) x streamed/not x levels."""
    runs: dict = {}
    for server in SERVERS:  # warm-up: the first requests load pages, JIT nothing
        asyncio.run(cell(server, stacks, 2, 1, 8, True))
    for r in range(rounds):
        order = SERVERS if r % 2 == 0 else SERVERS[::-1]
        for server in order:
            for mode in ("streamed", "non_streamed"):
                for clients in levels:
                    result = asyncio.run(cell(server, stacks, clients,
                                              per_client_requests(clients), tokens,
                                              mode == "streamed"))
                    runs.setdefault((server, mode, clients), []).append(result)
        print(f"  round {r + 1}/{rounds} done", flush=True)
    return runs


def cpu_total(summary: dict) -> float:
    return sum(summary["cpu_ms_per_token"].values())


def beyond(summary: dict) -> float:
    """CPU ms per token a stack spends outside its decode thread."""
    return cpu_total(summary) - summary["decode_thread_ms_per_token"]


def summarise(runs: dict) -> dict:
    out: dict = {}
    for (server, mode, clients), results in runs.items():
        rates = [r["tokens_per_s"] for r in results]
        ttfts = [r["ttft_ms"] for r in results if r["ttft_ms"] is not None]
        out[(server, mode, clients)] = {
            "tokens_per_s": statistics.median(rates), "spread": max(rates) / min(rates),
            "ttft_ms": statistics.median(ttfts) if ttfts else None, "rounds": len(rates),
            "events_per_token": (statistics.median(r["events_per_token"] for r in results)
                                 if results[0]["events_per_token"] is not None else None),
            "cpu_ms_per_token": {name: statistics.median(r["cpu_ms_per_token"][name]
                                                         for r in results)
                                 for name in results[0]["cpu_ms_per_token"]},
            "decode_thread_ms_per_token": statistics.median(
                r["decode_thread_ms_per_token"] for r in results)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--stack-cpus", type=int, default=1,
                        help="cores for each server's whole stack (the clients get the rest)")
    parser.add_argument("--flash-attn", choices=("off", "on"), default=FLASH_ATTN,
                        help="llama.cpp's flash attention, on both servers")
    parser.add_argument("--sched-policy", choices=("batch", "normal"), default=SCHED_POLICY,
                        help="the threads' Linux scheduling policy, on both stacks")
    parser.add_argument("--models-dir", type=pathlib.Path,
                        help="keep the built 100M exports here and reuse them")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    if harness.llama_server_binary() is None:
        raise SystemExit("llama-server is not built: run `make llama-server` first")
    names = [m for m in args.models.split(",") if m]
    unknown = set(names) - set(MODELS)
    if unknown:
        raise SystemExit(f"unknown models {sorted(unknown)}; known: {', '.join(MODELS)}")
    levels = [int(c) for c in args.clients.split(",")]
    cpus = cpu_sets(args.stack_cpus)
    os.sched_setaffinity(0, set(cpus["clients"]))
    log = sys.stderr if args.json else sys.stdout
    figures: dict = {"cpus": cpus, "llama_server_flags": None, "millm_settings": None,
                     "greedy_text_equal": {}, "differences": {}, "ratio": {}, "cpu_ratio": {},
               "cells": {}}
    print(f"CPU sets: miLLM stack (engine + bridge) {cpus['millm']}, llama-server "
          f"{cpus['llama-server']}, clients {cpus['clients']}", file=log, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        with contextlib.redirect_stdout(log):
            files = model_files(tmp, names, args.models_dir)
        for name in names:
            models, model_id = files[name]
            print(f"{name}: starting both servers", file=log, flush=True)
            stacks = Stacks(tmp, models, model_id, cpus, args.flash_attn, args.sched_policy)
            try:
                figures["llama_server_flags"] = stacks.flags
                figures["millm_settings"] = millm_settings(args.stack_cpus, args.flash_attn,
                                                           args.sched_policy)
                figures["llama_server_sched_policy"] = args.sched_policy
                equal, differences = compare_texts(stacks, args.tokens)
                figures["greedy_text_equal"][name] = equal
                figures["differences"][name] = differences
                with contextlib.redirect_stdout(log):
                    runs = measure_model(stacks, levels, args.rounds, args.tokens)
            finally:
                stacks.stop()
            table = summarise(runs)
            figures["cells"][name] = {f"{s}/{m}/{c}": v for (s, m, c), v in table.items()}
            figures["ratio"][name] = {
                mode: {str(c): table[("miLLM", mode, c)]["tokens_per_s"]
                       / table[("llama-server", mode, c)]["tokens_per_s"] for c in levels}
                for mode in ("streamed", "non_streamed")}
            # CPU per token, llama-server's over miLLM's whole stack's: what the
            # ratio would be on a core nothing else uses (above 1: miLLM spends less).
            figures["cpu_ratio"][name] = {
                mode: {str(c): cpu_total(table[("llama-server", mode, c)])
                       / cpu_total(table[("miLLM", mode, c)]) for c in levels}
                for mode in ("streamed", "non_streamed")}
    if args.json:
        print(json.dumps(figures, indent=1))
    else:
        report(figures, args, levels)
    return 0


def report(figures: dict, args, levels: list[int]) -> None:
    print(f"\nboth stacks on CPUs {figures['cpus']['millm']}, clients on "
          f"{figures['cpus']['clients']}; greedy, ignore_eos, {args.tokens} tokens a request, "
          f"{args.rounds} alternating rounds (median; spread = max/min over rounds)")
    print(f"llama-server (scheduling policy {figures['llama_server_sched_policy']}) "
          + " ".join(figures["llama_server_flags"]))
    print("miLLM " + " ".join(f"{k}={v}" for k, v in figures["millm_settings"].items()))
    for name, cells in figures["cells"].items():
        equal = figures["greedy_text_equal"][name]
        print(f"\n{name}: greedy texts {'equal' if equal else 'DIFFER'}")
        print("streamed content events per token, " + ", ".join(
            f"{c} clients: miLLM {cells[f'miLLM/streamed/{c}']['events_per_token']:.2f} / "
            f"llama-server {cells[f'llama-server/streamed/{c}']['events_per_token']:.2f}"
            for c in levels))
        for line in figures["differences"][name]:
            print("  " + line)
        print(f"{'mode':<13}{'clients':>8}{'miLLM tok/s':>13}{'spread':>8}{'TTFT':>9}"
              f"{'llama-server':>14}{'spread':>8}{'TTFT':>9}{'miLLM/it':>10}"
              f"{'CPU ms/token: miLLM (engine+bridge)':>38}{'llama-server':>14}"
              f"{'CPU it/miLLM':>14}{'beyond the decode thread: miLLM / it':>38}")
        for mode in ("streamed", "non_streamed"):
            for c in levels:
                ours, theirs = cells[f"miLLM/{mode}/{c}"], cells[f"llama-server/{mode}/{c}"]

                def ttft(x):
                    return f"{x['ttft_ms']:>7.0f}ms" if x["ttft_ms"] is not None else f"{'-':>9}"

                split = ours["cpu_ms_per_token"]
                mine = f"{cpu_total(ours):.2f} ({split['engine']:.2f}+{split['bridge']:.2f})"
                print(f"{mode:<13}{c:>8}{ours['tokens_per_s']:>13.1f}{ours['spread']:>8.2f}"
                      f"{ttft(ours)}{theirs['tokens_per_s']:>14.1f}{theirs['spread']:>8.2f}"
                      f"{ttft(theirs)}{figures['ratio'][name][mode][str(c)]:>9.2f}x"
                      f"{mine:>38}{cpu_total(theirs):>14.2f}"
                      f"{figures['cpu_ratio'][name][mode][str(c)]:>13.2f}x"
                      f"{beyond(ours):>29.2f} / {beyond(theirs):.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
