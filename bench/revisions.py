"""Two revisions of the engine side by side: is a change faster, or was it the machine?

On the machines this project runs on, the same loop reads a few per cent
apart from one run to the next, and sometimes twice as slow, so a change of a
few per cent cannot be judged by running a bench before and after it. This one
starts an engine from each revision at once, pinned to the same core, and lets
them take turns: request by request for the prefix cache's cold and warm
times, load by load for decoding. Each figure is a median of many turns, and
the decode rows also give each engine's CPU time per token, read from /proc,
which a busy neighbour moves less than wall time.

BASE is any git revision, checked out in a temporary worktree; HEAD is the
working tree unless another revision is named. Both run the venv's packages
(the generated stubs included), so a change to the proto contract between the
two is not compared. An editable install's import hook would hand both
engines the installed tree, so each is started with the hook removed and its
own tree first on the path.

Usage: python bench/revisions.py BASE [HEAD] [--workloads prefix,decode]
           [--pairs 60] [--rounds 10] [--clients 16] [--env KEY=VALUE ...]
           [--base-env KEY=VALUE ...] [--head-env KEY=VALUE ...]

--env goes to both engines (MILLM_MODEL=... for a GGUF model, say); --base-env
and --head-env to one, which also compares a setting on one revision
(`revisions.py HEAD --head-env MILLM_TORCH_LINEAR=packed`). Decode loads vary
by several per cent one from the next: 4 loads each have read 8 % apart for
the same code, 10 within 1 %.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import uuid

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import grpc  # noqa: E402
import serving  # noqa: E402
from proc_cpu import process_seconds  # noqa: E402

from millm.v1 import generation_service_pb2_grpc  # noqa: E402
from tests import harness  # noqa: E402

# Runs `python -m service` from the tree given as argv[1], whatever is installed.
_LAUNCH = """
import os, runpy, sys
root = sys.argv.pop(1)
os.chdir(root)
sys.meta_path[:] = [f for f in sys.meta_path
                    if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path.insert(0, root)
runpy.run_module("service", run_name="__main__", alter_sys=True)
"""


def checkout(rev: str, into: pathlib.Path) -> None:
    """`rev` in a detached worktree, with the GGUF steering callback built."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet",
                    str(into), rev], check=True)
    subprocess.run([sys.executable, "-c", _LAUNCH.replace('"service"',
                                                          '"service.engines.gguf.native"'),
                    str(into)], check=True, stdout=subprocess.DEVNULL)


def start(tree: pathlib.Path, tmp: pathlib.Path, cpus: set[int] | None,
          env: dict[str, str]) -> tuple[harness.Process, int]:
    port = harness.free_port()
    data = tmp / f"data-{port}"
    data.mkdir()
    full = {**os.environ, "MILLM_HOST": "127.0.0.1", "MILLM_GRPC_PORT": str(port),
            "MILLM_MODELS_DIR": str(harness.models_dir()), "MILLM_DATA_DIR": str(data),
            "MILLM_TORCH_THREADS": "1", **env}
    process = harness.Process([sys.executable, "-c", _LAUNCH, str(tree)], full,
                              tmp / f"engine-{port}.log", cpus)
    return process, port


def q(values: list[float], share: float) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * share))]


async def prefix(stubs: dict, pairs: int) -> None:
    system = serving.shared_system_prompt(512)
    cold = {name: [] for name in stubs}
    warm = {name: [] for name in stubs}
    names = list(stubs)
    for i in range(pairs):
        for name in names if i % 2 else names[::-1]:
            unique = f"{uuid.uuid4().hex} {system}"
            cold[name].append((await serving.grpc_stream(stubs[name], "What do you see?", 1,
                                                         unique))[0] * 1000)
            warm[name].append((await serving.grpc_stream(stubs[name], "What is it made of?", 1,
                                                         unique))[0] * 1000)
    print(f"\nprefix cache, 512-token system prompt, {pairs} cold/warm pairs each, taking turns")
    print(f"{'':>6} | {'cold p50 ms':>11} | {'warm p50 ms':>11} | {'warm/cold':>9} | "
          f"{'p10 warm/cold':>13}")
    for name in names:
        c, w = cold[name], warm[name]
        print(f"{name:>6} | {q(c, .5):>11.2f} | {q(w, .5):>11.2f} | {q(w, .5) / q(c, .5):>9.3f} | "
              f"{q(w, .1) / q(c, .1):>13.3f}")
    print(f"head / base, warm p50: {q(warm['head'], .5) / q(warm['base'], .5):.3f}; "
          f"cold p50: {q(cold['head'], .5) / q(cold['base'], .5):.3f}")


