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
import json
import re
import time

import grpc
import pytest

from millm.v1 import server_service_pb2, server_service_pb2_grpc
from tests import harness
from tests.conftest import MODEL
from tests.http_helpers import post, request

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
REQUESTS = 32  # the Bar: 32 non-streamed requests, all answered 200
STREAMS = 6
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


def body(stream: bool) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}],
            "max_tokens": 48, "ignore_eos": True, "stream": stream}


def metric(port: int, name: str) -> float:
    _, content = request(port, "GET", "/metrics")
    pattern = re.compile(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", re.M)
    return sum(float(v) for v in pattern.findall(content.decode()))


def test_sigkill_of_one_engine_loses_nothing_that_had_not_started(two_engines):
    engines, http_port = two_engines
    with concurrent.futures.ThreadPoolExecutor(REQUESTS + STREAMS + RESPONSE_REQUESTS) as pool:
        answers = [pool.submit(post, http_port, CHAT, body(False)) for _ in range(REQUESTS)]
        streams = [pool.submit(post, http_port, CHAT, body(True)) for _ in range(STREAMS)]
        responses = [pool.submit(post, http_port, RESPONSES, {
            "model": MODEL, "input": "Tell me a story.", "max_output_tokens": 48,
            "store": False}) for _ in range(RESPONSE_REQUESTS)]
        # Kill an engine a few tokens into its share (the router spread the
        # requests over both by load), while the other is generating too.
        deadline = time.monotonic() + 60
        while not (status(engines[0][1]).generated_tokens_total >= 4 * REQUESTS
                   and status(engines[1][1]).running_rows):
            assert time.monotonic() < deadline, "the engines never both generated"
            time.sleep(0.02)
        engines[0][0].proc.kill()
        replies = [f.result(timeout=120) for f in answers]
        streamed = [f.result(timeout=120) for f in streams]
        answered = [f.result(timeout=120) for f in responses]

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
        # it tokens, with an engine_unavailable event; never cut off. (Whether
        # any stream had tokens on the dead engine at the kill is timing.)
        assert reply.status == 200 and content.endswith(b"data: [DONE]\n\n")
        finished = b'"finish_reason":"length"' in content
        assert finished or b'"engine_unavailable"' in content, content[-300:]
    assert metric(http_port, "millm_bridge_stream_failures_total") == failed
    assert engines[1][0].alive()
