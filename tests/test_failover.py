"""Two engines behind one bridge, one of them SIGKILLed under load: nothing that
had not reached the client is lost.

Non-streamed requests have sent the client nothing, so every one is answered
200 (those on the dead engine are sent again to the survivor), Responses API
requests included. Streams that
already carried tokens end with an error event and [DONE], and the bridge
counts them as failed streams rather than as plain 200s.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import re

import grpc
import pytest

from millm.v1 import server_service_pb2, server_service_pb2_grpc
from tests import harness
from tests.conftest import MODEL, wait_until
from tests.http_helpers import post, request

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
REQUESTS = 32  # the Bar: 32 non-streamed requests, all answered 200
STREAMS = 6
STREAM_TOKENS = 900  # long: still running on the engine that dies
RESPONSE_REQUESTS = 6  # the Responses API goes the same way


@pytest.fixture
def two_engines(tmp_path):
    engines = []
    bridge = None
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            # A small batch, so each engine also holds requests waiting in
            # its queue when it dies (the Responses requests, sent last).
            engines.append(harness.start_engine(tmp_path / name, MILLM_MAX_BATCH="8"))
        for process, port in engines:
            harness.wait_serving(process, port)
        targets = ",".join(f"127.0.0.1:{port}" for _, port in engines)
        bridge, http_port = harness.start_bridge(tmp_path, engines[0][1],
                                                 MILLM_ENGINE_TARGETS=targets)
        harness.wait_http(bridge, f"http://127.0.0.1:{http_port}/readyz")
        yield engines, http_port
    finally:
        if bridge is not None:
            bridge.stop()
        for process, _ in engines:
            process.stop()


def status(port: int) -> server_service_pb2.GetInferenceStatusResponse:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = server_service_pb2_grpc.ServerServiceStub(channel)
        return stub.GetInferenceStatus(server_service_pb2.GetInferenceStatusRequest(),
                                       timeout=5)


def body(stream: bool, tokens: int = 48) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}],
            "max_tokens": tokens, "ignore_eos": True, "stream": stream}


class StartedStream:
    """A streamed chat read up to its first content chunk; finish() reads the rest."""

    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.conn.request("POST", CHAT, body=json.dumps(body(True, STREAM_TOKENS)).encode(),
                          headers={"Content-Type": "application/json"})
        self.reply = self.conn.getresponse()
        assert self.reply.status == 200
        self.head = b""
        while True:
            line = self.reply.readline()
            assert line, self.head[-300:]
            self.head += line
            if line.startswith(b"data: {"):
                choices = json.loads(line[len(b"data: "):])["choices"]
                if choices and choices[0]["delta"].get("content"):
                    return

    def finish(self) -> tuple[http.client.HTTPResponse, bytes]:
        try:
            return self.reply, self.head + self.reply.read()
        finally:
            self.conn.close()


def metric(port: int, name: str) -> float:
    _, content = request(port, "GET", "/metrics")
    pattern = re.compile(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", re.M)
    return sum(float(v) for v in pattern.findall(content.decode()))


def test_sigkill_of_one_engine_loses_nothing_that_had_not_started(two_engines):
    engines, http_port = two_engines
    # Streams first, each until its first tokens: they are running, spread by load.
    started = [StartedStream(http_port) for _ in range(STREAMS)]
    rows = [status(port).running_rows for _, port in engines]
    victim = max(range(2), key=lambda i: rows[i])  # it certainly holds started streams
    (victim_process, victim_port), (survivor, survivor_port) = engines[victim], engines[1 - victim]
    assert rows[victim] >= 1
    with concurrent.futures.ThreadPoolExecutor(REQUESTS + RESPONSE_REQUESTS) as pool:
        answers = [pool.submit(post, http_port, CHAT, body(False)) for _ in range(REQUESTS)]
        responses = [pool.submit(post, http_port, RESPONSES, {
            "model": MODEL, "input": "Tell me a story.", "max_output_tokens": 48,
            "store": False}) for _ in range(RESPONSE_REQUESTS)]
        # Kill that engine once it also holds non-streamed requests (the router
        # spread them over both by load), while the other is generating too.
        def both_busy() -> bool:
            held = status(victim_port)
            return (held.active_generations + held.queued_requests > rows[victim]
                    and status(survivor_port).running_rows > 0)
        assert wait_until(both_busy, 60, 0.02), "the engines never both generated"
        victim_process.proc.kill()
        replies = [f.result(timeout=120) for f in answers]
        answered = [f.result(timeout=120) for f in responses]
    streamed = [stream.finish() for stream in started]

    assert [reply.status for reply, _ in replies] == [200] * REQUESTS
    for _, content in replies:
        assert json.loads(content)["usage"]["completion_tokens"] == 48
    for reply, content in answered:
        assert reply.status == 200, content[:300]
        done = json.loads(content)
        assert done["status"] in ("completed", "incomplete")  # stop, or max_output_tokens
        assert done["usage"]["output_tokens"] >= 1
    retried = metric(http_port, "millm_bridge_engine_retries_total")
    assert retried >= 1  # the dead engine held some of them

    failed = 0
    for reply, content in streamed:
        failed += b'"engine_unavailable"' in content
        # A stream either ends normally or, when the dead engine had already sent
        # it tokens, with an engine_unavailable event; never cut off.
        assert reply.status == 200 and content.endswith(b"data: [DONE]\n\n")
        finished = b'"finish_reason":"length"' in content
        assert finished or b'"engine_unavailable"' in content, content[-300:]
    # Those on the dead engine had tokens: they failed, and the bridge says so.
    assert 1 <= failed <= rows[victim]
    assert metric(http_port, "millm_bridge_stream_failures_total") == failed
    assert survivor.alive()
