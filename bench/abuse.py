"""Abuse benchmark: thousands of generated bad requests against a running stack.

Sends --requests (default 10,000) requests drawn from a seeded generator, from
--concurrency clients at once, across every route family: the /v1 routes with
wrong types, out-of-range values, strings of tens of thousands of characters,
thousands of unknown keys (under X-miLLM-Strict too), nesting thousands of
levels deep, unpaired surrogates, NUL and right-to-left text, bodies that are
not JSON or too large; the management API with odd names and documents;
oversized headers, URLs and keys; unknown paths and methods. Any of them that
happens to be valid asks for at most two tokens.

Prints the answers by status and fails (exits non-zero) on any 5xx, any hung
request (no answer within --timeout), any request dropped (the connection
reset or refused before a status was read: a bridge that died answers every
later request that way) or answered without a status line; and, once the
run is over, unless the bridge is still ready (/readyz) and the engine still
generates a plain chat completion. The client does not let the server's early
answer race its own writes: a body is sent only once the server asks for it
(`Expect: 100-continue`; after 2 s without an interim answer, anyway), in
pieces, and an answer that arrives meanwhile (a 413 past the size limit)
stops the writing. Without --base-url it starts an engine and a bridge of
its own.

Usage: python bench/abuse.py [--requests 10000] [--concurrency 64] [--seed N]
                             [--base-url http://127.0.0.1:8000]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import pathlib
import random
import sys
import tempfile
import time
import urllib.parse

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = "millm-tiny"
ODD = ["\x00", "\u202e", "\u200f", "\U0001f600", "\ufeff", "\ud800", "\udfff", "<|im_start|>",
       "\r\n", '"', "\\", "%s", "\x1b[31m", "e\u0301"]


class Draw:
    """Bad requests from one seeded random generator: (method, path, headers, body)."""

    def __init__(self, seed: int):
        self.r = random.Random(seed)

    def text(self) -> str:
        r = self.r
        kind = r.randrange(4)
        if kind == 0:
            return r.choice(["a", "\U0001f600", "\u202e", "\x00", "é"]) * r.randrange(1_000,
                                                                                     40_000)
        if kind == 1:
            return "".join(r.choice(ODD) for _ in range(r.randrange(1, 8)))
        return "".join(chr(r.randrange(32, 0x3000)) for _ in range(r.randrange(0, 20)))

    def value(self):
        r = self.r
        return r.choice([
            None, True, -1, 2**70, 1e308, -0.5, "", self.text(), [], {}, [self.text()],
            {self.text(): self.text()}, self.deep(r.randrange(2, 300)),
            {f"k{i}": i for i in range(r.randrange(100, 3_000))},
        ])

    def deep(self, depth: int):
        value = 1
        for _ in range(depth):
            value = [value] if self.r.random() < 0.5 else {"a": value}
        return value

    def generation_body(self, route: str) -> dict:
        r = self.r
        body = {"model": r.choice([MODEL, MODEL, self.text(), ""]), "max_tokens": r.choice(
            [1, 2, 0, -1, 2**63, "2"])}
        if route == "/v1/chat/completions":
            body["messages"] = r.choice([
                [{"role": "user", "content": self.text()}],
                [{"role": r.choice(["wizard", "", "tool"]), "content": self.value()}],
                self.value(), [{"content": "x"}] * r.randrange(1, 3_000)])
        elif route == "/v1/completions":
            body["prompt"] = r.choice([self.text(), self.value(), [r.randrange(-5, 10**6)] * 3])
        elif route == "/v1/responses":
            body = {"model": body["model"], "max_output_tokens": body.pop("max_tokens"),
                    "input": r.choice([self.text(), self.value(),
                                       [{"role": "user", "content": self.value()}]])}
            for _ in range(r.randrange(0, 3)):
                body[r.choice(["previous_response_id", "store", "instructions", "metadata",
                               "text", "tool_choice", "max_output_tokens", "truncation"])] = \
                    self.value()
        else:
            body = {"model": body["model"], "input": r.choice([self.text(), self.value()])}
        for _ in range(r.randrange(0, 4)):
            body[r.choice(["temperature", "top_p", "n", "stop", "seed", "logprobs", "tools",
                           "profile", "steering_intensity", "response_format", "logit_bias",
                           "return_sae_activations", "stream", "user", self.text()])] = \
                self.value()
        if r.random() < 0.1:
            body.update({f"unknown_{i}": i for i in range(r.randrange(100, 3_000))})
        return body

    def request(self) -> tuple[str, str, dict, bytes | None]:
        r = self.r
        headers = {"Content-Type": "application/json"}
        if r.random() < 0.2:
            headers["X-miLLM-Strict"] = r.choice(["1", "true", "maybe"])
        kind = r.randrange(12)
        name = urllib.parse.quote(self.text().encode("utf-8", "surrogatepass")[:3_000], safe="")
        if kind <= 5:
            route = r.choice(["/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                              "/v1/responses"])
            return "POST", route, headers, self.json(self.generation_body(route))
        if kind == 6:  # not JSON, or not an object, or too deep, or too large (or said so)
            raw = r.choice([b"{", b"\xff\xfe", b"[]", b'"x"', b"{" * 5_000 + b"}" * 5_000,
                            None, b"NaN", b"", b'{"x": "' + b"a" * r.randrange(1_050_000,
                                                                              3_000_000) + b'"}'])
            if raw is None:  # declared too large: refused before the body is read
                headers["Content-Length"] = "1100000"
            return "POST", r.choice(["/v1/chat/completions", "/v1/completions",
                                     "/v1/embeddings", "/api/profiles"]), headers, raw
        if kind == 7:
            doc = {"name": self.text(), "entries": self.value(), "members": self.value(),
                   "rung": self.value(), "format": self.value(), self.text(): self.value()}
            method, path = r.choice([("POST", "/api/profiles"), ("POST", "/api/clusters"),
                                     ("POST", "/api/circuits"), ("PUT", "/api/steering"),
                                     ("PATCH", f"/api/profiles/{name}"),
                                     ("PUT", f"/api/clusters/{name}/intensity")])
            return method, path, headers, self.json(doc)
        if kind == 8:
            method, path = r.choice([
                ("GET", f"/api/profiles/{name}"), ("DELETE", f"/api/profiles/{name}"),
                ("GET", f"/api/models/{name}"), ("GET", f"/v1/models/{name}"),
                ("POST", f"/api/saes/{name}/attach"), ("POST", f"/api/models/{name}/load"),
                ("GET", f"/api/circuits/{name}"), ("POST", f"/api/circuits/{name}/activate"),
                ("GET", f"/v1/responses/{name}"), ("DELETE", f"/v1/responses/{name}"),
                ("GET", f"/v1/responses/{name}/input_items?limit={name[:40]}"),
                ("GET", f"/v1/responses/resp_{name}/input_items?after={name[:40]}")])
            return method, path, headers, None
        if kind == 9:  # oversized or undecodable headers
            headers[r.choice(["X-Big", "Authorization", "X-Request-Id", "X-API-Key"])] = r.choice(
                ["Bearer " + "k" * 40_000, "x" * 40_000, "Bearer \u00e9\u00e9", "Bearer a b"])
            return "POST", "/v1/completions", headers, self.json({"model": MODEL, "prompt": "x",
                                                                  "max_tokens": 1})
        if kind == 10:  # long URLs, unknown paths, wrong methods
            return r.choice([("GET", "/v1/" + "a" * r.randrange(1_000, 40_000)),
                             ("DELETE", "/v1/chat/completions"), ("GET", "/v1/files"),
                             ("PUT", "/v1/completions"), ("GET", f"/{name}"),
                             ("BREW", "/v1/models")]) + (headers, None)
        return "POST", "/v1/chat/completions", headers, self.json({
            "model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
            **{self.text()[:64]: self.value() for _ in range(r.randrange(1, 6))}})

    @staticmethod
    def json(value) -> bytes:
        return json.dumps(value).encode()


async def send(host: str, port: int, method: str, path: str, headers: dict,
               body: bytes | None, timeout: float) -> int | str:
    try:
        return await asyncio.wait_for(_send(host, port, method, path, headers, body), timeout)
    except TimeoutError:
        return "hung"
    except (ConnectionError, OSError):
        return "dropped"


async def _send(host, port, method, path, headers, body) -> int | str:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None and "Content-Length" not in headers:
            lines.append(f"Content-Length: {len(body)}")
        if body:
            # The body only once the server asks for it: a server may answer
            # (a 404, a 413) without reading it and close, and a body written
            # into that close would reset the connection and lose the answer.
            lines.append("Expect: 100-continue")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogatepass"))
        status_line = b""
        if body:
            try:
                status_line = await asyncio.wait_for(reader.readline(), 2)
            except TimeoutError:  # a server that ignores Expect: send the body anyway
                status_line = b"HTTP/1.1 100 (no interim answer)"
        if body and b" 100 " in status_line:
            while status_line.startswith(b"HTTP/1.1 100 C") and (
                    await reader.readline()).strip():  # the interim answer's headers
                pass
            answer = asyncio.ensure_future(reader.readline())
            # In pieces while the answer is awaited: one that comes early (a
            # 413 past the body limit) stops the writing.
            for start in range(0, len(body), 65_536):
                await asyncio.sleep(0)
                if answer.done():
                    break
                writer.write(body[start:start + 65_536])
                try:
                    await writer.drain()
                except ConnectionError:
                    break
            status_line = await answer
        elif not body:
            status_line = await reader.readline()
        await reader.read()
    finally:
        writer.close()
    parts = status_line.split()
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else "no status"


async def run(args, host: str, port: int) -> collections.Counter:
    draw = Draw(args.seed)
    outcomes: collections.Counter = collections.Counter()
    examples = run.examples = {}
    queue: asyncio.Queue = asyncio.Queue()
    for _ in range(args.requests):
        queue.put_nowait(draw.request())

    async def worker():
        while not queue.empty():
            method, path, headers, body = queue.get_nowait()
            outcome = await send(host, port, method, path, headers, body, args.timeout)
            outcomes[outcome] += 1
            if not isinstance(outcome, int) or outcome >= 500:
                examples.setdefault(outcome, []).append(
                    f"{method} {path[:120]} {str(headers)[:160]} {(body or b'')[:300]!r}")

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    return outcomes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seed", type=int, default=random.randrange(2**32))
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--base-url", default=None)
    args = parser.parse_args()
    stack = None
    if args.base_url is None:
        from tests import harness

        stack = harness.OwnStack(pathlib.Path(tempfile.mkdtemp(prefix="millm-abuse-")))
        args.base_url = stack.base_url
    url = urllib.parse.urlsplit(args.base_url)
    try:
        started = time.perf_counter()
        outcomes = asyncio.run(run(args, url.hostname, url.port or 80))
        seconds = time.perf_counter() - started
        still = asyncio.run(alive(url.hostname, url.port or 80, args.timeout))
    finally:
        if stack is not None:
            stack.stop()
    server_errors = sum(n for k, n in outcomes.items() if isinstance(k, int) and k >= 500)
    hung, dropped, no_status = outcomes["hung"], outcomes["dropped"], outcomes["no status"]
    print(f"abuse: {args.requests} generated bad requests, {args.concurrency} at a time, "
          f"seed {args.seed}, {seconds:.1f} s ({args.requests / seconds:.0f} requests/s)")
    for key, count in sorted(outcomes.items(), key=lambda kv: str(kv[0])):
        print(f"  {key!s:<10} {count}")
    for outcome, shown in run.examples.items():
        for line in shown[:3]:
            print(f"  e.g. {outcome}: {line}")
    print(f"  5xx: {server_errors}   hung: {hung}   dropped: {dropped}   no status: {no_status}")
    print(f"  afterwards: {still or 'the bridge is ready and the engine generates'}")
    ok = server_errors == 0 and hung == 0 and dropped == 0 and no_status == 0 and still is None
    print("  OK" if ok else f"  FAILED (rerun with --seed {args.seed})")
    return 0 if ok else 1


async def alive(host: str, port: int, timeout: float) -> str | None:
    """None when the bridge is still ready and the engine still generates;
    otherwise what is wrong."""
    ready = await send(host, port, "GET", "/readyz", {}, None, timeout)
    if ready != 200:
        return f"the bridge is not ready afterwards (/readyz: {ready})"
    body = json.dumps({"model": MODEL, "max_tokens": 1,
                       "messages": [{"role": "user", "content": "Hi"}]}).encode()
    answer = await send(host, port, "POST", "/v1/chat/completions",
                        {"Content-Type": "application/json"}, body, timeout)
    if answer != 200:
        return f"the engine does not generate afterwards (a plain chat completion: {answer})"
    return None


if __name__ == "__main__":
    sys.exit(main())
