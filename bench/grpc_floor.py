"""What one streamed token costs the engine's event loop, against gRPC's own floor.

Every streamed token a request gets is one GenerateResponse message on its
gRPC stream, written by the engine's event loop. This bench measures, in one
run and on the same core, the CPU one such message costs:

- a bare grpc.aio server whose Generate writes messages of the same shape
  (one ChoiceDelta with a short text and one token id) and does nothing else:
  what gRPC's Python server costs per message, the floor no servicer goes under;
- the real engine on the demo model (transformers, continuous batching): the
  CPU per generated token of the whole process less its model thread (the
  event loop, gRPC's poller, helper threads: counted as the bare server is),
  and the model thread's, under the same number of closed-loop gRPC clients
  (bench/serving.py's load).

The difference between the two is what miLLM adds per token besides the
model thread (the job queue, validation and logging per request, the metrics
per token). It is per token, not per message: a reader that falls behind gets
several tokens in one message, so at many clients it can be a little low.
CPU is read from /proc per thread, so the figures hold on a busy machine; the
clients run on another core.

Usage: python bench/grpc_floor.py [--clients 1,16] [--messages 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import resource
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from bench import serving  # noqa: E402
from bench.proc_cpu import thread_seconds  # noqa: E402
from millm.v1 import generation_pb2, generation_service_pb2, generation_service_pb2_grpc  # noqa: E402
from tests import harness  # noqa: E402


def message() -> generation_service_pb2.GenerateResponse:
    return generation_service_pb2.GenerateResponse(
        choices=[generation_pb2.ChoiceDelta(index=0, text=" tok", token_ids=[123])])


class Bare(generation_service_pb2_grpc.GenerationServiceServicer):
    def __init__(self, per_stream: int):
        self.per_stream = per_stream

    async def Generate(self, request, context):
        for _ in range(self.per_stream):
            yield message()


async def read_streams(target: str, streams: int) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)

        async def one():
            async for _ in stub.Generate(generation_service_pb2.GenerateRequest()):
                pass

        await asyncio.gather(*(one() for _ in range(streams)))


async def bare_floor(streams: int, messages: int, client_cpus: set[int]) -> float:
    """Microseconds of this process's CPU per message written."""
    server = grpc.aio.server()
    generation_service_pb2_grpc.add_GenerationServiceServicer_to_server(
        Bare(messages // streams), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    before = resource.getrusage(resource.RUSAGE_SELF)
    reader = await asyncio.create_subprocess_exec(
        "taskset", "-c", ",".join(map(str, sorted(client_cpus))), sys.executable, __file__,
        "--read", f"127.0.0.1:{port}", "--streams", str(streams))
    await reader.wait()
    after = resource.getrusage(resource.RUSAGE_SELF)
    await server.stop(None)
    used = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return used / (messages // streams * streams) * 1e6


async def engine_costs(port: int, pid: int, clients: int, tokens: int) -> tuple[float, float]:
    """(everything but the model thread, model thread) microseconds of CPU per
    generated token. The first is counted like the bare server's figure: the
    whole process (the event loop, gRPC's poller thread, any helper thread),
    here less the model thread, the busiest one besides the loop."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        await serving.load("grpc", stub, clients, 1, tokens)  # warm
        per_client = max(2, 128 // clients)
        before = thread_seconds(pid)
        # Tokens as each response's usage counts them, not as asked for.
        produced = (await serving.load("grpc", stub, clients, per_client, tokens))["tokens"]
        after = thread_seconds(pid)
    used = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    model = max((v for tid, v in used.items() if tid != pid), default=0.0)
    rest = sum(used.values()) - model
    return rest / produced * 1e6, model / produced * 1e6


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", default="1,16")
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--read", help=argparse.SUPPRESS)
    parser.add_argument("--streams", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read:  # the reading side of bare_floor, in a process of its own
        asyncio.run(read_streams(args.read, args.streams))
        return 0
    levels = [int(c) for c in args.clients.split(",")]
    engine_cpus, client_cpus = serving.split_cpus(pin=True)
    if not engine_cpus:
        print("needs two cores: one for the servers, one for the clients")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        engine, port = harness.start_engine(pathlib.Path(tmp), engine_cpus)
        try:
            harness.wait_serving(engine, port)
            rows = []
            for clients in levels:
                os.sched_setaffinity(0, engine_cpus)  # the bare server: the engine's core
                floor = asyncio.run(bare_floor(clients, args.messages, client_cpus))
                os.sched_setaffinity(0, client_cpus)  # the engine's clients: the other
                loop, model = asyncio.run(engine_costs(port, engine.proc.pid, clients,
                                                       args.tokens))
                rows.append((clients, floor, loop, model))
        finally:
            engine.stop()
    print(f"servers on CPU {sorted(engine_cpus)}, clients on {sorted(client_cpus)}; "
          "CPU per streamed message / generated token, microseconds")
    print("| clients | bare grpc.aio server | engine less its model thread | ratio | "
          "engine model thread |")
    print("|---:|---:|---:|---:|---:|")
    for clients, floor, loop, model in rows:
        print(f"| {clients} | {floor:.0f} | {loop:.0f} | {loop / floor:.2f}x | {model:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
