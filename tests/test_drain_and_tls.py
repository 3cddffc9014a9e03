"""SIGTERM drains the bridge and the engine (running streams finish, new work
is refused), and the engine serves gRPC over TLS and mutual TLS."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from millm.v1 import generation_service_pb2_grpc
from tests import harness
from tests.conftest import MODEL
from tests.grpc_helpers import chat_request, error_info
from tests.http_helpers import open_stream, post

LONG = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": 600, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}}


def _read_until(sock, marker: bytes, limit: float = 60) -> bytes:
    data, deadline = b"", time.monotonic() + limit
    while marker not in data and time.monotonic() < deadline:
        piece = sock.recv(65536)
        if not piece:
            break
        data += piece
    return data


def test_sigterm_lets_running_streams_finish(tmp_path):
    engine, grpc_port = harness.start_engine(tmp_path, MILLM_DRAIN_SECONDS="30")
    bridge = None
    try:
        harness.wait_serving(engine, grpc_port)
        bridge, http_port = harness.start_bridge(tmp_path, grpc_port, MILLM_DRAIN_SECONDS="30")
        harness.wait_http(bridge, f"http://127.0.0.1:{http_port}/readyz")

        # The bridge: a stream is running when SIGTERM arrives.
        sock = open_stream(http_port, "/v1/chat/completions", LONG)
        head = _read_until(sock, b'"content":"')
        assert b"200 OK" in head
        bridge.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        refused, content = post(http_port, "/v1/chat/completions", {**LONG, "stream": False})
        assert refused.status == 503 and refused.getheader("Retry-After") == "1"
        assert json.loads(content)["error"]["code"] == "draining"
        with pytest.raises(urllib.error.HTTPError) as not_ready:
            urllib.request.urlopen(f"http://127.0.0.1:{http_port}/readyz", timeout=5)
        assert not_ready.value.code == 503
        rest = _read_until(sock, b"data: [DONE]")
        sock.close()
        events = [json.loads(line[6:]) for line in (head + rest).split(b"\n")
                  if line.startswith(b"data: {")]
        assert events[-1]["usage"]["completion_tokens"] == 600
        assert any(c["finish_reason"] == "length" for e in events for c in e["choices"])
        assert bridge.proc.wait(timeout=30) == 0

        # The engine: a gRPC stream is running when SIGTERM arrives.
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
            stream = stub.Generate(chat_request(max_tokens=600, ignore_eos=True), timeout=60)
            next(stream), next(stream)  # metadata, first tokens
            engine.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            with pytest.raises(grpc.RpcError) as caught:
                list(stub.Generate(chat_request(max_tokens=2), timeout=10))
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert error_info(caught.value).reason == "draining"
            health = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
            usage = [r.usage for r in stream if r.HasField("usage")]
            assert usage[0].completion_tokens == 600
        assert engine.proc.wait(timeout=30) == 0
    finally:
        if bridge is not None:
            bridge.stop()
        engine.stop()


# -- TLS ---------------------------------------------------------------------------------------


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.pem", "-days", "2", "-subj", "/CN=millm-test-ca", cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
                      ("client", "extendedKeyUsage=clientAuth")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                 f"{name}.csr", "-subj", f"/CN=millm-{name}", cwd=d)
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile",
                 f"{name}.ext", cwd=d)
    return d


def _credentials(certs, client: bool) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=(certs / "ca.pem").read_bytes(),
        private_key=(certs / "client.key").read_bytes() if client else None,
        certificate_chain=(certs / "client.pem").read_bytes() if client else None)


def _wait_serving(engine, port: int, credentials) -> None:
    deadline = time.monotonic() + 90
    with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            assert engine.alive(), engine.log()
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                    return
            except grpc.RpcError:
                time.sleep(0.2)
    raise AssertionError(engine.log())


def _generate(port: int, credentials) -> str:
    channel = (grpc.secure_channel(f"127.0.0.1:{port}", credentials) if credentials
               else grpc.insecure_channel(f"127.0.0.1:{port}"))
    with channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        return "".join(c.text for r in stub.Generate(chat_request(max_tokens=3), timeout=10)
                       for c in r.choices)


def test_tls_and_mutual_tls(tmp_path, certs):
    tls = {"MILLM_GRPC_TLS_CERT": str(certs / "server.pem"),
           "MILLM_GRPC_TLS_KEY": str(certs / "server.key")}
    engine, port = harness.start_engine(tmp_path, **tls)
    try:
        _wait_serving(engine, port, _credentials(certs, client=False))
        assert _generate(port, _credentials(certs, client=False))
        with pytest.raises(grpc.RpcError) as plain:
            _generate(port, None)  # plaintext to a TLS port
        assert plain.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        engine.stop()

    engine, port = harness.start_engine(tmp_path, **tls,
                                        MILLM_GRPC_TLS_CLIENT_CA=str(certs / "ca.pem"))
    bridge = None
    try:
        _wait_serving(engine, port, _credentials(certs, client=True))
        assert _generate(port, _credentials(certs, client=True))
        with pytest.raises(grpc.RpcError) as anonymous:
            _generate(port, _credentials(certs, client=False))  # no client certificate
        assert anonymous.value.code() == grpc.StatusCode.UNAVAILABLE
        # The bridge as an mTLS client of the engine.
        bridge, http_port = harness.start_bridge(
            tmp_path, port, MILLM_ENGINE_TLS_CA=str(certs / "ca.pem"),
            MILLM_ENGINE_TLS_CERT=str(certs / "client.pem"),
            MILLM_ENGINE_TLS_KEY=str(certs / "client.key"))
        harness.wait_http(bridge, f"http://127.0.0.1:{http_port}/readyz")
        reply, content = post(http_port, "/v1/chat/completions",
                              {**LONG, "stream": False, "max_tokens": 3})
        assert reply.status == 200, content
    finally:
        if bridge is not None:
            bridge.stop()
        engine.stop()
