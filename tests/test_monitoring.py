"""Monitoring live traffic with probes, end to end: the per-model switch, probe
validation, verdicts in responses (JSON, SSE, gRPC) checked against the
request's own pre_steering activations, the aggregates and the Prometheus
counters, and that scoring is never read.

Monitoring state is the engine's, so these run on an engine and bridge of
their own (with the engine's metrics endpoint on)."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import grpc
import pytest

from millm.v1 import generation_service_pb2_grpc, monitoring_service_pb2
from millm.v1 import monitoring_service_pb2_grpc as monitoring_grpc
from tests import harness
from tests.conftest import MODEL
from tests.grpc_helpers import chat_request, error_info
from tests.http_helpers import call

L1 = "sae_millm-tiny-res-l1"  # standard, layer 1, 256 features
L0 = "sae_millm-tiny-res-l0"  # jumprelu, layer 0, 128 features
MESSAGES = [{"role": "user", "content": "Tell me a story."}]


class MonitorStack(harness.OwnStack):
    def __init__(self, tmp):
        self.metrics_port = harness.free_port()
        super().__init__(tmp, MILLM_METRICS_PORT=str(self.metrics_port))

    def api(self, method: str, path: str, body=None):
        return call(self.http_port, method, path, body)

    def ok(self, method: str, path: str, body=None) -> dict:
        reply = self.api(method, path, body)
        assert reply.status_code == 200, reply.text
        return reply.json()

    def counter(self, name: str, probe: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics") as reply:
            text = reply.read().decode()
        for line in text.splitlines():
            if line.startswith(f'{name}{{probe="{probe}"}}'):
                return float(line.split()[-1])
        return 0.0


@pytest.fixture(scope="module")
def mon(tmp_path_factory):
    stack = MonitorStack(tmp_path_factory.mktemp("monitoring"))
    try:
        stack.ok("POST", f"/api/saes/{L1}/attach")
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def clean(mon):
    def reset():
        mon.ok("PUT", "/api/monitoring", {"enabled": False, "keep_contexts": False})
        for probe in mon.ok("GET", "/api/probes")["probes"]:
            mon.ok("DELETE", f"/api/probes/{probe['name']}")
    reset()
    yield mon
    reset()


def chat(stack, **extra) -> dict:
    reply = stack.api("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": MESSAGES, "max_tokens": 12, "temperature": 0, **extra})
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.parametrize(("probe", "param", "code"), [
    ({"sae_id": L1, "feature": 256}, "feature", "invalid_feature_index"),
    ({"sae_id": L1, "features": [{"index": 3, "weight": 1}, {"index": 900, "weight": 1}]},
     "features[1]", "invalid_feature_index"),
    ({"sae_id": "sae_nothing", "feature": 3}, "sae_id", "invalid_parameter"),
    ({"sae_id": L1, "layer": 0, "feature": 3}, "layer", "invalid_parameter"),
    ({"sae_id": L1, "feature": 3, "threshold": 0}, "threshold", "invalid_parameter"),
    ({"sae_id": L1, "feature": 3, "threshold": -2}, "threshold", "invalid_parameter"),
    ({"sae_id": L1, "feature": 3, "threshold": 1e9}, "threshold", "invalid_parameter"),
    ({"sae_id": L1, "feature": 3, "threshold": "Infinity"}, "threshold", "invalid_parameter"),
    ({"sae_id": L1, "feature": 3, "threshold": None}, "threshold", "invalid_parameter"),
    ({"sae_id": L1}, "features", "invalid_parameter"),
    ({"sae_id": L1, "feature": 3, "features": [{"index": 4, "weight": 1}]}, "feature",
     "invalid_parameter"),
    ({"sae_id": L1, "features": [{"index": 4, "weight": 0}]}, "features[0].weight",
     "invalid_parameter"),
    ({"sae_id": L1, "features": [{"index": 4, "weight": 1}, {"index": 4, "weight": 2}]},
     "features[1]", "invalid_parameter"),
    ({"name": "no spaces", "sae_id": L1, "feature": 3}, "name", "invalid_document"),
])
def test_bad_probes_are_400_naming_the_field(clean, probe, param, code):
    body = {"name": "p", "threshold": 1.0, **probe}
    body = {k: v for k, v in body.items() if v is not None}
    reply = clean.api("POST", "/api/probes", body)
    assert reply.status_code == 400, reply.text
    assert (reply.json()["error"]["param"], reply.json()["error"]["code"]) == (param, code)
    assert clean.ok("GET", "/api/probes")["probes"] == []


def test_probe_names_are_unique_and_deleting_an_unknown_one_is_404(clean):
    created = clean.ok("POST", "/api/probes", {"name": "p", "sae_id": L0, "feature": 5,
                                                "threshold": 0.5})["probe"]
    assert (created["layer"], created["features"]) == (0, [{"index": 5, "weight": 1.0}])
    assert (created["reading"], created["reason"]) == (False, f"{L0} is not attached")
    again = clean.api("POST", "/api/probes", {"name": "p", "sae_id": L1, "feature": 5,
                                              "threshold": 0.5})
    assert again.status_code == 409 and again.json()["error"]["code"] == "already_exists"
    gone = clean.api("DELETE", "/api/probes/nothing")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "probe_not_found"


def test_the_number_of_probes_is_bounded(clean):
    for i in range(63):  # 64 in all with "last"
        clean.ok("POST", "/api/probes", {"name": f"q{i}", "sae_id": L0, "feature": 5,
                                         "threshold": 0.5})
    clean.ok("POST", "/api/probes", {"name": "last", "sae_id": L0, "feature": 5,
                                     "threshold": 0.5})
    over = clean.api("POST", "/api/probes", {"name": "over", "sae_id": L0, "feature": 5,
                                             "threshold": 0.5})
    assert over.status_code == 400 and over.json()["error"]["param"] == "name"
    assert len(clean.ok("GET", "/api/probes")["probes"]) == 64


def test_off_by_default_and_a_no_op_without_probes(clean):
    state = clean.ok("GET", "/api/monitoring")["monitoring"]
    assert (state["model"], state["enabled"], state["active"]) == (MODEL, False, False)
    assert "millm" not in chat(clean)
    state = clean.ok("PUT", "/api/monitoring", {"enabled": True})["monitoring"]
    assert state["enabled"] and not state["active"]
    assert "no probes" in state["reason"] and "no-op" in state["reason"]
    assert "millm" not in chat(clean)
    # A probe whose SAE is not attached reads nothing either.
    clean.ok("POST", "/api/probes", {"name": "idle", "sae_id": L0, "feature": 1,
                                     "threshold": 1})
    state = clean.ok("GET", f"/api/monitoring?model={MODEL}")["monitoring"]
    assert not state["active"] and "attached" in state["reason"]
    unknown = clean.api("GET", "/api/monitoring?model=no-such-model")
    assert unknown.status_code == 404


def _readout_probe(stack, feature: int) -> tuple[float, dict]:
    """A threshold half way to the feature's peak on the test prompt."""
    body = chat(stack, return_sae_activations={
        "sae_id": L1, "features": [feature], "top_k": 1, "positions": "all",
        "read_point": "pre_steering"})
    values = [p["features"][0]["value"] for p in body["millm"]["sae_activations"]["positions"]]
    return max(values) / 2, body


