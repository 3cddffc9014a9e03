"""`make agents-check`: Claude Code, Codex CLI and Qwen Code, headless, against the bridge.

The coding agents are the clients people now point at a local server, and
each one sends what no unit test of ours would think to send. This check runs
the pinned versions (tests/agents/package.json, installed by `npm ci` into
tests/agents/node_modules) the way a user would, on each demo model
(millm-tiny and millm-tiny-gguf:Q8_0), and judges every session by the wire:

1. every request the agent made was answered 2xx;
2. the agent exited 0 and printed the model's answer;
3. there was at least one tool round trip: the model called one of the
   agent's own tools, the agent ran it and sent the result back under the
   call's id, and the bridge answered that request (exchanges.py).

The demo model samples its first token, and now and then answers in words
without calling a tool; a session whose only miss is that is run again, up
to --tries times, and the table says how many runs each took. Any other
miss (a non-2xx answer, a non-zero exit, nothing printed) ends it at once.

It starts an engine and bridge of its own on free loopback ports, and puts a
recording relay (recorder.py) in front of the bridge for each session, so
every request and answer is kept as JSON lines beside the agent's stdout and
stderr, under .millm/agents-check/<time>/ (or --out). A table of results ends
the run; the exit status is 1 when any session missed any of the three.

Nothing may leave the machine: the script re-runs itself in a network
namespace whose only interface is loopback (`unshare --net` as root, a user
namespace as well otherwise), with the engine, bridge, relay and agents all
inside; each agent's telemetry, error reports and update checks are off as
well (clients.py). Where no namespace can be made it says so and runs on the
host's network.

Not collected by pytest (not a test_*.py file), and not part of `make test`:
the agents take about 900 MB of npm packages.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from exchanges import summarize  # noqa: E402
from recorder import Recorder  # noqa: E402

import clients  # noqa: E402
from tests import harness  # noqa: E402

MODELS = ("millm-tiny", "millm-tiny-gguf:Q8_0")
KEPT_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "SHELL", "USER", "LOGNAME")
# What an agent's stderr says when it tried a host beyond loopback (inside the
# namespace such a try fails at once); reported, so a setting that stopped
# working shows.
OUTSIDE = re.compile(r"ENETUNREACH|EAI_AGAIN|ENOTFOUND|getaddrinfo|Network is unreachable|"
                     r"dns error|failed to lookup address|Could not resolve host", re.I)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


# --- one agent, one model -------------------------------------------------------

def run_session(client: str, model: str, bridge_port: int, folder: pathlib.Path,
                timeout: float) -> dict:
    """Runs one agent on one prompt; returns what happened, judged from the wire."""
    home, work = folder / "home", folder / "work"
    home.mkdir(parents=True)
    work.mkdir()
    (work / "calc.py").write_text(clients.CALC_PY)
    recorder = Recorder(bridge_port, folder / "exchanges.jsonl").start()
    run = clients.CLIENTS[client](home, work, f"http://127.0.0.1:{recorder.port}", model)
    env = {k: os.environ[k] for k in KEPT_ENV if k in os.environ}
    env.update(HOME=str(home), TERM="dumb", TMPDIR=str(home), **clients.COMMON_ENV, **run.env)
    (folder / "command.json").write_text(json.dumps({"argv": run.argv, "env": run.env}, indent=2))
    started = time.monotonic()
    with open(folder / "stdout.txt", "wb") as out, open(folder / "stderr.txt", "wb") as err:
        process = subprocess.Popen(run.argv, cwd=work, env=env, stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=err, start_new_session=True)
        try:
            code = process.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the agent and the tools it started
            code = process.wait()
            timed_out = True
    seconds = time.monotonic() - started
    recorder.stop()
    stdout = (folder / "stdout.txt").read_text(errors="replace")
    stderr = (folder / "stderr.txt").read_text(errors="replace")
    wire = summarize(recorder.exchanges)
    answer = clients.answer_printed(client, stdout, run)
    checks = {
        "all_2xx": wire["all_2xx"],
        "exit_0": code == 0 and not timed_out,
        "answer_printed": bool(answer.strip()),
        "tool_round_trip": wire["tool_round_trip"],
    }
    return {"client": client, "model": model, "checks": checks, "passed": all(checks.values()),
            "exit_code": code, "timed_out": timed_out, "seconds": round(seconds, 1),
            "answer": answer[:1000], "wire": wire, "folder": str(folder),
            "outside_attempts": [line[:300] for line in stderr.splitlines()
                                 if OUTSIDE.search(line)][:20]}


def model_chose_words(result: dict) -> bool:
    """Whether the session's only miss is the model's choice: every request
    answered 2xx, the agent exited 0 and printed the answer, but the model
    answered in words at once, calling no tool. A sampled demo model does that
    now and then (docs/coding-agents.md gives the rate); the server and the
    client did their part, so the session is run again. Any other miss is
    final."""
    checks = result["checks"]
    return (checks["all_2xx"] and checks["exit_0"] and checks["answer_printed"]
            and not result["wire"]["tool_calls"])


# --- the report ---------------------------------------------------------------------

def table(results: list[dict]) -> str:
    head = ("client", "model", "tries", "requests", "all 2xx", "exit", "answer", "round trip",
            "result")
    rows = [head]
    for r in results:
        c = r["checks"]
        rows.append((r["client"], r["model"], str(r["tries"]), str(r["wire"]["requests"]),
                     "yes" if c["all_2xx"] else "no",
                     "timeout" if r["timed_out"] else str(r["exit_code"]),
                     "yes" if c["answer_printed"] else "no",
                     "yes" if c["tool_round_trip"] else (
                         f"no ({len(r['wire']['tool_calls'])} calls)"),
                     "PASS" if r["passed"] else "FAIL"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |"
             for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def details(r: dict) -> list[str]:
    lines = [f"{r['client']} on {r['model']} ({r['seconds']}s, {r['folder']}):"]
    failure = r["wire"]["first_failure"]
    if failure:
        lines.append(f"  first failing request: #{failure['seq']} {failure['method']} "
                     f"{failure['path']} -> {failure['status']}"
                     + (f" ({failure['relay_error']})" if failure["relay_error"] else ""))
        lines.append(f"    {str(failure['body'])[:600]}")
    if r["wire"]["ignored_fields"]:
        lines.append(f"  X-miLLM-Ignored-Fields: {', '.join(r['wire']['ignored_fields'])}")
    for call in r["wire"]["tool_calls"]:
        lines.append(f"  tool call {call['tool']!r} in #{call['seq']}, result sent back: "
                     f"{'yes' if call['result_sent_back'] else 'no'}")
    last = r["wire"]["last_answer"]
    if last:
        lines.append(f"  last answer on the wire (#{last['seq']}): {last['text'][:200]!r}")
    lines.append(f"  printed: {r['answer'][:200]!r}")
    for line in r["outside_attempts"][:5]:
        lines.append(f"  stderr tells of an outside connection: {line[:200]}")
    return lines


# --- isolation ----------------------------------------------------------------------

def unshare_argv() -> list[str] | None:
    """How to enter a loopback-only network namespace here, or None."""
    if not shutil.which("unshare") or not shutil.which("ip"):
        return None
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    argv = ["unshare", *user, "--net", "--"]
    probe = subprocess.run([*argv, "ip", "link", "set", "lo", "up"], capture_output=True)
    return argv if probe.returncode == 0 else None


def interfaces() -> list[str]:
    listing = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return [line.split(":")[1].strip() for line in listing.splitlines() if ":" in line]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="output folder (default .millm/agents-check/<time>)")
    parser.add_argument("--clients", default=",".join(clients.CLIENTS),
                        help="comma-separated: " + ", ".join(clients.CLIENTS))
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated model ids")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per session")
    parser.add_argument("--tries", type=int, default=3,
                        help="runs of a session whose only miss is that the model answered in "
                             "words without calling a tool (default 3)")
    parser.add_argument("--no-isolate", action="store_true",
                        help="run on the host's network, not in a loopback-only namespace")
    parser.add_argument("--isolated", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = (pathlib.Path(args.out) if args.out else (
        ROOT / ".millm" / "agents-check" / time.strftime("%Y%m%d-%H%M%S"))).absolute()
    if not args.isolated and not args.no_isolate:
        enter = unshare_argv()
        if enter is None:
            print("note: cannot make a network namespace here; running on the host's network",
                  flush=True)
        else:
            inner = [sys.executable, str(pathlib.Path(__file__).resolve()), "--isolated",
                     "--out", str(out), "--clients", args.clients, "--models", args.models,
                     "--timeout", str(args.timeout), "--tries", str(args.tries)]
            return subprocess.call([*enter, "sh", "-c", 'ip link set lo up && exec "$@"',
                                    "sh", *inner])

    for name in args.clients.split(","):
        if name not in clients.CLIENTS:
            raise SystemExit(f"unknown client {name!r}; known: {', '.join(clients.CLIENTS)}")
        if not (clients.BIN / name.split("-")[0]).exists():
            raise SystemExit(f"{clients.BIN} lacks {name}: run `make agents-check` "
                             "(it runs `npm ci` in tests/agents)")
    out.mkdir(parents=True, exist_ok=True)
    network = (f"loopback-only network namespace (interfaces: {', '.join(interfaces())})"
               if args.isolated else "host network (not isolated)")
    versions = clients.versions()
    print(f"agents check: {', '.join(f'{k} {v}' for k, v in versions.items())}; {network}; "
          f"output in {out}", flush=True)
    results: list[dict] = []
    started = time.monotonic()
    (out / "millm").mkdir(exist_ok=True)
    stack = harness.OwnStack(out / "millm")
    try:
        print(f"miLLM bridge {stack.base_url} (engine {stack.grpc_target})", flush=True)
        for model in args.models.split(","):
            for client in args.clients.split(","):
                for attempt in range(1, args.tries + 1):
                    print(f"-- {client} on {model} (try {attempt}) ...", flush=True)
                    folder = out / f"{client}--{slug(model)}" / f"try-{attempt}"
                    if folder.exists():
                        shutil.rmtree(folder)
                    result = run_session(client, model, stack.http_port, folder, args.timeout)
                    result["tries"] = attempt
                    (folder / "result.json").write_text(json.dumps(result, indent=2))
                    print("\n".join(details(result)), flush=True)
                    if not model_chose_words(result):
                        break
                results.append(result)
    finally:
        stack.stop()
    summary = {"versions": versions, "network": network, "isolated": args.isolated,
               "seconds": round(time.monotonic() - started), "results": results}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    report = table(results)
    (out / "table.md").write_text(report + "\n")
    print(f"\n{report}\n\n{network}; exchanges and outputs in {out}")
    failed = [f"{r['client']} on {r['model']}" for r in results if not r["passed"]]
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        return 1
    print("agents check passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
