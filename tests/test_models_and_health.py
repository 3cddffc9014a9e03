"""GET /v1/models, /healthz and /readyz; readiness follows the engine."""

from __future__ import annotations

import json

import openai
import pytest

from tests import harness
from tests.conftest import MODEL
from tests.http_helpers import post, request


def test_list_models(client):
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids[0] == MODEL
    tiny = models.data[0]
    assert tiny.object == "model" and tiny.owned_by == "millm" and tiny.created > 0


def test_get_model(client):
    model = client.models.retrieve(MODEL)
    assert model.id == MODEL and model.object == "model"


def test_get_unknown_model(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("nope")
    assert err.value.code == "model_not_found"


def test_healthz_and_readyz(stack):
    reply, content = request(stack.http_port, "GET", "/healthz")
    assert reply.status == 200
    for path in ("/readyz", "/health"):  # /health: an alias, for probes that expect it
        reply, content = request(stack.http_port, "GET", path)
        assert reply.status == 200
        assert json.loads(content) == {"status": "ready", "state_store": "available"}


def test_bridge_without_engine(tmp_path):
    """A bridge whose engine is down is alive but not ready, and says so in OpenAI's shape."""
    bridge, port = harness.start_bridge(tmp_path, harness.free_port())
    try:
        harness.wait_http(bridge, f"http://127.0.0.1:{port}/healthz")
        reply, content = request(port, "GET", "/readyz")
        assert reply.status == 503
        assert json.loads(content)["status"] == "not_ready"
        reply, content = post(port, "/v1/chat/completions",
                              {"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
        assert reply.status == 503
        assert reply.getheader("retry-after") == "1"
        assert json.loads(content)["error"]["code"] == "engine_unavailable"
    finally:
        bridge.stop()


def test_bridge_balances_over_several_engines(stack, tmp_path, server_stub):
    """With two engine targets, gRPC's round_robin policy spreads the calls."""
    import grpc

    from millm.v1 import server_service_pb2_grpc
    from tests.conftest import inference_status, wait_until
    from tests.test_routing import _routable

    second, second_port = harness.start_engine(tmp_path)
    bridge = None
    try:
        harness.wait_serving(second, second_port)
        targets = f"127.0.0.1:{stack.grpc_port},127.0.0.1:{second_port}"
        bridge, port = harness.start_bridge(tmp_path, stack.grpc_port,
                                            MILLM_ENGINE_TARGETS=targets)
        harness.wait_http(bridge, f"http://127.0.0.1:{port}/readyz")
        # The router sends calls only to replicas whose load stream it hears;
        # until the second one's is live, every call would go to the first.
        assert wait_until(lambda: _routable(port) == 2, timeout=10), "a replica never routable"
        with grpc.insecure_channel(f"127.0.0.1:{second_port}") as channel:
            second_stub = server_service_pb2_grpc.ServerServiceStub(channel)
            before = (inference_status(server_stub).completed_generations_total,
                      inference_status(second_stub).completed_generations_total)
            for _ in range(8):
                # Each request starts from both replicas routable and idle as
                # the router sees them, so its pick is the tie taken in turn.
                assert wait_until(lambda: _routable(port) == 2 and _loads(port) == [0, 0],
                                  timeout=30), (_routable(port), _loads(port))
                reply, _ = post(port, "/v1/completions",
                                {"model": MODEL, "prompt": "The river", "max_tokens": 2})
                assert reply.status == 200
            after = (inference_status(server_stub).completed_generations_total,
                     inference_status(second_stub).completed_generations_total)
        served = [a - b for a, b in zip(after, before, strict=True)]
        assert sum(served) == 8 and min(served) >= 2, served
    finally:
        if bridge is not None:
            bridge.stop()
        second.stop()


def _loads(http: int) -> list[float]:
    """The load the bridge's router weighs for each replica (its metrics)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("millm_bridge_replica_load{")]
