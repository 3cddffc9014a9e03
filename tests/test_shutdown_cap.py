"""The bridge's shutdown has a hard cap: a client that stalls its connection
cannot hold a SIGTERMed bridge open past MILLM_DRAIN_SECONDS +
MILLM_SHUTDOWN_GRACE_SECONDS.

The stalled client here sends half a request body and stops. A stream whose
reader stopped reading holds the bridge the same way once the socket buffers
are full, but on loopback those take megabytes, more than the demo model's
context can produce, so the upload is the deterministic way to stall.
"""

from __future__ import annotations

import signal
import socket
import time

from tests import harness
from tests.conftest import wait_until
from tests.http_helpers import call


def stalled_upload(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                 b"application/json\r\nContent-Length: 1000\r\n\r\n" + b'{"model": ' + b" " * 200)
    return sock


def in_flight(port: int) -> float:
    """The bridge's requests in flight, counting this scrape itself."""
    for line in call(port, "GET", "/metrics").text.splitlines():
        if line.startswith("millm_bridge_requests_in_flight "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError("millm_bridge_requests_in_flight")


def test_a_stalled_client_cannot_hold_the_bridge_open(tmp_path):
    stack = harness.OwnStack(tmp_path, bridge_env={"MILLM_DRAIN_SECONDS": "1",
                                                   "MILLM_SHUTDOWN_GRACE_SECONDS": "1"})
    try:
        sock = stalled_upload(stack.http_port)
        # The bridge is answering it (waiting for the rest of its body).
        assert wait_until(lambda: in_flight(stack.http_port) == 2)
        started = time.monotonic()
        stack.bridge.proc.send_signal(signal.SIGTERM)
        code = stack.bridge.proc.wait(timeout=30)
        took = time.monotonic() - started
        sock.close()
    finally:
        stack.stop()
    assert code == 0
    # The stalled request ran out the drain (1 s) and the grace (1 s), then was
    # cut off: well before the 30 s wait above, however slow the machine.
    assert 1.5 < took < 10, f"the bridge took {took:.1f}s to stop"
    assert "timeout graceful shutdown exceeded" in stack.bridge.log()
