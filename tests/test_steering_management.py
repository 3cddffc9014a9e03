"""SAE steering's management end to end: clusters and circuits (imported,
dialed, activated, and the headers that report them), the checks on
management writes and the management API under fuzzing, the same steering
over gRPC as over REST, state surviving an engine restart, and what
/api/capabilities reports.

Per-request steering is test_steering.py's; activation readout is
test_steering_readout.py's. These tests change steering state, so they run
against the steering tests' own engine and bridge (conftest.py's `steer`,
built by steering_helpers.py), never the session stack.
"""

from __future__ import annotations

import json
import pathlib

import grpc
import pytest

from millm.v1 import generation_service_pb2_grpc, steering_pb2, steering_service_pb2
from millm.v1 import steering_service_pb2_grpc as steering_grpc
from tests import harness
from tests.grpc_helpers import chat_request, error_info
from tests.steering_helpers import L0, L1, MESSAGES, chat, circuit_document, error, profile


def _start(tmp: pathlib.Path, saes_dir: pathlib.Path) -> tuple[harness.Process, int]:
    engine, port = harness.start_engine(tmp, MILLM_SAES_DIR=str(saes_dir))
    harness.wait_serving(engine, port)
    return engine, port


# -- clusters, circuits and headers ----------------------------------------------------------------


def test_cluster_dial_scales_stored_strengths(clean):
    cluster = {"format": "millm.cluster.v1", "name": "calm", "intensity_range": [0.5, 1.5],
               "intensity": 1.0, "members": [{"layer": 1, "feature": 3, "strength": 8.0}]}
    imported = clean.ok("POST", "/api/clusters", cluster)
    assert imported["cluster"]["intensity"] == 1.0
    assert imported["liveness"]["live"] is False
    assert clean.ok("GET", "/api/profiles/calm")["profile"]["kind"] == "cluster"
    profile(clean, "half", (1, 3, 4.0))
    half, _ = chat(clean, profile="half")

    text, headers = chat(clean, profile="calm", steering_intensity=0.5)
    assert text == half and headers["x-millm-steering-intensity"] == "0.5"
    # Dialing below the declared floor is honoured; above the ceiling is capped.
    assert chat(clean, profile="calm", steering_intensity=0.25)[1][
        "x-millm-steering-intensity"] == "0.25"
    assert chat(clean, profile="calm", steering_intensity=2)[1][
        "x-millm-steering-intensity"] == "1.5"
    assert chat(clean, profile="calm", steering_intensity="min")[1][
        "x-millm-steering-intensity"] == "0.5"

    # The persistent dial applies without a request dial.
    reply = clean.api("PUT", "/api/clusters/calm/intensity", {"intensity": 1.6})
    assert reply.status_code == 400 and error(reply)["param"] == "intensity"
    set_dial = clean.ok("PUT", "/api/clusters/calm/intensity", {"intensity": 0.5})
    assert set_dial["cluster"]["intensity"] == 0.5
    assert chat(clean, profile="calm")[0] == half
    clean.ok("POST", "/api/profiles/calm/activate")
    assert clean.ok("PUT", "/api/clusters/calm/intensity", {"intensity": 0.5})["liveness"][
        "live"] is True
    assert chat(clean)[0] == half