async def decode(stubs: dict, pids: dict, rounds: int, clients: int) -> None:
    per_client = max(1, 128 // clients)
    tok_s = {name: [] for name in stubs}
    cpu_us = {name: [] for name in stubs}
    names = list(stubs)
    for name in names:  # one unmeasured load each
        await serving.load("grpc", stubs[name], clients, 1, 64)
    for r in range(rounds):
        for name in names if r % 2 else names[::-1]:
            before = process_seconds(pids[name])
            result = await serving.load("grpc", stubs[name], clients, per_client, 64)
            cpu_us[name].append((process_seconds(pids[name]) - before) * 1e6 / result["tokens"])
            tok_s[name].append(result["tok_s"])
    print(f"\ndecoding, {clients} closed-loop gRPC streaming clients, {rounds} loads each, "
          "taking turns (medians; spread = fastest / slowest load)")
    print(f"{'':>6} | {'tok/s':>8} | {'spread':>6} | {'engine CPU µs/token':>19}")
    for name in names:
        t, c = tok_s[name], cpu_us[name]
        print(f"{name:>6} | {statistics.median(t):>8.0f} | {max(t) / min(t):>6.2f} | "
              f"{statistics.median(c):>19.0f}")
    med = {name: (statistics.median(tok_s[name]), statistics.median(cpu_us[name]))
           for name in names}
    print(f"head / base: tok/s {med['head'][0] / med['base'][0]:.3f}, "
          f"CPU per token {med['head'][1] / med['base'][1]:.3f}")


async def run(args, ports: dict, pids: dict) -> None:
    channels = {name: grpc.aio.insecure_channel(f"127.0.0.1:{port}")
                for name, port in ports.items()}
    stubs = {name: generation_service_pb2_grpc.GenerationServiceStub(channel)
             for name, channel in channels.items()}
    try:
        for stub in stubs.values():
            await serving.grpc_stream(stub, "warm up", 8)
        if "prefix" in args.workloads:
            await prefix(stubs, args.pairs)
        if "decode" in args.workloads:
            await decode(stubs, pids, args.rounds, args.clients)
    finally:
        for channel in channels.values():
            await channel.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base")
    parser.add_argument("head", nargs="?", help="a revision (default: the working tree)")
    parser.add_argument("--workloads", default="prefix,decode")
    parser.add_argument("--pairs", type=int, default=serving.PREFIX_PAIRS)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--env", action="append", default=[],
                        help="KEY=VALUE for both engines (MILLM_MODEL=..., say)")
    parser.add_argument("--base-env", action="append", default=[])
    parser.add_argument("--head-env", action="append", default=[])
    args = parser.parse_args()
    args.workloads = args.workloads.split(",")
    env = {name: dict(item.split("=", 1) for item in [*args.env, *own])
           for name, own in (("base", args.base_env), ("head", args.head_env))}
    engine_cpus, client_cpus = serving.split_cpus(True)
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
    with tempfile.TemporaryDirectory() as scratch:
        tmp = pathlib.Path(scratch)
        trees: dict[str, pathlib.Path] = {}
        processes = {}
        try:
            # Named before they are made, so a failed build is cleaned up too.
            trees["base"] = tmp / "base"
            checkout(args.base, trees["base"])
            trees["head"] = tmp / "head" if args.head else ROOT
            if args.head:
                checkout(args.head, trees["head"])
            for name, tree in trees.items():
                processes[name] = start(tree, tmp, engine_cpus, env[name])
            for process, port in processes.values():
                harness.wait_serving(process, port, timeout=300)
            revs = {name: subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                                         capture_output=True, text=True).stdout.strip()
                    for name, tree in trees.items()}
            print(f"base {args.base} ({revs['base']}), head "
                  f"{args.head or 'the working tree'} ({revs['head']}"
                  f"{'' if args.head else ' plus any uncommitted change'}); both engines on "
                  f"CPU {sorted(engine_cpus or [])}, clients on {sorted(client_cpus or [])}"
                  + "".join(f"; {label}: {' '.join(items)}" for label, items in
                            (("both", args.env), ("base", args.base_env),
                             ("head", args.head_env)) if items))
            asyncio.run(run(args, {n: p for n, (_, p) in processes.items()},
                            {n: proc.proc.pid for n, (proc, _) in processes.items()}))
        finally:
            for process, _ in processes.values():
                process.stop()
            for tree in trees.values():
                if tree != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                    str(tree)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
