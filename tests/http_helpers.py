"""Raw HTTP in tests, where the exact bytes on the wire matter."""

from __future__ import annotations

import dataclasses
import http.client
import json
import socket


def post(port: int, path: str, body, headers: dict | None = None, raw: bytes | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = raw if raw is not None else json.dumps(body).encode()
    conn.request("POST", path, body=data,
                 headers={"Content-Type": "application/json", **(headers or {})})
    reply = conn.getresponse()
    content = reply.read()
    conn.close()
    return reply, content


@dataclasses.dataclass
class Reply:
    status_code: int
    text: str
    headers: dict  # lower-case names

    def json(self):
        return json.loads(self.text)


def call(port: int, method: str, path: str, body=None, raw: bytes | None = None,
         timeout: float = 60) -> Reply:
    """Any method with a JSON body (or raw bytes), read whole."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = raw if raw is not None else json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    reply = conn.getresponse()
    out = Reply(reply.status, reply.read().decode(),
                {k.lower(): v for k, v in reply.getheaders()})
    conn.close()
    return out


def request(port: int, method: str, path: str):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(method, path)
    reply = conn.getresponse()
    content = reply.read()
    conn.close()
    return reply, content


def open_stream(port: int, path: str, body: dict) -> socket.socket:
    """Send a request on a bare socket and return it unread, for disconnect tests."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n".encode() + data
    )
    return sock


def sse_events(content: bytes) -> list[bytes]:
    """Split an SSE body into its `data:` payloads, checking the framing."""
    assert content.endswith(b"\n\n"), content[-50:]
    frames = content[:-2].split(b"\n\n")
    payloads = []
    for frame in frames:
        assert frame.startswith(b"data: "), frame
        assert b"\n" not in frame, frame
        payloads.append(frame[len(b"data: "):])
    return payloads


class SseStream:
    """A streamed POST read line by line as it arrives: `with SseStream(...) as
    s: for line in s.lines(): ...`; leaving the block closes the connection."""

    def __init__(self, base_url: str, path: str, body: dict, timeout: float = 120):
        host, port = base_url.removeprefix("http://").split(":")
        self._conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
        self._conn.request("POST", path, body=json.dumps(body).encode(),
                           headers={"Content-Type": "application/json"})
        self.reply = self._conn.getresponse()

    def lines(self):
        """Each non-empty line of the body (`data: ...` for SSE)."""
        while True:
            line = self.reply.readline()
            if not line:
                return
            line = line.decode().rstrip("\r\n")
            if line:
                yield line

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._conn.close()