def test_circuit_rung_header_only_while_a_circuit_genuinely_steers(clean):
    clean.ok("POST", f"/api/saes/{L0}/attach")
    clean.ok("POST", "/api/circuits", circuit_document("edge", 2, intensity_range=[0.5, 1.5]))
    none = clean.ok("GET", "/api/circuits/active")
    assert none["circuit"] is None and none["steering"]["steering"] is False

    plain, headers = chat(clean)
    assert "x-millm-circuit-rung" not in headers
    clean.ok("POST", "/api/circuits/edge/activate")
    active = clean.ok("GET", "/api/circuits/active")
    assert active["circuit"]["name"] == "edge"
    assert active["steering"] == {"steering": True, "rung": 2,
                                  "language": "causally validated (edge)", "intensity": 1.0,
                                  "reason": ""}
    text, headers = chat(clean)
    assert text != plain
    assert headers["x-millm-circuit-rung"] == '2; language="causally validated (edge)"'
    # Clamped at both ends: 0.1 against [0.5, 1.5] is 0.5.
    assert chat(clean, steering_intensity=0.1)[1]["x-millm-steering-intensity"] == "0.5"
    assert chat(clean, steering_intensity="off")[0] == plain

    # The same circuit at 0.5 equals its members at half strength on both layers.
    profile(clean, "halves", (0, 5, 3.0), (1, 3, 4.0))
    assert chat(clean, steering_intensity=0.5)[0] == chat(clean, profile="halves")[0]

    # No SAE on any member layer: no header, and the state says why.
    clean.ok("POST", f"/api/saes/{L0}/detach")
    clean.ok("POST", f"/api/saes/{L1}/detach")
    assert "x-millm-circuit-rung" not in chat(clean)[1]
    state = clean.ok("GET", "/api/circuits/active")["steering"]
    assert state["steering"] is False and "no SAE" in state["reason"]


def test_rung_language_never_says_causal_below_rung_two(clean):
    clean.ok("POST", "/api/circuits", circuit_document("hint", 1))
    clean.ok("POST", "/api/circuits/hint/activate")
    header = chat(clean)[1]["x-millm-circuit-rung"]
    assert header == '1; language="suggested (attribution-supported)"'
    assert "causal" not in header
    # "min" on a circuit without a declared range is off, and says so.
    plain = chat(clean, steering_intensity="off")[0]
    text, headers = chat(clean, steering_intensity="min")
    assert text == plain and "x-millm-circuit-rung" not in headers
    assert headers["x-millm-steering-intensity"] == "0.0"
    # Only circuits are activated as circuits, and deactivating one leaves a profile alone.
    profile(clean, "plain", (1, 3, 2.0))
    reply = clean.api("POST", "/api/circuits/plain/activate")
    assert reply.status_code == 404 and error(reply)["code"] == "circuit_not_found"
    clean.ok("POST", "/api/profiles/plain/activate")
    assert clean.ok("DELETE", "/api/circuits/active")["steering"]["active_profile"] == "plain"


def test_slice_fallback_circuit_is_served_by_its_cluster_without_a_rung(clean):
    clean.ok("POST", "/api/clusters", {"name": "backing", "members": [
        {"layer": 1, "feature": 3, "strength": 8.0}]})
    reply = clean.api("POST", "/api/circuits", circuit_document("fb", 3, mode="slice_fallback",
                                                        fallback_cluster="nothing"))
    assert reply.status_code == 400 and error(reply)["param"] == "fallback_cluster"
    clean.ok("POST", "/api/circuits", circuit_document("fb", 3, mode="slice_fallback",
                                               fallback_cluster="backing"))
    clean.ok("POST", "/api/circuits/fb/activate")
    text, headers = chat(clean)
    assert "x-millm-circuit-rung" not in headers
    assert text == chat(clean, profile="backing")[0]
    state = clean.ok("GET", "/api/circuits/active")["steering"]
    assert state["steering"] is False and "slice_fallback" in state["reason"]
    # Its own dial does not steer it; its cluster's does.
    dial = clean.ok("PUT", "/api/circuits/fb/intensity", {"intensity": 0.0})
    assert dial["liveness"]["live"] is False and "backing" in dial["liveness"]["reason"]
    assert chat(clean)[0] == text
    # The cluster rule's 0.5 floor for "min" applies.
    assert chat(clean, steering_intensity="min")[1]["x-millm-steering-intensity"] == "0.5"


# -- checks on writes ------------------------------------------------------------------------------


