"""Steering benchmark on the demo model: what per-request steering costs, side by side.

Starts one engine with continuous batching and one forced to serve a single
request at a time (MILLM_BATCHING=serial, which is how servers that swap a
global steering configuration per request have to run them), attaches the demo
SAE on both, saves one profile per client, and drives closed-loop gRPC clients
(each sends its next request when the previous one ends) in three mixes:

  - unsteered: no request names a profile;
  - steered: every request names its client's own profile (all different);
  - mixed: every other client names its profile.

It prints aggregate tokens/s and time to first token (p50) for each mix on
both engines, and the ratios: steered / unsteered on the batched engine
(what per-row deltas cost; target >= 0.8) and batched / serial for steered
traffic (what batching steered requests together gains).

GGUF mode (--engine gguf, bench/gguf_models.py): the GGUF engine on the demo
model's Q8_0 export and (unless --no-100m) the 100M Llama's, one engine at a
time on one core, SAEs attached at two layers and every profile steering both.
At 1 and 8 clients it alternates unsteered runs with runs where half the
requests (every other one of each client) name their client's profile, for
--rounds rounds; each figure is the median of its runs. It prints half-steered
/ unsteered throughput against the goal (>= 0.90), and the mechanism's cost
per decode step: one client's streamed ms per step, steered against not, and
at 8 clients the step time the throughput implies (clients / tok/s).

Steering modes (--modes, default all three): `add` is the profile above;
`clamp` clamps one feature per SAE layer to 3 and ablates another; `conditional`
is the add profile with one entry applying only after the text " the" and the
other only while a third feature read above 0.5 at the previous position (a
condition read from the stream at every step). Each mode's profile steers half
the rows (every other client; GGUF: every other request of each client), and
its throughput is printed against the unsteered runs, goal >= 0.90.

Usage: python bench/steering.py [--clients 16] [--tokens 48] [--requests 4] [--modes add,clamp]
       python bench/steering.py --engine gguf [--rounds 3] [--requests 4] [--no-100m]
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from bench import gguf_models  # noqa: E402
from millm.v1 import (  # noqa: E402
    generation_service_pb2_grpc,
    steering_pb2,
    steering_service_pb2,
    steering_service_pb2_grpc,
)
from tests import harness  # noqa: E402
from tests.grpc_helpers import chat_request, closed_loop  # noqa: E402

SAE = "sae_millm-tiny-res-l1"
PROMPTS = ["Tell me about the sea.", "What is a library?", "Describe a garden.",
           "How do trains work?"]


MODES = ("add", "clamp", "conditional")


def entries(layers, d_sae: int, c: int, mode: str) -> list:
    """Client c's profile in steering mode `mode` (module docstring)."""
    out = []
    for layer in layers:
        a, b, watch = (7 * c) % d_sae, (7 * c + 3) % d_sae, (7 * c + 5) % d_sae
        if mode == "clamp":
            out += [steering_pb2.SteeringEntry(layer=layer, feature=a, mode="clamp", value=3.0),
                    steering_pb2.SteeringEntry(layer=layer, feature=b, mode="ablate")]
        elif mode == "conditional":
            out += [steering_pb2.SteeringEntry(
                        layer=layer, feature=a, strength=4.0,
                        when=steering_pb2.SteeringCondition(after_text=" the")),
                    steering_pb2.SteeringEntry(
                        layer=layer, feature=b, strength=-2.0,
                        when=steering_pb2.SteeringCondition(feature=watch, above=0.5))]
        else:
            out += [steering_pb2.SteeringEntry(layer=layer, feature=a, strength=4.0),
                    steering_pb2.SteeringEntry(layer=layer, feature=b, strength=-2.0)]
    return out


def profile_name(c: int, mode: str) -> str:
    return f"client-{c}" if mode == "add" else f"client-{c}-{mode}"


async def create_profiles(stub, layers, d_sae: int, clients: int, modes) -> None:
    for mode in modes:
        for c in range(clients):
            await stub.CreateProfile(steering_service_pb2.CreateProfileRequest(
                name=profile_name(c, mode), entries=entries(layers, d_sae, c, mode)))


async def setup(target: str, clients: int, modes=("add",)) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = steering_service_pb2_grpc.SteeringServiceStub(channel)
        await stub.AttachSae(steering_service_pb2.AttachSaeRequest(sae_id=SAE))
        await create_profiles(stub, (1,), 256, clients, {"add", *modes})