def _strongest_on_the_prompt(stack) -> int:
    """The layer-1 feature that fires hardest on the test prompt, unsteered."""
    body = chat(stack, return_sae_activations={
        "sae_id": L1, "top_k": 1, "positions": "prompt", "read_point": "pre_steering"})
    top = [p["features"][0] for p in body["millm"]["sae_activations"]["positions"]]
    return max(top, key=lambda f: f["value"])["index"]


def test_verdicts_match_the_requests_own_pre_steering_activations(clean):
    # A feature the prompt activates, so that the probe has something to see.
    feature = _strongest_on_the_prompt(clean)
    threshold, _ = _readout_probe(clean, feature)
    assert threshold > 0
    clean.ok("POST", "/api/probes", {"name": "half", "sae_id": L1, "feature": feature,
                                     "threshold": threshold, "description": "test"})
    clean.ok("POST", "/api/probes", {"name": "never", "sae_id": L1, "threshold": 10000,
                                     "features": [{"index": 1, "weight": 1.0},
                                                  {"index": 2, "weight": -0.5}]})
    state = clean.ok("PUT", "/api/monitoring", {"model": MODEL, "enabled": True})["monitoring"]
    assert state["active"] and state["reason"] == ""
    clean.ok("POST", "/api/profiles", {"name": "push", "entries": [
        {"layer": 1, "feature": feature, "strength": 20.0}]})

    async def one(client_body: dict) -> dict:
        return await asyncio.to_thread(chat, clean, **client_body)

    spec = {"sae_id": L1, "features": [feature], "top_k": 1, "positions": "all",
            "read_point": "pre_steering"}
    bodies = [{"return_sae_activations": spec, "seed": s, "temperature": 1.0}
              for s in range(3)] + [{"return_sae_activations": spec, "profile": "push"}]

    async def together():
        return await asyncio.gather(*(one(b) for b in bodies))

    for body in asyncio.run(together()):
        millm = body["millm"]
        read = millm["sae_activations"]["positions"]
        values = [p["features"][0]["value"] for p in read]
        verdicts = {v["probe"]: v for v in millm["probe_verdicts"]}
        half = verdicts["half"]
        assert (half["sae_id"], half["layer"], half["threshold"]) == (L1, 1, threshold)
        assert half["positions_read"] == len(read)
        assert half["peak"] == pytest.approx(max(values), abs=1e-4)
        reached = [p["position"] for p, v in zip(read, values, strict=True) if v >= threshold]
        assert half["fired"] == bool(reached)
        assert half["first_position"] == (reached[0] if reached else None)
        assert verdicts["never"]["fired"] is False
        assert verdicts["never"]["first_position"] is None
    clean.ok("DELETE", "/api/profiles/push")


