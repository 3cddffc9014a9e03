"""Tool-calling benchmark: forced tool calls vs free text, side by side in one run,
on both engines.

Closed-loop gRPC clients against one engine: each request either forces a call
of a tool whose arguments are a fixed-length array of digits (so every call
has the same length), or asks for free text run to the same number of tokens
(ignore_eos). Both prompts are the same length: the free request carries the
tool's description as its system turn, as the engine writes it for a template
that renders no tools, so the difference is what the per-step grammar mask and
the call parser cost, not a longer prefill. Target: no more than structured
output costs (about 20 % at 32 clients on the transformers engine;
docs/performance.md).

Usage: python bench/tool_calls.py [--clients 1,8,32] [--requests 64]
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

from millm.v1 import generation_pb2, generation_service_pb2_grpc  # noqa: E402
from tests import harness  # noqa: E402
from tests.grpc_helpers import chat_request  # noqa: E402

DIGITS = 40
TOOL = generation_pb2.FunctionTool(name="record", parameters_json=json.dumps({
    "type": "object", "properties": {"digits": {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": DIGITS, "maxItems": DIGITS}},
    "required": ["digits"], "additionalProperties": False}))
ENGINES = {"transformers": "millm-tiny", "gguf": "millm-tiny-gguf:Q8_0"}


def described_tools() -> str:
    """The system turn the engine writes for the tool (requests/tools.py)."""
    from service.requests.tools import ToolPlan, plain_messages

    plan = ToolPlan((("record", "", json.loads(TOOL.parameters_json)),), "function", "record")
    return plain_messages([{"role": "user", "content": "Count for me."}], plan)[0]["content"]


async def one(stub, model: str, forced: bool, tokens: int) -> tuple[int, float]:
    request = chat_request("Count for me.", model=model, temperature=1.0,
                           **({"max_tokens": 400} if forced
                              else {"max_tokens": tokens, "ignore_eos": True}))
    if not forced:
        request.chat.messages.insert(0, generation_pb2.ChatMessage(
            role=generation_pb2.ROLE_SYSTEM, content=described_tools()))
    if forced:
        request.tools.append(TOOL)
        request.tool_choice.mode = generation_pb2.TOOL_CHOICE_MODE_FUNCTION
        request.tool_choice.function_name = "record"
    started, produced, arguments = time.perf_counter(), 0, []
    async for response in stub.Generate(request, timeout=600):
        for choice in response.choices:
            arguments.extend(f.arguments for f in choice.tool_calls)
        if response.HasField("usage"):
            produced = response.usage.completion_tokens
    if forced:
        assert len(json.loads("".join(arguments))["digits"]) == DIGITS
    return produced, time.perf_counter() - started


async def load(stub, model: str, clients: int, requests: int, forced: bool,
               tokens: int) -> float:
    produced = 0

    async def client():
        nonlocal produced
        for _ in range(max(1, requests // clients)):
            got, _ = await one(stub, model, forced, tokens)
            produced += got  # after the await: `x += await f()` would lose updates

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return produced / (time.perf_counter() - started)


async def throughput(port: int, model: str, clients_list: list[int], requests: int,
                     rounds: int):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        tokens, _ = await one(stub, model, True, 0)  # loads the model, caches the grammar
        rows = []
        for clients in clients_list:
            free, forced = [], []
            for _ in range(rounds):  # alternate, and report medians
                free.append(await load(stub, model, clients, requests, False, tokens))
                forced.append(await load(stub, model, clients, requests, True, tokens))
            rows.append((clients, statistics.median(free), statistics.median(forced)))
        return tokens, rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--gguf-requests", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    cpus = sorted(os.sched_getaffinity(0))
    engine_cpus = {cpus[0]} if len(cpus) > 1 else None
    if engine_cpus:
        os.sched_setaffinity(0, set(cpus[1:]))
    results = {}
    for kind, model in ENGINES.items():
        requests = args.requests if kind == "transformers" else args.gguf_requests
        with tempfile.TemporaryDirectory() as tmp:
            engine, port = harness.start_engine(pathlib.Path(tmp), engine_cpus)
            try:
                harness.wait_serving(engine, port)
                results[kind] = asyncio.run(throughput(port, model, clients, requests,
                                                       args.rounds))
            finally:
                engine.stop()
    for kind, (tokens, rows) in results.items():
        print(f"\n{ENGINES[kind]} ({kind}) over gRPC, {tokens} tokens per request (a forced "
              f"call of {DIGITS} digits vs free text of the same length), medians of "
              f"{args.rounds} alternating rounds\n")
        print(f"{'clients':>7} | {'free tok/s':>10} | {'forced call tok/s':>17} | {'cost':>6}")
        for n, free, forced in rows:
            print(f"{n:>7} | {free:>10.0f} | {forced:>17.0f} | {1 - forced / free:>6.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