async def load(target: str, mix: str, clients: int, requests: int, tokens: int) -> dict:
    """`mix`: unsteered, steered, mixed (add), or half-<mode>: every other client."""
    def request(c: int, r: int):
        pb = chat_request(PROMPTS[(c + r) % len(PROMPTS)], max_tokens=tokens,
                          temperature=1.0, ignore_eos=True)
        if mix == "steered" or (mix == "mixed" and c % 2 == 0):
            pb.profile = f"client-{c}"
        elif mix.startswith("half-") and c % 2 == 0:
            pb.profile = profile_name(c, mix.removeprefix("half-"))
        return pb

    return await closed_loop(target, clients, requests, request)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=("transformers", "gguf"), default="transformers")
    parser.add_argument("--clients", type=int, default=16, help="transformers mode")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--requests", type=int, default=4, help="per client")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs per figure (GGUF mode; transformers mode: the modes' runs)")
    parser.add_argument("--no-100m", dest="big", action="store_false",
                        help="GGUF mode: the demo model only")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="steering modes, comma-separated (add, clamp, conditional)")
    args = parser.parse_args()
    args.modes = tuple(m for m in args.modes.split(",") if m)
    if not set(args.modes) <= set(MODES):
        parser.error(f"--modes takes {', '.join(MODES)}")
    return gguf_main(args) if args.engine == "gguf" else transformers_main(args)


def transformers_main(args) -> int:
    engines = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for kind in ("batched", "serial"):
                data = pathlib.Path(tmp) / kind
                data.mkdir()
                env = {"MILLM_BATCHING": "serial"} if kind == "serial" else {}
                engines[kind] = harness.start_engine(data, MILLM_LOG_LEVEL="WARNING", **env)
            for process, port in engines.values():
                harness.wait_serving(process, port)
                asyncio.run(setup(f"127.0.0.1:{port}", args.clients, args.modes))
            results = {}
            # Alternate the engines and mixes so drift in machine speed hits all alike.
            for mix in ("unsteered", "steered", "mixed"):
                for kind, (_, port) in engines.items():
                    results[(kind, mix)] = asyncio.run(load(
                        f"127.0.0.1:{port}", mix, args.clients, args.requests, args.tokens))
            # Each mode against unsteered runs, alternating, --rounds times (batched engine).
            _, port = engines["batched"]
            for _ in range(args.rounds):
                for mix in ("unsteered", *(f"half-{m}" for m in args.modes)):
                    results.setdefault(("modes", mix), []).append(asyncio.run(load(
                        f"127.0.0.1:{port}", mix, args.clients, args.requests, args.tokens)))
        finally:
            for process, _ in engines.values():
                process.stop()

    print(f"steering benchmark: {args.clients} clients x {args.requests} requests x "
          f"{args.tokens} tokens, chat, temperature 1, one profile per client")
    print(f"{'mix':<10} {'batched tok/s':>14} {'p50 ms':>8} {'serial tok/s':>13} {'p50 ms':>8}")
    for mix in ("unsteered", "steered", "mixed"):
        b, s = results[("batched", mix)], results[("serial", mix)]
        print(f"{mix:<10} {b['tok_s']:>14.0f} {b['p50']:>8.1f} {s['tok_s']:>13.0f} "
              f"{s['p50']:>8.1f}")
    cost = results[("batched", "steered")]["tok_s"] / results[("batched", "unsteered")]["tok_s"]
    gain = results[("batched", "steered")]["tok_s"] / results[("serial", "steered")]["tok_s"]
    print(f"steered / unsteered (batched): {cost:.2f}  (target >= 0.80)")
    print(f"batched / serial (steered):    {gain:.2f}x")
    plain = gguf_models.median(results[("modes", "unsteered")], "tok_s")
    for mode in args.modes:
        runs = results[("modes", f"half-{mode}")]
        half = gguf_models.median(runs, "tok_s")
        print(f"half {mode:<11} / unsteered (batched): {half / plain:.2f}  ({half:.0f} vs "
              f"{plain:.0f} tok/s, medians of {len(runs)} alternating rounds; goal >= 0.90)")
    return 0


# -- GGUF mode ---------------------------------------------------------------------------------

GGUF_CLIENTS = (1, 8)