def test_stream_scoring_counters_and_aggregates(clean, mon):
    clean.ok("POST", "/api/probes", {"name": "any", "sae_id": L1, "threshold": 0.01,
                                     "features": [{"index": i, "weight": 1.0}
                                                  for i in range(64)]})
    clean.ok("PUT", "/api/monitoring", {"enabled": True})
    state_before = clean.ok("GET", "/api/monitoring")["monitoring"]
    stats_before = {s["probe"]: s for s in state_before["probe_stats"]}["any"]
    before = mon.counter("millm_engine_probe_reads_total", "any")
    fired_before = mon.counter("millm_engine_probe_fired_total", "any")

    reply = clean.api("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": MESSAGES, "max_tokens": 6, "stream": True,
        "stream_options": {"include_usage": True}})
    events = [line[len("data: "):] for line in reply.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    verdict_chunk = json.loads(events[-2])
    assert verdict_chunk["choices"] == [] and set(verdict_chunk["millm"]) == {"probe_verdicts"}
    assert verdict_chunk["millm"]["probe_verdicts"][0]["fired"] is True
    assert "usage" in json.loads(events[-3]) and json.loads(events[-3])["usage"]
    assert all("millm" not in json.loads(e) for e in events[:-2])

    # Scoring is never monitored, nor are embeddings.
    scored = clean.api("POST", "/v1/completions", {"model": MODEL, "prompt": "The sea is",
                                                   "max_tokens": 1, "logprobs": 2})
    assert scored.status_code == 200 and "millm" not in scored.json()
    assert clean.api("POST", "/v1/embeddings", {"model": MODEL, "input": "hi"}).status_code \
        == 200
    assert mon.counter("millm_engine_probe_reads_total", "any") == before + 1
    assert mon.counter("millm_engine_probe_fired_total", "any") == fired_before + 1
    # The Responses API is monitored too; its objects have no place for verdicts.
    response = clean.api("POST", "/v1/responses", {"model": MODEL, "input": "Hello!",
                                                   "max_output_tokens": 4, "store": False})
    assert response.status_code == 200 and "millm" not in response.json()
    assert mon.counter("millm_engine_probe_reads_total", "any") == before + 2

    state = clean.ok("GET", "/api/monitoring")["monitoring"]
    stats = {s["probe"]: s for s in state["probe_stats"]}["any"]
    # Two monitored generations: the streamed chat and the response.
    assert stats["requests"] - stats_before["requests"] == 2 and stats["hit_rate"] == 1.0
    assert stats["total_requests"] - stats_before["total_requests"] == 2
    assert state["window_requests"] - state_before["window_requests"] == 2
    assert state["total_requests"] - state_before["total_requests"] == 2
    frequencies = state["feature_frequencies"]
    assert frequencies and all(f["sae_id"] == L1 and 0 < f["frequency"] <= 1
                               for f in frequencies)


def test_over_grpc(clean, mon):
    with grpc.insecure_channel(mon.grpc_target) as channel:
        stub = monitoring_grpc.MonitoringServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.CreateProbe(monitoring_service_pb2.CreateProbeRequest(
                name="wide", sae_id=L1, feature=999, threshold=1.0))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(caught.value).metadata["param"] == "feature"
        stub.CreateProbe(monitoring_service_pb2.CreateProbeRequest(
            name="g", sae_id=L1, feature=3, threshold=0.001))
        state = stub.SetMonitoring(monitoring_service_pb2.SetMonitoringRequest(
            enabled=True)).monitoring
        assert state.active and [p.name for p in state.probes] == ["g"]
        generation = generation_service_pb2_grpc.GenerationServiceStub(channel)
        read_before = stub.GetMonitoring(monitoring_service_pb2.GetMonitoringRequest(
            model=MODEL)).monitoring.total_requests
        responses = list(generation.Generate(chat_request("Hello!", max_tokens=4)))
        kinds = [[f.name for f, _ in r.ListFields()] for r in responses]
        verdicts = [r.probe_verdicts for r in responses if r.HasField("probe_verdicts")]
        assert len(verdicts) == 1 and verdicts[0].verdicts[0].probe == "g"
        assert kinds[-1] == ["probe_verdicts"] and "usage" in kinds[-2]
        v = verdicts[0].verdicts[0]
        # Every token through the model: the prompt and each output but the last.
        usage = responses[-2].usage
        assert v.positions_read == usage.prompt_tokens + usage.completion_tokens - 1
        assert v.fired == v.HasField("first_position")
        got = stub.GetMonitoring(monitoring_service_pb2.GetMonitoringRequest(model=MODEL))
        assert got.monitoring.total_requests == read_before + 1


def test_probes_and_the_switch_survive_a_restart(tmp_path):
    def engine_state(write: bool) -> monitoring_service_pb2.MonitoringState:
        """The second engine only reads: what it lists came from the data dir."""
        process, port = harness.start_engine(tmp_path)
        try:
            harness.wait_serving(process, port)
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = monitoring_grpc.MonitoringServiceStub(channel)
                if write:
                    stub.CreateProbe(monitoring_service_pb2.CreateProbeRequest(
                        name="kept", sae_id=L0, feature=9, threshold=2.5))
                    stub.SetMonitoring(monitoring_service_pb2.SetMonitoringRequest(
                        model=MODEL, enabled=True))
                return stub.GetMonitoring(monitoring_service_pb2.GetMonitoringRequest(
                    model=MODEL)).monitoring
        finally:
            process.stop()

    first, second = engine_state(write=True), engine_state(write=False)
    assert second.enabled and [(p.name, p.layer, p.threshold) for p in second.probes] == [
        ("kept", 0, 2.5)]
    assert second.probes[0].features[0].index == 9 and first.probes == second.probes


@pytest.mark.parametrize("model", [MODEL, "millm-tiny-gguf:F32"])
def test_feature_cards_keep_contexts_from_monitored_traffic_when_opted_in(clean, model):
    """keep_contexts (off by default): the strongest position of the
    feature that fires hardest on a monitored prompt shows on that feature's
    card with the value the request's own readout read there and its token;
    turning it off forgets them."""
    def ask(**extra) -> dict:
        reply = clean.api("POST", "/v1/chat/completions", {
            "model": model, "messages": MESSAGES, "max_tokens": 8, "temperature": 0, **extra})
        assert reply.status_code == 200, reply.text
        return reply.json()

    read = ask(return_sae_activations={"sae_id": L1, "top_k": 1, "positions": "all",
                                       "read_point": "pre_steering"})
    best = max((p for p in read["millm"]["sae_activations"]["positions"] if p["features"]),
               key=lambda p: p["features"][0]["value"])
    feature, value = best["features"][0]["index"], best["features"][0]["value"]
    card = f"/api/saes/{L1}/features/{feature}"
    clean.ok("POST", "/api/probes", {"name": "reads", "sae_id": L1, "feature": feature,
                                     "threshold": 10000})
    state = clean.ok("PUT", "/api/monitoring", {"model": model, "enabled": True})["monitoring"]
    assert state["keep_contexts"] is False
    ask()
    assert clean.ok("GET", card)["traffic_contexts"] == []
    state = clean.ok("PUT", "/api/monitoring", {"model": model, "enabled": True,
                                                "keep_contexts": True})["monitoring"]
    assert state["keep_contexts"] is True
    ask()
    ask(n=2, temperature=1.0)  # several choices: not sampled
    contexts = clean.ok("GET", card)["traffic_contexts"]
    assert contexts, "the feature's strongest position was not kept"
    assert contexts[0]["value"] == pytest.approx(value, rel=1e-3, abs=1e-3)
    token = clean.ok("POST", "/detokenize", {"model": model, "tokens": [best["token_id"]]})
    assert contexts[0]["token"] == token["prompt"]
    assert [c["value"] for c in contexts] == sorted((c["value"] for c in contexts), reverse=True)
    assert len(contexts) <= 8
    # Off forgets; the switch stays as it was.
    state = clean.ok("PUT", "/api/monitoring", {"model": model, "enabled": True,
                                                "keep_contexts": False})["monitoring"]
    assert state["keep_contexts"] is False and state["enabled"] is True
    assert clean.ok("GET", card)["traffic_contexts"] == []
