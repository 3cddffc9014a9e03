"""The peer benchmark's HTTP client: the same bare HTTP/1.1 on both servers.

One connection per request (`Connection: close`), so neither server gains
from keeping connections; a body is read to its declared length or its last
chunk (not to the server's close, which may come later).
Streamed replies are read to `data: [DONE]`, timing the first non-empty
content; usage comes from the chunk that carries it (stream_options).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import time

_CONTENT = re.compile(rb'"content":\s?"[^"]')


def _request(port: int, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nConnection: close\r\nContent-Length: "
            + str(len(payload)).encode() + b"\r\n\r\n" + payload)


def _split(raw: bytes) -> tuple[bytes, bytes]:
    """(status line and headers, body dechunked where it is chunked)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"request failed: {raw[:400]!r}")
    if b"transfer-encoding: chunked" not in head.lower():
        return head, body
    out, rest = bytearray(), body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        try:
            size = int(size_line.split(b";")[0], 16)
        except ValueError:
            break
        if size == 0:
            break
        out += rest[:size]
        rest = rest[size + 2:]
    return head, bytes(out)


async def _exchange(port: int, body: dict, stream: bool) -> tuple[bytes, float | None]:
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_request(port, body))
    await writer.drain()
    raw, first = b"", None
    while True:
        piece = await reader.read(65536)
        if not piece:
            break
        raw += piece
        if stream:
            if first is None and _CONTENT.search(raw):
                first = time.perf_counter() - started
            if b"data: [DONE]" in raw:
                break
        elif _complete(raw):
            break
    writer.close()
    if stream and first is None:  # no text at all (a random-weight model's bytes): its end
        first = time.perf_counter() - started
    return raw, first


def _complete(raw: bytes) -> bool:
    """Whether a non-streamed reply is all here."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        return False
    match = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    if match:
        return len(body) >= int(match.group(1))
    return body.endswith(b"0\r\n\r\n")  # chunked: its last chunk


async def post(port: int, body: dict) -> dict:
    """A non-streamed chat completion's JSON."""
    raw, _ = await _exchange(port, body, False)
    return json.loads(_split(raw)[1])


async def stream(port: int, body: dict) -> tuple[float, dict, int]:
    """A streamed chat completion: (seconds to first content, its usage, how
    many events carried content). The last says whether a server sent a token
    an event or joined several into one (miLLM joins steps that pile up
    behind a slow reader; the comparison prints both sides' count)."""
    raw, first = await _exchange(port, body, True)
    usage, events = None, 0
    for line in _split(raw)[1].split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        chunk = json.loads(line[6:])
        usage = chunk.get("usage") or usage
        events += any((choice.get("delta") or {}).get("content")
                      for choice in chunk.get("choices") or ())
    if usage is None or first is None:
        raise RuntimeError(f"stream ended without content or usage: {raw[-400:]!r}")
    return first, usage, events


def post_json(port: int, body: dict) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    reply = conn.getresponse()
    content = reply.read()
    conn.close()
    if reply.status != 200:
        raise RuntimeError(f"request failed ({reply.status}): {content[:400]!r}")
    return json.loads(content)
