"""Two real engines and one bridge on one real PostgreSQL (tests/postgres.py):
every replica applies every change, within a second; the operator wins across
replicas; an engine killed mid-write loses nothing committed and catches up
before SERVING when it comes back; with the database stopped, generation goes
on with the last applied state while writes answer 503, and everything
recovers when it is back. A write answers live only once every replica that
answers has applied it; a killed replica stops counting within seconds, a
stopped one at once. Each engine is also addressed directly over gRPC,
so "visible on both" is checked on both, not on whichever the bridge picked.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import threading
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from millm.v1 import (
    generation_service_pb2_grpc,
    monitoring_service_pb2,
    steering_pb2,
    steering_service_pb2,
)
from millm.v1 import monitoring_service_pb2_grpc as monitoring_grpc
from millm.v1 import steering_service_pb2_grpc as steering_grpc
from service.state import migrations
from service.state.postgres import PostgresDatabase
from service.steering import acks
from tests import harness
from tests.conftest import wait_until
from tests.grpc_helpers import chat_request, error_info
from tests.http_helpers import call
from tests.postgres import PostgresCluster
from tests.steering_helpers import first_feature_that_changes

L1 = "sae_millm-tiny-res-l1"
PROMPT = "Tell me about the sea."


class Replica:
    """One engine, with its own gRPC channel and stubs."""

    def __init__(self, tmp, url: str, name: str):
        self.tmp = tmp / name
        self.tmp.mkdir(exist_ok=True)
        self.url = url
        self.metrics_port = harness.free_port()
        self.start()

    def start(self) -> None:
        self.process, self.port = harness.start_engine(
            self.tmp, MILLM_DATABASE_URL=self.url, MILLM_METRICS_PORT=str(self.metrics_port))
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.steering = steering_grpc.SteeringServiceStub(self.channel)
        self.generation = generation_service_pb2_grpc.GenerationServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def stop(self) -> None:
        self.channel.close()
        self.process.stop()

    def profile(self, name: str):
        try:
            return self.steering.GetProfile(
                steering_service_pb2.GetProfileRequest(name=name), timeout=5).profile
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    def chat(self, **fields) -> str:
        request = chat_request(PROMPT, temperature=0, max_tokens=24)
        for key, value in fields.items():
            if key == "dial":
                request.steering_intensity.level = value
            else:
                setattr(request, key, value)
        return "".join(c.text for r in self.generation.Generate(request, timeout=60)
                       for c in r.choices)

    def state_store(self) -> int:
        reply = self.health.Check(health_pb2.HealthCheckRequest(service="millm.state_store"),
                                  timeout=2)
        return reply.status

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics") as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + "{") or line.startswith(name + " "):
                    return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)


def _entries(*entries):
    return [steering_pb2.SteeringEntry(layer=layer, feature=feature, strength=strength)
            for layer, feature, strength in entries]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replicas")
    pg = PostgresCluster()
    replicas, bridge = [], None
    try:
        # Both start at once on the empty database: one migrates, one waits.
        replicas = [Replica(tmp, pg.url, name) for name in ("a", "b")]
        for r in replicas:
            harness.wait_serving(r.process, r.port)
        targets = ",".join(f"127.0.0.1:{r.port}" for r in replicas)
        bridge, http_port = harness.start_bridge(tmp, replicas[0].port,
                                                 MILLM_ENGINE_TARGETS=targets)
        harness.wait_http(bridge, f"http://127.0.0.1:{http_port}/readyz")
        yield pg, replicas, http_port
    finally:
        if bridge is not None:
            bridge.stop()
        for r in replicas:
            r.stop()
        pg.close()


def test_engines_starting_together_migrate_once(cluster):
    _, (a, b), _ = cluster
    logs = a.process.log() + b.process.log()
    every = list(range(1, migrations.LATEST + 1))
    assert logs.count(f"applied migrations {every}") == 1, logs
    assert logs.count("schema is current") == 1


def _feature_that_changes_the_text(replica: Replica, strength: float) -> int:
    """A layer-1 feature whose steering changes this replica's greedy text
    (steering_helpers.first_feature_that_changes), tried on that replica
    alone with profiles of its own writing."""
    sae = next(s for s in replica.steering.ListSaes(
        steering_service_pb2.ListSaesRequest(), timeout=10).saes if s.id == L1)

    def steered(feature: int) -> str:
        name = f"changes-the-text-{feature}"
        replica.steering.CreateProfile(steering_service_pb2.CreateProfileRequest(
            name=name, entries=_entries((1, feature, strength))), timeout=10)
        try:
            return replica.chat(profile=name)
        finally:
            replica.steering.DeleteProfile(
                steering_service_pb2.DeleteProfileRequest(name=name), timeout=10)

    return first_feature_that_changes(sae.d_sae, replica.chat(), steered)


def test_a_profile_written_through_the_bridge_steers_both_replicas_within_a_second(cluster):
    _, replicas, http = cluster
    a, b = replicas
    plain = a.chat()
    assert call(http, "POST", f"/api/saes/{L1}/attach").status_code == 200
    assert wait_until(lambda: all(list(r.steering.GetSteering(
        steering_service_pb2.GetSteeringRequest()).steering.attached_sae_ids) == [L1]
        for r in replicas), 1.0)
    feature = _feature_that_changes_the_text(a, 8.0)
    reply = call(http, "POST", "/api/profiles", {"name": "sea", "entries": [
        {"layer": 1, "feature": feature, "strength": 8.0}]})
    assert reply.status_code == 200, reply.text
    assert wait_until(lambda: all(r.profile("sea") is not None for r in replicas), 1.0)
    texts = [r.chat(profile="sea") for r in replicas]
    assert texts[0] == texts[1] != plain
    # The delay: from a write's answer to the other replica serving it.
    delays = []
    for i in range(10):
        writer, other = replicas[i % 2], replicas[1 - i % 2]
        writer.steering.UpdateProfile(steering_service_pb2.UpdateProfileRequest(
            name="sea", description=f"v{i}"))
        start = time.monotonic()
        assert wait_until(lambda o=other, i=i: o.profile("sea").description == f"v{i}",
                          1.0, 0.005)
        delays.append(time.monotonic() - start)
    print(f"\nreplication delay over 10 writes: median {statistics.median(delays) * 1000:.1f} ms,"
          f" max {max(delays) * 1000:.1f} ms")
    assert max(delays) < 1.0


def _set_values(replica: Replica, strength: float):
    """A live write (no profile is active, L1 is attached); its liveness."""
    return replica.steering.SetSteering(steering_service_pb2.SetSteeringRequest(
        replace_values=True, values=_entries((1, 3, strength))), timeout=10).liveness


def test_a_write_is_live_once_every_replica_has_applied_it(cluster):
    _, (a, b), http = cluster
    reply = call(http, "PUT", "/api/steering", {"values": [
        {"layer": 1, "feature": 3, "strength": 4.0}]})
    assert reply.status_code == 200, reply.text
    assert reply.json()["liveness"] == {"live": True, "reason": "", "replicas": 2,
                                        "replicas_applied": 2}
    # The whole answer: write lock, commit, and the wait for the other replica.
    times = []
    for i in range(10):
        start = time.monotonic()
        live = _set_values((a, b)[i % 2], 4.0 + i)
        times.append(time.monotonic() - start)
        assert (live.live, live.reason, live.replicas, live.replicas_applied) == (
            True, "", 2, 2)
    print(f"\nwrite answered, applied on both, over 10 writes: median "
          f"{statistics.median(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms")
    # A read looks once: the value a's answer said was live is live on both.
    for r in (a, b):
        live = r.steering.GetSteering(steering_service_pb2.GetSteeringRequest()).liveness
        assert (live.live, live.replicas, live.replicas_applied) == (True, 2, 2)
    a.steering.SetSteering(steering_service_pb2.SetSteeringRequest(replace_values=True))


def test_a_probe_and_the_monitoring_switch_reach_the_other_replica(cluster):
    _, (a, b), _ = cluster
    a_stub = monitoring_grpc.MonitoringServiceStub(a.channel)
    b_stub = monitoring_grpc.MonitoringServiceStub(b.channel)
    a_stub.CreateProbe(monitoring_service_pb2.CreateProbeRequest(
        name="shared", sae_id=L1, feature=3, threshold=0.5))
    a_stub.SetMonitoring(monitoring_service_pb2.SetMonitoringRequest(enabled=True))

    def seen_on_b() -> bool:
        state = b_stub.GetMonitoring(monitoring_service_pb2.GetMonitoringRequest()).monitoring
        return state.enabled and [p.name for p in state.probes] == ["shared"]

    assert wait_until(seen_on_b, 1.0)
    b_stub.DeleteProbe(monitoring_service_pb2.DeleteProbeRequest(name="shared"))
    b_stub.SetMonitoring(monitoring_service_pb2.SetMonitoringRequest(enabled=False))
    assert wait_until(lambda: not a_stub.ListProbes(
        monitoring_service_pb2.ListProbesRequest()).probes, 1.0)


def test_an_explanation_set_on_one_replica_is_read_on_the_other(cluster):
    _, (a, b), _ = cluster
    a.steering.SetFeatureExplanation(steering_service_pb2.SetFeatureExplanationRequest(
        sae_id=L1, index=7, text="shared words"), timeout=10)
    card = b.steering.GetSaeFeature(steering_service_pb2.GetSaeFeatureRequest(
        sae_id=L1, index=7), timeout=10)
    assert card.explanation.text == "shared words" and card.explanation.source == "user"
    b.steering.SetFeatureExplanation(steering_service_pb2.SetFeatureExplanationRequest(
        sae_id=L1, index=7, text=""), timeout=10)
    assert not a.steering.GetSaeFeature(steering_service_pb2.GetSaeFeatureRequest(
        sae_id=L1, index=7), timeout=10).HasField("explanation")


def test_the_operator_wins_across_replicas(cluster):
    _, (a, b), _ = cluster
    if a.profile("dialed") is None:
        a.steering.CreateProfile(steering_service_pb2.CreateProfileRequest(
            name="dialed", entries=_entries((1, 5, 6.0))))
    wait_until(lambda: b.profile("dialed") is not None, 1.0)
    operator = _entries((1, 12, 3.5))
    request = chat_request(PROMPT, temperature=0, max_tokens=200, ignore_eos=True)
    request.profile = "dialed"
    request.steering_intensity.level = 1.5
    text, written = [], False
    for response in a.generation.Generate(request, timeout=60):
        text.extend(c.text for c in response.choices)
        if not written and "".join(text):
            # Mid-stream on replica a, the operator writes on replica b.
            b.steering.SetSteering(steering_service_pb2.SetSteeringRequest(
                replace_values=True, values=operator))
            written = True
    assert written
    for r in (a, b):
        state = r.steering.GetSteering(steering_service_pb2.GetSteeringRequest()).steering
        assert [(v.layer, v.feature, v.strength) for v in state.values] == [(1, 12, 3.5)]
    # The request kept its own steering from start to end.
    assert "".join(text) == "".join(
        c.text for r in a.generation.Generate(request, timeout=60) for c in r.choices)


def test_an_engine_killed_mid_write_loses_nothing_committed_and_catches_up(cluster):
    _, (a, b), _ = cluster
    acknowledged, stop = [], threading.Event()

    def write():
        i = 0
        while not stop.is_set():
            try:
                a.steering.CreateProfile(steering_service_pb2.CreateProfileRequest(
                    name=f"kill-{i}", entries=_entries((1, 1, 1.0))), timeout=5)
                acknowledged.append(f"kill-{i}")
            except grpc.RpcError:
                return
            i += 1

    writer = threading.Thread(target=write)
    writer.start()
    assert wait_until(lambda: len(acknowledged) >= 5, 10, 0.01)
    os.kill(a.process.proc.pid, signal.SIGKILL)
    writer.join(10)
    stop.set()
    a.process.proc.wait(10)
    names = {p.name for p in b.steering.ListProfiles(
        steering_service_pb2.ListProfilesRequest()).profiles}
    assert set(acknowledged) <= names, set(acknowledged) - names
    # Written while a is away; a comes back and has it before SERVING.
    b.steering.CreateProfile(steering_service_pb2.CreateProfileRequest(
        name="while-away", entries=_entries((1, 2, 1.0))))
    a.stop()
    a.start()
    harness.wait_serving(a.process, a.port)
    assert a.profile("while-away") is not None
    assert {p.name for p in a.steering.ListProfiles(
        steering_service_pb2.ListProfilesRequest()).profiles} >= names


def test_database_down_generation_goes_on_writes_answer_503_and_all_recovers(cluster):
    pg, replicas, http = cluster
    a, b = replicas
    steered = a.chat(profile="sea")
    failures, served, stop = [], [], threading.Event()

    def load():
        while not stop.is_set():
            for r in replicas:
                try:
                    served.append(r.chat(profile="sea") == steered)
                except grpc.RpcError as exc:
                    failures.append(exc)

    loader = threading.Thread(target=load)
    loader.start()
    try:
        pg.stop()
        reply = call(http, "POST", "/api/profiles", {"name": "offline", "entries": []})
        assert reply.status_code == 503, reply.text
        assert reply.json()["error"]["code"] == "state_store_unavailable"
        with pytest.raises(grpc.RpcError) as caught:
            b.steering.SetSteering(steering_service_pb2.SetSteeringRequest(enabled=False))
        assert error_info(caught.value).reason == "state_store_unavailable"
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        assert wait_until(lambda: all(r.state_store() == not_serving for r in replicas), 5, 0.05)
        assert all(r.metric("millm_engine_state_store_up") == 0 for r in replicas)
        ready = call(http, "GET", "/readyz")
        assert ready.status_code == 200 and ready.json()["state_store"] == "unavailable"
        # Reads of the last applied state still answer.
        assert b.profile("sea") is not None
        pg.start()
        serving = health_pb2.HealthCheckResponse.SERVING
        assert wait_until(lambda: all(r.state_store() == serving for r in replicas), 10, 0.05)
        reply = call(http, "POST", "/api/profiles", {"name": "online", "entries": []})
        assert reply.status_code == 200, reply.text
        assert wait_until(lambda: all(r.profile("online") is not None for r in replicas), 1.0)
        assert call(http, "GET", "/readyz").json()["state_store"] == "available"
        assert all(r.metric("millm_engine_state_store_up") == 1 for r in replicas)
    finally:
        stop.set()
        loader.join(60)
    assert not failures, failures[:3]
    assert served and all(served)


def test_a_killed_replica_stops_counting_and_a_stopped_one_at_once(cluster):
    pg, (a, b), _ = cluster
    # Both follow again after the outage above.
    assert wait_until(lambda: _set_values(a, 1.0).replicas_applied == 2, 5, 0.1)
    os.kill(b.process.proc.pid, signal.SIGKILL)
    b.process.proc.wait(10)
    killed = time.monotonic()
    # Its last heartbeat is recent: it still counts, and has not applied this.
    live = _set_values(a, 2.0)
    assert (live.live, live.replicas, live.replicas_applied) == (False, 2, 1)
    assert live.reason.startswith("applied on 1 of 2 replicas within 1 s")
    answers = []
    assert wait_until(lambda: answers.append(_set_values(a, 3.0)) or answers[-1].replicas == 1,
                  acks.ANSWERING_S + 2, 0.1)
    assert answers[-1].live and answers[-1].replicas_applied == 1
    print(f"\na killed replica stopped counting {time.monotonic() - killed:.1f} s after")
    # Back, it counts again; a clean stop deletes its row, so the next write
    # neither waits for it nor counts it.
    b.stop()
    b.start()
    harness.wait_serving(b.process, b.port)
    assert wait_until(lambda: _set_values(a, 4.0).replicas_applied == 2, 5, 0.1)
    b.stop()
    live = _set_values(a, 5.0)
    assert (live.live, live.replicas, live.replicas_applied) == (True, 1, 1)
    a_id = re.search(r"replica id ([0-9a-f]{32})", a.process.log()).group(1)
    database = PostgresDatabase(pg.url)
    try:
        fresh = database.read(lambda tx: tx.rows(
            f"SELECT replica_id FROM replicas WHERE seen_at >= {database.now_sql} - ?",
            (acks.ANSWERING_S,)))
    finally:
        database.close()
    assert fresh == [(a_id,)]