async def gguf_setup(target: str, model: gguf_models.BenchModel, clients: int,
                     modes) -> None:
    """Every SAE of the model attached; one profile per client and mode over all of them."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = steering_service_pb2_grpc.SteeringServiceStub(channel)
        for sae in model.saes.values():
            await stub.AttachSae(steering_service_pb2.AttachSaeRequest(sae_id=sae))
        await create_profiles(stub, tuple(model.saes), model.d_sae, clients, {"add", *modes})


def gguf_request(model_id: str, c: int, r: int, tokens: int, steered: bool, mode: str = "add"):
    request = chat_request(PROMPTS[(c + r) % len(PROMPTS)], model=model_id, max_tokens=tokens,
                           temperature=1.0, ignore_eos=True)
    if steered:
        request.profile = profile_name(c, mode)
    return request


async def gguf_steps(target: str, model_id: str, tokens: int, repeats: int) -> dict:
    """One client's ms per decode step, unsteered and steered requests in turn."""
    out: dict[bool, list[float]] = {False: [], True: []}
    async with grpc.aio.insecure_channel(target) as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        for r in range(2 * repeats):
            steered = bool(r % 2)
            out[steered].append(await gguf_models.step_ms(
                stub, gguf_request(model_id, 0, r, tokens, steered)))
    return out


def gguf_round(target: str, model: gguf_models.BenchModel, args, runs: dict) -> None:
    for clients in GGUF_CLIENTS:
        for mix in ("unsteered", *(f"half-{m}" for m in args.modes)):
            runs.setdefault((clients, mix), []).append(asyncio.run(closed_loop(
                target, clients, args.requests,
                lambda c, r, mix=mix: gguf_request(
                    model.model_id, c, r, args.tokens,
                    mix != "unsteered" and (c + r) % 2 == 0, mix.removeprefix("half-")),
                warmup=gguf_models.warmup(model.model_id))))
    steps = asyncio.run(gguf_steps(target, model.model_id, args.tokens, 3))
    for steered, figures in steps.items():
        runs.setdefault(("step", steered), []).extend(figures)


def gguf_report(model: gguf_models.BenchModel, runs: dict, args) -> None:
    import statistics

    layers = ",".join(str(layer) for layer in model.saes)
    print(f"\n{model.model_id} ({model.name}): SAEs at layers {layers}, "
          f"{args.requests} requests x {args.tokens} tokens per client, temperature 1, "
          f"median of {args.rounds} alternating rounds")
    print(f"{'clients':>7} {'unsteered tok/s':>16} {'half steered tok/s':>19} {'ratio':>6} "
          f"{'p50 TTFT ms (un/half)':>22} {'step ms (un/half)':>18}")
    for clients in GGUF_CLIENTS:
        plain = runs[(clients, "unsteered")]
        a = gguf_models.median(plain, "tok_s")
        for mode in args.modes:
            half = runs[(clients, f"half-{mode}")]
            b = gguf_models.median(half, "tok_s")
            print(f"{clients:>7} {a:>16.1f} {b:>19.1f} {b / a:>6.2f} "
                  f"{gguf_models.median(plain, 'p50'):>10.1f} / "
                  f"{gguf_models.median(half, 'p50'):<9.1f} "
                  f"{clients * 1000 / a:>8.2f} / {clients * 1000 / b:<7.2f}")
            print(f"{'':>7} half {mode} / unsteered at {clients} client(s): {b / a:.2f}  "
                  f"(goal >= 0.90)  runs: " + ", ".join(
                      f"{p['tok_s']:.0f}/{h['tok_s']:.0f}"
                      for p, h in zip(plain, half, strict=True)))
    off, on = (statistics.median(runs[("step", s)]) for s in (False, True))
    print(f"{'':>7} one client, ms per decode step: unsteered {off:.3f}, steered {on:.3f} "
          f"(+{on - off:.3f} ms, {on / off - 1:+.1%}; median of {len(runs[('step', True)])})")


def gguf_model(tmp: pathlib.Path, index: int, model, args, cpus) -> None:
    (tmp / f"engine-{index}").mkdir()
    process, port = model.engine(tmp / f"engine-{index}", cpus)
    target, runs = f"127.0.0.1:{port}", {}
    try:
        harness.wait_serving(process, port, timeout=600)
        asyncio.run(gguf_setup(target, model, max(GGUF_CLIENTS), args.modes))
        for _ in range(args.rounds):
            gguf_round(target, model, args, runs)
    finally:
        process.stop()
    gguf_report(model, runs, args)


def gguf_main(args) -> int:
    return gguf_models.run_models(
        args, "steering benchmark, GGUF engine (llama.cpp, one thread): steered rows add "
        "their profile's vector to l_out-<layer> in an eval callback",
        lambda tmp, i, model, cpus: gguf_model(tmp, i, model, args, cpus))

if __name__ == "__main__":
    raise SystemExit(main())