def test_management_writes_are_checked(clean):
    reply = clean.api("POST", "/api/profiles", {"name": "x", "entries": [
        {"layer": 1, "feature": 999, "strength": 1.0}]})
    assert reply.status_code == 400 and error(reply)["code"] == "invalid_feature_index"
    reply = clean.api("POST", "/api/profiles", {"name": "x", "entries": [
        {"layer": 1, "feature": 1, "strength": 250.0}]})
    assert reply.status_code == 400 and error(reply)["param"] == "entries[0].strength"
    reply = clean.api("POST", "/api/profiles", {"name": "bad name!", "entries": []})
    assert reply.status_code == 400 and error(reply)["param"] == "name"
    profile(clean, "twice")
    reply = clean.api("POST", "/api/profiles", {"name": "twice", "entries": []})
    assert reply.status_code == 409 and error(reply)["code"] == "already_exists"
    reply = clean.api("PUT", "/api/steering", {"values": [{"layer": 1, "feature": 2}]})
    assert reply.status_code == 400 and error(reply)["param"] == "values[0].strength"
    reply = clean.api("GET", "/api/profiles/nothing")
    assert reply.status_code == 404 and error(reply)["code"] == "profile_not_found"
    reply = clean.api("POST", "/api/clusters", raw=b"[1, 2]")
    assert reply.status_code == 400
    reply = clean.api("POST", "/api/clusters", {"name": "c", "members": [], "colour": "red"})
    assert reply.status_code == 400 and error(reply)["param"] == "colour"
    updated = clean.ok("PATCH", "/api/profiles/twice", {"entries": [
        {"layer": 1, "feature": 4, "strength": 2.0}], "description": "now with a feature"})
    assert updated["profile"]["entries"] == [{"layer": 1, "feature": 4, "strength": 2.0,
                                              "sae_id": ""}]
    assert updated["liveness"] == {"live": False, "reason": "profile 'twice' is not active",
                                   "replicas": 1, "replicas_applied": 1}

# -- gRPC ------------------------------------------------------------------------------------------


def test_grpc_carries_the_same_steering_as_rest(clean):
    clean.ok("POST", f"/api/saes/{L0}/attach")
    clean.ok("POST", "/api/circuits", circuit_document("edge", 2))
    clean.ok("POST", "/api/circuits/edge/activate")
    with grpc.insecure_channel(f"127.0.0.1:{clean.grpc_port}") as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        request = chat_request(MESSAGES[0]["content"], temperature=0, max_tokens=24)
        request.steering_intensity.symbol = "max"
        request.return_sae_activations.sae_id = L0
        request.return_sae_activations.selector = steering_pb2.POSITION_SELECTOR_LAST
        responses = list(stub.Generate(request))
        meta = responses[0].metadata
        assert meta.steering_intensity == 2.0
        assert (meta.circuit_rung.rung, meta.circuit_rung.language) == (
            2, "causally validated (edge)")
        assert responses[-1].HasField("sae_activations")
        assert responses[-1].sae_activations.layer == 0
        text = "".join(c.text for r in responses for c in r.choices)
        assert text == chat(clean, steering_intensity="max")[0]

        request = chat_request("hi", max_tokens=2)
        request.steering_intensity.symbol = "loud"
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.Generate(request))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(caught.value).reason == "invalid_parameter"

        steering = steering_grpc.SteeringServiceStub(channel)
        state = steering.GetSteering(steering_service_pb2.GetSteeringRequest())
        assert state.steering.active_profile == "edge"
        with pytest.raises(grpc.RpcError) as caught:
            steering.GetProfile(steering_service_pb2.GetProfileRequest(name="nope"))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert error_info(caught.value).reason == "profile_not_found"


# -- persistence -----------------------------------------------------------------------------------


