"""A replica that changes its model is NOT_SERVING (health entry
millm.routable) until the change is done, and a bridge over several engines
checks that entry (round_robin) or the replica's load report (load_prefix,
rest_bridge/routing/), so it sends the traffic to the other replica: chats
through the bridge during one engine's switch all answer 200, none
model_busy. Two real engines (SQLite each: no shared state needed here) and
one bridge over both."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from millm.v1 import model_service_pb2, model_service_pb2_grpc
from tests import harness
from tests.conftest import MODEL
from tests.http_helpers import call

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 4,
        "temperature": 0}


@pytest.mark.parametrize("routing", ["load_prefix", "round_robin"])
def test_a_switching_replica_gets_no_traffic_and_nothing_answers_model_busy(tmp_path, routing):
    engines = [harness.start_engine(tmp_path / name) for name in ("a", "b")
               if (tmp_path / name).mkdir() is None]
    bridge, threads, stop = None, [], threading.Event()
    try:
        for process, port in engines:
            harness.wait_serving(process, port)
        (_, port_a), (_, port_b) = engines
        bridge, http = harness.start_bridge(
            tmp_path, port_a, MILLM_ENGINE_TARGETS=f"127.0.0.1:{port_a},127.0.0.1:{port_b}",
            MILLM_ROUTING=routing)
        harness.wait_http(bridge, f"http://127.0.0.1:{http}/readyz")
        statuses, seen = [], []

        def load():
            while not stop.is_set():
                reply = call(http, "POST", "/v1/chat/completions", CHAT)
                statuses.append((reply.status_code, reply.text[:200]))

        def watch():
            with grpc.insecure_channel(f"127.0.0.1:{port_a}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                while not stop.is_set():
                    seen.append(stub.Check(health_pb2.HealthCheckRequest(
                        service="millm.routable")).status)
                    time.sleep(0.01)

        threads += [threading.Thread(target=load) for _ in range(3)]
        threads.append(threading.Thread(target=watch))
        for t in threads:
            t.start()
        time.sleep(1.0)
        # A model change on a: unload, then load (a switch passes through the
        # same phases: draining, releasing, loading). Loading millm-tiny again
        # keeps the load's requests valid for a once it is back.
        with grpc.insecure_channel(f"127.0.0.1:{port_a}") as channel:
            models = model_service_pb2_grpc.ModelServiceStub(channel)
            models.UnloadModel(model_service_pb2.UnloadModelRequest(id=MODEL), timeout=60)
            time.sleep(0.5)
            loaded = models.LoadModel(model_service_pb2.LoadModelRequest(id=MODEL), timeout=60)
        assert loaded.model.id == MODEL
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(60)
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        assert not_serving in seen  # the switch was visible to health checks
        assert seen[-1] == health_pb2.HealthCheckResponse.SERVING  # and ended
        assert statuses and all(code == 200 for code, _ in statuses), \
            [s for s in statuses if s[0] != 200][:3]
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        stop_all = [bridge] if bridge is not None else []
        for process in [*stop_all, *(p for p, _ in engines)]:
            process.stop()
