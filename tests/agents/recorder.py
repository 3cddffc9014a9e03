"""A recording reverse proxy for `make agents-check`, on loopback in front of the bridge.

The check must judge each coding agent by what actually crossed the wire
(every status, the request that carried a tool result back), and a failing run
is only useful if the exact request the bridge refused is kept. The bridge's
own log does not hold bodies, so each agent talks to this relay instead: it
forwards every request unchanged, passes the answer back chunk by chunk as it
arrives (the agents stream), and appends one JSON line per exchange (request
headers and body, status, response headers and body) to a file.

Standard library only: the check runs from the project's venv.
"""

from __future__ import annotations

import http.client
import json
import pathlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Headers that belong to one hop; the relay sets its own framing.
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
              "proxy-connection", "content-length", "host"}
SECRET_HEADERS = {"authorization", "x-api-key", "api-key"}


class Recorder(ThreadingHTTPServer):
    """Listens on a free loopback port; forwards to 127.0.0.1:target_port."""

    daemon_threads = True

    def __init__(self, target_port: int, log_path: pathlib.Path):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.target_port = target_port
        self.log_path = log_path
        self.exchanges: list[dict] = []
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.server_address[1]

    def start(self) -> Recorder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def keep(self, record: dict) -> None:
        with self.lock:
            record["seq"] = len(self.exchanges)
            self.exchanges.append(record)
            with open(self.log_path, "a", encoding="utf-8") as out:
                out.write(json.dumps(record) + "\n")


def _body(raw: bytes, content_type: str):
    """JSON when it parses, else text (an SSE stream stays text)."""
    text = raw.decode("utf-8", errors="replace")
    if "json" in content_type or text[:1] in "{[":
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._relay()

    def do_POST(self):
        self._relay()

    def do_HEAD(self):
        self._relay()

    def do_PUT(self):
        self._relay()

    def do_DELETE(self):
        self._relay()

    def do_OPTIONS(self):
        self._relay()

    def _read_request_body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(raw)
                raw += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else None

    def _relay(self) -> None:
        started = time.time()
        raw = self._read_request_body()
        request_headers = {k: ("<redacted>" if k.lower() in SECRET_HEADERS else v)
                           for k, v in self.headers.items()}
        record: dict = {
            "time": started, "method": self.command, "path": self.path,
            "request_headers": request_headers,
            "request": _body(raw, self.headers.get("Content-Type", "")) if raw else None,
        }
        forward = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        conn = http.client.HTTPConnection("127.0.0.1", self.server.target_port, timeout=900)
        got = bytearray()
        try:
            conn.request(self.command, self.path, body=raw, headers=forward)
            reply = conn.getresponse()
            content_type = reply.getheader("Content-Type", "")
            record.update(status=reply.status, response_headers=dict(reply.getheaders()))
            self.send_response(reply.status)
            for key, value in reply.getheaders():
                if key.lower() not in HOP_BY_HOP:
                    self.send_header(key, value)
            bodiless = self.command == "HEAD" or reply.status in (204, 304)
            if not bodiless:
                self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while not bodiless and (chunk := reply.read1(65536)):
                got += chunk
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            record["response"] = _body(bytes(got), content_type)
            # Kept before the agent sees the end of the answer: once it has the
            # whole answer it may exit, and the check reads the records.
            self._finish(record, started, conn)
            if not bodiless:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
        except (OSError, http.client.HTTPException) as exc:
            # The agent hung up, or the bridge did: keep what came, say so.
            record.setdefault("status", 0)
            record["relay_error"] = f"{type(exc).__name__}: {exc}"
            record["response"] = _body(bytes(got), "")
            self.close_connection = True
            self._finish(record, started, conn)

    def _finish(self, record: dict, started: float, conn) -> None:
        if "seconds" not in record:
            conn.close()
            record["seconds"] = round(time.time() - started, 3)
            self.server.keep(record)