def test_state_survives_an_engine_restart(tmp_path, steer):
    saes_dir = steer.saes_dir
    engine, port = _start(tmp_path, saes_dir)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = steering_grpc.SteeringServiceStub(channel)
            stub.AttachSae(steering_service_pb2.AttachSaeRequest(sae_id=L0))
            stub.CreateProfile(steering_service_pb2.CreateProfileRequest(
                name="kept", entries=[steering_pb2.SteeringEntry(layer=0, feature=1,
                                                                 strength=2.5)]))
            stub.ImportCluster(steering_service_pb2.ImportClusterRequest(document_json=json.dumps(
                {"name": "dialed", "members": [{"layer": 0, "feature": 2, "strength": 1.0}]})))
            stub.SetClusterIntensity(steering_service_pb2.SetClusterIntensityRequest(
                name="dialed", intensity=1.75))
            stub.ImportCircuit(steering_service_pb2.ImportCircuitRequest(
                document_json=json.dumps(circuit_document("c", 3))))
            stub.ActivateProfile(steering_service_pb2.ActivateProfileRequest(name="kept"))
            stub.SetSteering(steering_service_pb2.SetSteeringRequest(
                replace_values=True, enabled=False,
                values=[steering_pb2.SteeringEntry(layer=0, feature=9, strength=-1.0)]))
            before = stub.GetSteering(steering_service_pb2.GetSteeringRequest())
    finally:
        engine.stop()
    engine, port = _start(tmp_path, saes_dir)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = steering_grpc.SteeringServiceStub(channel)
            after = stub.GetSteering(steering_service_pb2.GetSteeringRequest())
            assert after == before
            assert list(after.steering.attached_sae_ids) == [L0]
            assert after.steering.enabled is False
            kept = stub.GetProfile(steering_service_pb2.GetProfileRequest(name="kept")).profile
            assert (kept.active, kept.entries[0].strength) == (True, 2.5)
            dialed = stub.GetCluster(steering_service_pb2.GetClusterRequest(name="dialed"))
            assert dialed.cluster.intensity == 1.75
            circuit = stub.GetCircuit(steering_service_pb2.GetCircuitRequest(name="c")).circuit
            assert circuit.rung == 3 and len(circuit.members) == 2
    finally:
        engine.stop()


def test_capabilities_report_steering_and_the_attached_saes(clean):
    body = clean.ok("GET", "/api/capabilities")
    assert body["features"]["steering"] is True
    assert body["features"]["attached_saes"] == [L1]
    table = {(f["field"], f["route"]): f for f in body["fields"]}
    assert table[("profile", "chat")]["honoured"] is True
    assert table[("profile", "completions")]["honoured"] is False
    assert table[("return_sae_activations", "completions")]["honoured"] is True


def test_management_api_never_answers_5xx_and_bad_writes_change_nothing(clean):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 300),
                        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6))
    values = st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
        max_leaves=10)
    member = st.fixed_dictionaries({}, optional={
        "layer": values | st.integers(0, 2), "feature": values | st.integers(0, 300),
        "strength": values | st.floats(-300, 300), "sae_id": values})
    document = st.fixed_dictionaries({}, optional={
        "name": values | st.sampled_from(["ok", "bad name", ""]),
        "members": values | st.lists(member, max_size=3), "rung": values | st.integers(-1, 4),
        "intensity_range": values | st.lists(st.floats(-1, 3), max_size=3),
        "intensity": values | st.floats(-1, 3), "mode": values | st.sampled_from(
            ["full", "slice_fallback"]), "fallback_cluster": values, "values": values,
        "entries": values | st.lists(member, max_size=3), "enabled": values})
    routes = st.sampled_from([("POST", "/api/clusters"), ("POST", "/api/circuits"),
                              ("POST", "/api/profiles"), ("PUT", "/api/steering"),
                              ("PUT", "/api/clusters/ok/intensity"),
                              ("PATCH", "/api/profiles/ok")])

    @settings(max_examples=150, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(routes, document)
    def fuzz(route, body):
        before = [clean.ok("GET", p) for p in ("/api/steering", "/api/profiles",
                                               "/api/clusters", "/api/circuits")]
        reply = clean.api(*route, body)
        assert reply.status_code < 500, reply.text
        if reply.status_code >= 400:
            assert set(error(reply)) == {"message", "type", "param", "code"}
            after = [clean.ok("GET", p) for p in ("/api/steering", "/api/profiles",
                                                  "/api/clusters", "/api/circuits")]
            assert after == before
        else:  # an accepted write is undone so the next example starts clean
            for name in ("ok",):
                for kind in ("circuits", "clusters", "profiles"):
                    clean.api("DELETE", f"/api/{kind}/{name}")
            clean.ok("DELETE", "/api/steering")
            clean.ok("PUT", "/api/steering", {"enabled": True})

    fuzz()
