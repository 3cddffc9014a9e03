"""What monitoring costs: throughput with every generation read by probes,
against the same traffic unmonitored.

Starts one engine, attaches both demo SAEs, defines four probes (two per SAE,
one of them over 16 weighted features), and drives closed-loop gRPC clients
(each sends its next request when the previous one ends) with monitoring off
and on, alternately, ROUNDS times each; each side's figure is the median of
its runs, so drift and other load on the machine hit both sides alike. Monitored rows are read at
pre_steering on both layers, prompt and generated tokens, inside the running
batch, and skip the prefix cache (a monitor must see every prompt position).

Target (issue 21): monitored throughput at least 90 % of unmonitored. Each side also
prints the engine's CPU µs per token (from /proc), which a shared machine moves less.

GGUF mode (--engine gguf, bench/gguf_models.py): the same on the GGUF engine,
for the demo model's Q8_0 export and (unless --no-100m) the 100M Llama's, with
probes on two SAEs of each; it adds one client's ms per decode step,
monitored against not (the per-step cost of reading the residual stream out
through llama.cpp's eval callback and encoding it).

Usage: python bench/monitoring.py [--clients 16] [--tokens 48] [--requests 8] [--rounds 3]
       python bench/monitoring.py --engine gguf [--clients 8] [--no-100m]
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from bench import gguf_models  # noqa: E402
from bench.proc_cpu import process_seconds  # noqa: E402
from millm.v1 import (  # noqa: E402
    generation_service_pb2_grpc,
    monitoring_pb2,
    monitoring_service_pb2,
    monitoring_service_pb2_grpc,
    steering_service_pb2,
    steering_service_pb2_grpc,
)
from tests import harness  # noqa: E402
from tests.grpc_helpers import chat_request, closed_loop  # noqa: E402

SAES = ("sae_millm-tiny-res-l1", "sae_millm-tiny-res-l0")
PROMPTS = ["Tell me about the sea.", "What is a library?", "Describe a garden.",
           "How do trains work?"]


async def setup(target: str, saes=SAES, d_sae: int = 128) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        steering = steering_service_pb2_grpc.SteeringServiceStub(channel)
        monitoring = monitoring_service_pb2_grpc.MonitoringServiceStub(channel)
        for sae in saes:
            await steering.AttachSae(steering_service_pb2.AttachSaeRequest(sae_id=sae))
        for sae in saes:
            await monitoring.CreateProbe(monitoring_service_pb2.CreateProbeRequest(
                name=f"{sae}-one", sae_id=sae, feature=3, threshold=0.5))
            await monitoring.CreateProbe(monitoring_service_pb2.CreateProbeRequest(
                name=f"{sae}-many", sae_id=sae, threshold=2.0, features=[
                    monitoring_pb2.ProbeFeature(index=i % d_sae, weight=1.0 if i % 2 else -0.5)
                    for i in range(16)]))


async def switch(target: str, enabled: bool) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = monitoring_service_pb2_grpc.MonitoringServiceStub(channel)
        state = (await stub.SetMonitoring(monitoring_service_pb2.SetMonitoringRequest(
            enabled=enabled))).monitoring
        assert state.active == enabled, state.reason


def request(model: str, c: int, r: int, tokens: int):
    return chat_request(PROMPTS[(c + r) % len(PROMPTS)], model=model, max_tokens=tokens,
                        temperature=1.0, ignore_eos=True)


async def load(target: str, clients: int, requests: int, tokens: int,
               model: str = "millm-tiny") -> dict:
    return await closed_loop(target, clients, requests,
                             lambda c, r: request(model, c, r, tokens),
                             warmup=chat_request("Hi", model=model, max_tokens=4))


def measured(process, target: str, clients: int, requests: int, tokens: int,
             model: str = "millm-tiny") -> dict:
    """One load, with the engine's CPU µs per token generated (from /proc; the
    4-token warm-up counted in the CPU, not the tokens): on a machine others
    share it holds when throughput does not."""
    before = process_seconds(process.proc.pid)
    run = asyncio.run(load(target, clients, requests, tokens, model))
    run["cpu_us"] = 1e6 * (process_seconds(process.proc.pid) - before) / max(1, run["tokens"])
    return run


def cpu_line(runs: dict[bool, list[dict]]) -> str:
    off, on = (statistics.median(r["cpu_us"] for r in runs[side]) for side in (False, True))
    return (f"engine CPU µs per token: unmonitored {off:.0f}, monitored {on:.0f}, "
            f"ratio {off / on:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=("transformers", "gguf"), default="transformers")
    parser.add_argument("--clients", type=int, help="default 16 (transformers), 8 (gguf: "
                        "its slots)")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--requests", type=int, default=8, help="per client")
    parser.add_argument("--rounds", type=int, default=3, help="runs per side")
    parser.add_argument("--no-100m", dest="big", action="store_false",
                        help="GGUF mode: the demo model only")
    args = parser.parse_args()
    args.clients = args.clients or (8 if args.engine == "gguf" else 16)
    return gguf_main(args) if args.engine == "gguf" else transformers_main(args)


def transformers_main(args) -> int:
    runs: dict[bool, list[dict]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        process, port = harness.start_engine(pathlib.Path(tmp), MILLM_LOG_LEVEL="WARNING")
        target = f"127.0.0.1:{port}"
        try:
            harness.wait_serving(process, port)
            asyncio.run(setup(target))
            for _ in range(args.rounds):
                for enabled in (False, True):
                    asyncio.run(switch(target, enabled))
                    runs[enabled].append(measured(process, target, args.clients, args.requests,
                                                  args.tokens))
        finally:
            process.stop()
    off, on = ({k: statistics.median(r[k] for r in runs[side]) for k in ("tok_s", "p50")}
               for side in (False, True))
    print(f"monitoring benchmark: {args.clients} clients x {args.requests} requests x "
          f"{args.tokens} tokens, chat, temperature 1, 4 probes on 2 SAEs (layers 0 and 1), "
          f"median of {args.rounds} alternating runs per side")
    print(f"{'':<12} {'tok/s':>8} {'p50 TTFT ms':>12}  runs (tok/s)")
    for name, side, figures in (("unmonitored", False, off), ("monitored", True, on)):
        print(f"{name:<12} {figures['tok_s']:>8.0f} {figures['p50']:>12.1f}  "
              + ", ".join(f"{r['tok_s']:.0f}" for r in runs[side]))
    print(f"monitored / unmonitored: {on['tok_s'] / off['tok_s']:.2f}  (goal >= 0.90)")
    print(cpu_line(runs))
    return 0


# -- GGUF mode ---------------------------------------------------------------------------------


async def one_client_steps(target: str, model: str, tokens: int, repeats: int) -> list[float]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        return [await gguf_models.step_ms(stub, request(model, 0, r, tokens))
                for r in range(repeats)]


def gguf_model(tmp: pathlib.Path, index: int, model: gguf_models.BenchModel, args,
               cpus) -> None:
    runs: dict[bool, list[dict]] = {False: [], True: []}
    steps: dict[bool, list[float]] = {False: [], True: []}
    data = tmp / f"engine-{index}"
    data.mkdir()
    process, port = model.engine(data, cpus)
    target = f"127.0.0.1:{port}"
    try:
        harness.wait_serving(process, port, timeout=600)
        asyncio.run(setup(target, tuple(model.saes.values()), model.d_sae))
        for _ in range(args.rounds):
            for enabled in (False, True):
                asyncio.run(switch(target, enabled))
                runs[enabled].append(measured(process, target, args.clients, args.requests,
                                              args.tokens, model.model_id))
                steps[enabled] += asyncio.run(one_client_steps(target, model.model_id,
                                                               args.tokens, 2))
    finally:
        process.stop()
    layers = ",".join(str(layer) for layer in model.saes)
    print(f"\n{model.model_id} ({model.name}): 4 probes on SAEs at layers {layers}, "
          f"{args.clients} clients x {args.requests} requests x {args.tokens} tokens, "
          f"median of {args.rounds} alternating runs per side")
    print(f"{'':<12} {'tok/s':>8} {'p50 TTFT ms':>12} {'1-client ms/step':>17}  runs (tok/s)")
    for name, side in (("unmonitored", False), ("monitored", True)):
        print(f"{name:<12} {gguf_models.median(runs[side], 'tok_s'):>8.0f} "
              f"{gguf_models.median(runs[side], 'p50'):>12.1f} "
              f"{statistics.median(steps[side]):>17.3f}  "
              + ", ".join(f"{r['tok_s']:.0f}" for r in runs[side]))
    ratio = gguf_models.median(runs[True], "tok_s") / gguf_models.median(runs[False], "tok_s")
    extra = statistics.median(steps[True]) - statistics.median(steps[False])
    print(f"monitored / unmonitored: {ratio:.2f}  (goal >= 0.90); one client's decode step "
          f"costs {extra:+.3f} ms monitored")
    print(cpu_line(runs))


def gguf_main(args) -> int:
    return gguf_models.run_models(
        args, "monitoring benchmark, GGUF engine (llama.cpp, one thread): probes read "
        "l_out-<layer> through an eval callback",
        lambda tmp, i, model, cpus: gguf_model(tmp, i, model, args, cpus))


if __name__ == "__main__":
    raise SystemExit(main())
