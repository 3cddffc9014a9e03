"""Failover benchmark: two engines behind one bridge, one SIGKILLed mid-run.

32 closed-loop streaming clients (each sends its next chat request when the
previous one ends) run for --seconds; at --kill-at one engine is killed with
SIGKILL. Each engine runs at most --max-batch rows (8), so each also holds
requests waiting in its queue when it dies. Every request ends one of four
ways, and the run prints how many:

  completed      the stream ended with [DONE] and no error event;
  error event    it ended with an error event and [DONE] (a stream that already
                 carried tokens when its engine died: expected);
  lost           it failed before its first token (an HTTP error, or an error
                 event with no token before it): must be 0, since such a
                 request is sent again to the surviving engine;
  hung           it did not end within --request-timeout: must be 0.

It also prints how many engine calls the bridge sent again
(millm_bridge_engine_retries_total) and how long after the kill the bridge
still started calls on the dead engine (from its engine_retry log lines: the
start of the last failed attempt, minus the kill time).

Usage: python bench/failover.py [--clients 32] [--seconds 24] [--kill-at 8] [--tokens 32]
                                [--max-batch 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import re
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import harness  # noqa: E402

MODEL = "millm-tiny"
PROMPTS = ["Tell me about rivers.", "What is a lighthouse?", "Describe a market morning.",
           "Why do cats sleep so much?"]


async def stream_once(port: int, body: dict, timeout: float) -> str:
    """One streamed chat request over a bare connection: its outcome."""
    payload = json.dumps(body).encode()
    try:
        return await asyncio.wait_for(_stream(port, payload), timeout)
    except TimeoutError:
        return "hung"


async def _stream(port: int, payload: bytes) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nConnection: close\r\n"
                     b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        await writer.drain()
        content = await reader.read()
    finally:
        writer.close()
    head, _, body = content.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        return "lost"
    if b"transfer-encoding: chunked" in head.lower():
        body = _dechunk(body)
    tokens = 0
    for line in body.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        event = json.loads(line[6:])
        if "error" in event:
            return "error event" if tokens else "lost"
        if any(c.get("delta", {}).get("content") for c in event.get("choices", [])):
            tokens += 1
    return "completed" if body.rstrip().endswith(b"data: [DONE]") else "lost"


def _dechunk(data: bytes) -> bytes:
    out, i = bytearray(), 0
    while True:
        end = data.index(b"\r\n", i)
        size = int(data[i:end].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += data[end + 2:end + 2 + size]
        i = end + 2 + size + 2


async def client(port: int, index: int, until: float, tokens: int, timeout: float,
                 outcomes: list[str]) -> None:
    n = 0
    while time.monotonic() < until:
        body = {"model": MODEL, "stream": True, "max_tokens": tokens, "ignore_eos": True,
                "messages": [{"role": "user", "content": PROMPTS[(index + n) % len(PROMPTS)]}]}
        outcomes.append(await stream_once(port, body, timeout))
        n += 1


async def killer(process: harness.Process, at: float, killed: list[float]) -> None:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    killed.append(time.time())
    process.proc.kill()


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    pattern = re.compile(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


def last_dead_attempt_ms(log_text: str, killed_s: float) -> float:
    """Milliseconds after the kill at which the last call that failed was started."""
    latest = float("-inf")
    for line in log_text.splitlines():
        start = line.find('{"message": "engine_retry"')
        if start < 0:
            continue
        started_ms = json.loads(line[start:])["attempt_started_ms"]
        latest = max(latest, started_ms - killed_s * 1000)
    return latest


async def run(args, port: int, victim: harness.Process) -> tuple[list[str], float]:
    start = time.monotonic()
    outcomes: list[str] = []
    killed: list[float] = []
    until = start + args.seconds
    tasks = [client(port, i, until, args.tokens, args.request_timeout, outcomes)
             for i in range(args.clients)]
    await asyncio.gather(killer(victim, start + args.kill_at, killed), *tasks)
    return outcomes, killed[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=24.0)
    parser.add_argument("--kill-at", type=float, default=8.0)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--request-timeout", type=float, default=120.0)
    # Below the clients per engine, so that each engine also holds requests
    # that wait in its queue (not started) when it dies.
    parser.add_argument("--max-batch", type=int, default=8)
    args = parser.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="millm-failover-"))
    engines, bridge = [], None
    try:
        for name in ("a", "b"):
            (tmp / name).mkdir()
            engines.append(harness.start_engine(tmp / name,
                                                MILLM_MAX_BATCH=str(args.max_batch)))
        for process, engine_port in engines:
            harness.wait_serving(process, engine_port)
        targets = ",".join(f"127.0.0.1:{p}" for _, p in engines)
        bridge, port = harness.start_bridge(tmp, engines[0][1], MILLM_ENGINE_TARGETS=targets)
        harness.wait_http(bridge, f"http://127.0.0.1:{port}/readyz")
        outcomes, killed = asyncio.run(run(args, port, engines[0][0]))
        retried = metric(port, "millm_bridge_engine_retries_total")
        failed_streams = metric(port, "millm_bridge_stream_failures_total")
        dead_ms = last_dead_attempt_ms(bridge.log(), killed)
    finally:
        if bridge is not None:
            bridge.stop()
        for process, _ in engines:
            process.stop()
    counts = {k: outcomes.count(k) for k in ("completed", "error event", "lost", "hung")}
    print(f"failover: {args.clients} streaming clients, {args.tokens} tokens each, two engines "
          f"(max batch {args.max_batch}), one SIGKILLed at {args.kill_at:.0f} s of "
          f"{args.seconds:.0f} s")
    print(f"  requests started          {len(outcomes)}")
    for name, count in counts.items():
        print(f"  {name:<25} {count}")
    print(f"  engine calls sent again   {retried:.0f}")
    print(f"  failed streams (metric)   {failed_streams:.0f}")
    if dead_ms > 0:
        print(f"  last call started on the dead engine: {dead_ms:.0f} ms after the kill")
    else:
        print("  no call was started on the dead engine after the kill (the bridge saw the "
              "connection drop at once)")
    ok = counts["lost"] == 0 and counts["hung"] == 0
    print("  OK: 0 lost, 0 hung" if ok else "  FAILED: requests were lost or hung")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
