"""Constraints and n on both engines (issue 30), measured side by side in one run.

1. Decode throughput of constrained vs free generation, for each kind of
   structured_outputs that is not JSON (regex, choice, grammar; JSON is
   bench/structured_output.py's): closed-loop gRPC clients against one engine,
   on the transformers engine (millm-tiny) and on the GGUF engine
   (millm-tiny-gguf:Q8_0). Free requests generate (ignore_eos) the lengths
   that 16 constrained requests of the kind generated, one after another, so
   both sides have the same mix of lengths and differ only in the
   constraint (with one median length a choice's shorter answers paid the
   per-request cost over fewer tokens than the free side's). Besides tok/s,
   the engine's CPU time per token, read from /proc for each run: on a
   machine others share it holds when throughput does not.
   Goal: constrained throughput at least 0.9 of free, printed per row.
2. n = 4 on the GGUF engine against four separate requests for the same
   prompt sent at once. Decode throughput over gRPC, each round's prompt new
   so that neither side finds it cached. And the prompt tokens llama.cpp
   evaluated, which usage cannot say (it counts a request's prompt once
   whatever the engine did). They are counted in this process, the way
   tests/test_gguf_choices.py counts them: the GGUF engine's Runner (with
   that test's slots and window) over a real llama.cpp context whose
   llama_decode calls are tallied, with max_tokens 1 so that every token
   evaluated is a prompt token (a choice's only token is sampled, never fed
   back). Goal: fewer prompt tokens evaluated and higher throughput with
   n = 4.

With two or more cores the engine gets the first and the clients the rest.

Usage: python bench/constraints.py [--clients 8,32] [--requests 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from bench.proc_cpu import process_seconds  # noqa: E402
from millm.v1 import generation_service_pb2_grpc  # noqa: E402
from tests import harness  # noqa: E402
from tests.grpc_helpers import chat_request, prompt_request  # noqa: E402

MODELS = ("millm-tiny", "millm-tiny-gguf:Q8_0")
GOAL = 0.9
N = 4  # choices in one request, against as many requests
# Each kind's constraint, long enough that decoding (not the request) dominates.
KINDS = {
    "regex": ("regex", "[a-z]{8}( [a-z]{4,8}){7}"),
    "choice": ("choice", ["the mill by the river", "the market in the morning",
                          "the lighthouse keeper", "the garden after the rain"]),
    "grammar": ("grammar", 'root ::= answer (", " answer){11}\nanswer ::= "yes" | "no" | '
                           '"maybe"'),
}
LONG = ("The river ran past the mill, and the miller counted the sacks of grain while the "
        "cats slept in the sun. In the morning the market opened by the bridge, and the "
        "lighthouse keeper wrote in his book about the ships that came and went. ") * 3


def request(model: str, kind: str | None, tokens: int):
    if kind is None:
        return chat_request("Tell me about the town.", model=model, temperature=1.0,
                            max_tokens=tokens, ignore_eos=True)
    out = chat_request("Tell me about the town.", model=model, temperature=1.0)
    field, value = KINDS[kind]
    if field == "choice":
        out.structured_outputs.choice.choices.extend(value)
    else:
        setattr(out.structured_outputs, field, value)
    return out


async def one(stub, message) -> tuple[int, int, int]:
    """(completion tokens, prompt tokens, prompt tokens reused) of one request."""
    async for response in stub.Generate(message, timeout=600):
        if response.HasField("usage"):
            usage = response.usage
            return usage.completion_tokens, usage.prompt_tokens, usage.cached_tokens
    raise RuntimeError("no usage came")


async def load(stub, make, clients: int, requests: int, pid: int) -> tuple[float, float]:
    """(tokens a second, engine CPU µs a token); `make(i)` is request i."""
    produced = 0
    sent = iter(range(clients * max(1, requests // clients)))

    async def client():
        nonlocal produced
        for i in sent:
            got, _, _ = await one(stub, make(i))
            produced += got

    cpu = process_seconds(pid)
    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    return produced / elapsed, 1e6 * (process_seconds(pid) - cpu) / max(1, produced)


async def kinds_vs_free(stub, model: str, clients_list, requests: int, rounds: int, pid: int):
    rows = []
    for kind in KINDS:
        # Also warms the grammar cache.
        lengths = [max(1, (await one(stub, request(model, kind, 0)))[0]) for _ in range(16)]
        for clients in clients_list:
            free, constrained = [], []
            for _ in range(rounds):  # alternate, and report medians
                free.append(await load(stub, lambda i, n=lengths: request(model, None,
                                                                         n[i % len(n)]),
                                       clients, requests, pid))
                constrained.append(await load(stub, lambda i, k=kind: request(model, k, 0),
                                              clients, requests, pid))
            rows.append((kind, statistics.mean(lengths), clients,
                         *(statistics.median(r[j] for r in side)
                           for side in (free, constrained) for j in (0, 1))))
    return rows


async def n_vs_separate(stub, model: str, rounds: int, n: int = N, tokens: int = 32):
    """(prompt tokens, tok/s) for n choices in one request, then n requests."""
    together, apart = [], []
    for r in range(rounds):
        for shape, out in (("n", together), ("apart", apart)):
            prompt = f"{r}{shape} {LONG}"  # new at its first token: nothing is cached
            started = time.perf_counter()
            if shape == "n":
                results = [await one(stub, prompt_request(prompt, model=model, n=n,
                                                          max_tokens=tokens, temperature=1.0,
                                                          ignore_eos=True))]
            else:
                results = await asyncio.gather(*(one(stub, prompt_request(
                    prompt, model=model, max_tokens=tokens, temperature=1.0, ignore_eos=True))
                    for _ in range(n)))
            elapsed = time.perf_counter() - started
            out.append((results[0][1], sum(t for t, _, _ in results) / elapsed))
    return [(statistics.median(p for p, _ in rows), statistics.median(t for _, t in rows))
            for rows in (together, apart)]


def evaluated_by_llama_cpp(model: str, n: int = N) -> tuple[int, int, int]:
    """(prompt length, tokens llama_decode evaluated for one request of n
    choices, then for n requests of one added at once), each on a fresh
    runner (nothing cached), as tests/test_gguf_choices.py counts them;
    max_tokens 1, so every token counted is a prompt token."""
    from llama_cpp import Llama
    from llama_cpp import llama_cpp as lib
    from llama_cpp._internals import LlamaBatch, LlamaContext

    from service.engines.gguf.batch import Runner
    from service.engines.gguf.lanes import Lanes, lane_opener
    from service.engines.gguf.sampling import sampler_chain
    from service.engines.gguf.slots import Slots
    from service.engines.gguf.vocab import token_piece
    from tests.test_gguf_choices import SLOTS, WINDOW, Counting, Job, drive, spec

    name, quant = model.split(":")
    llm = Llama(model_path=str(harness.models_dir() / name / f"{name}-{quant}.gguf"),
                n_ctx=64, n_batch=64, n_threads=1, n_threads_batch=1, verbose=False)
    n_vocab = llm.n_vocab()
    eog = frozenset(i for i in range(n_vocab) if lib.llama_vocab_is_eog(llm._model.vocab, i))
    pieces = [token_piece(llm._model.vocab, i, special=False) for i in range(n_vocab)]

    def tools(job_spec, seed):
        return sampler_chain(job_spec.options, n_vocab, eog, seed, history=WINDOW), None, None

    def count(jobs: list) -> int:
        # The same shared context as tests/test_gguf_choices.py's runner.
        params = lib.llama_context_params.from_buffer_copy(llm.context_params)
        params.n_ctx, params.n_batch, params.n_ubatch = SLOTS * WINDOW, 512, 512
        params.n_seq_max, params.kv_unified = SLOTS, True
        ctx = Counting(LlamaContext(model=llm._model, params=params, verbose=False))
        batch = LlamaBatch(n_tokens=512, embd=0, n_seq_max=1, verbose=False)
        lanes = Lanes(lane_opener(llm._model, llm.context_params, WINDOW))
        try:
            drive(Runner(ctx, batch, 512, Slots(SLOTS, SLOTS * WINDOW), lanes, eog, tools,
                         pieces, lambda what, amount: None), jobs)
            if any(job.error is not None for job in jobs):
                raise RuntimeError(f"a counted request failed: {[j.error for j in jobs]}")
            return ctx.evaluated
        finally:
            lanes.close()
            batch.close()
            ctx._ctx.close()

    try:
        one_request = Job(spec(llm, LONG, n, 1))
        length = len(one_request.spec.groups[0].prompt_ids)
        together = count([one_request])
        apart = count([Job(spec(llm, LONG, 1, 1)) for _ in range(n)])
    finally:
        llm.close()
    return length, together, apart


async def measure(port: int, model: str, args, clients_list, pid: int):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        rows = await kinds_vs_free(stub, model, clients_list, args.requests, args.rounds, pid)
        forks = (await n_vs_separate(stub, model, args.rounds) if "gguf" in model else None)
        return rows, forks


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", default="8,32")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    clients_list = [int(c) for c in args.clients.split(",")]
    cpus = sorted(os.sched_getaffinity(0))
    engine_cpus = {cpus[0]} if len(cpus) > 1 else None
    if engine_cpus:
        os.sched_setaffinity(0, set(cpus[1:]))
    results, counted = {}, {}
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            engine, port = harness.start_engine(pathlib.Path(tmp), engine_cpus,
                                                MILLM_MODEL=model)
            try:
                harness.wait_serving(engine, port)
                results[model] = asyncio.run(measure(port, model, args, clients_list,
                                                     engine.proc.pid))
            finally:
                engine.stop()
        if "gguf" in model:
            counted[model] = evaluated_by_llama_cpp(model)

    print(f"\nstructured_outputs vs free text over gRPC, the same tokens per request, medians "
          f"of {args.rounds} alternating rounds; goal: constrained/free >= {GOAL}\n")
    print(f"{'model':<22} | {'kind':<7} | {'tokens':>6} | {'clients':>7} | {'free tok/s':>10} | "
          f"{'constrained':>11} | {'ratio':>5} | goal   | engine CPU µs/token free, "
          f"constrained (ratio)")
    for model, (rows, _) in results.items():
        for kind, tokens, clients, free, free_cpu, constrained, constrained_cpu in rows:
            ratio = constrained / free
            print(f"{model:<22} | {kind:<7} | {tokens:>6.1f} | {clients:>7} | {free:>10.0f} | "
                  f"{constrained:>11.0f} | {ratio:>5.2f} | "
                  f"{'met   ' if ratio >= GOAL else 'MISSED'} | {free_cpu:.0f}, "
                  f"{constrained_cpu:.0f} ({free_cpu / constrained_cpu:.2f})")
    for model, (_, forks) in results.items():
        if forks is None:
            continue
        (prompt_tokens, n_rate), (_, apart_rate) = forks
        length, n_eval, apart_eval = counted[model]
        print(f"\n{model}: n={N} in one request vs {N} requests at once ({prompt_tokens:.0f} "
              f"prompt tokens, 32 generated each), medians of {args.rounds} rounds")
        print(f"  decode throughput: {n_rate:.0f} vs {apart_rate:.0f} tok/s "
              f"({'higher: met' if n_rate > apart_rate else 'MISSED'})")
        print(f"  prompt tokens llama.cpp evaluated (counted in this process on the runner, "
              f"a {length}-token prompt, max_tokens 1): {n_eval} vs {apart_eval} "
              f"({'fewer: met' if n_eval < apart_eval else 'MISSED'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
