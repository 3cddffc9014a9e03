"""The metrics autoscalers and GIE's endpoint picker read, on the engine's
metrics port: vLLM's names and types, labelled with the model name, values
that agree with the requests actually served; the port open without a key
when MILLM_METRICS_OPEN=1 (gRPC still needs one); /readyz and /health there.
"""

from __future__ import annotations

import json
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from millm.v1 import generation_pb2, generation_service_pb2_grpc
from tests import harness
from tests.conftest import MODEL, wait_until
from tests.grpc_helpers import chat_request

KEY = "inf-0123456789abcdef-secret"
KEYS = json.dumps({"keys": [{"name": "svc", "scopes": ["inference"], "key": KEY}]})
SYSTEM = ("You are a careful assistant for the harbour office. Answer in one short sentence, "
          "name the pier, and never invent a timetable. ") * 3


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("autoscaler")
    metrics_port = harness.free_port()
    process, port = harness.start_engine(tmp, MILLM_API_KEYS=KEYS, MILLM_METRICS_OPEN="1",
                                         MILLM_METRICS_PORT=str(metrics_port))
    try:
        harness.wait_serving(process, port)
        yield port, metrics_port
    finally:
        process.stop()


def scrape(metrics_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as reply:
        text = reply.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(families: dict, family: str, suffix: str = "", default=None, **labels) -> float:
    for s in families[family].samples:
        if s.name == family + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    if default is not None:  # a labelled series appears with its first request
        return default
    raise KeyError(f"{family}{suffix} {labels}")


def test_the_gie_and_autoscaler_metrics_follow_the_requests_served(engine):
    port, metrics_port = engine
    before = scrape(metrics_port)  # no key: the port is open
    for name, kind in (("vllm:num_requests_waiting", "gauge"),
                       ("vllm:num_requests_running", "gauge"),
                       ("vllm:kv_cache_usage_perc", "gauge"),
                       ("vllm:cache_config_info", "gauge"),
                       ("vllm:generation_tokens", "counter"),
                       ("vllm:prompt_tokens", "counter"),
                       ("vllm:prefix_cache_queries", "counter"),
                       ("vllm:prefix_cache_hits", "counter"),
                       ("vllm:time_to_first_token_seconds", "histogram"),
                       ("vllm:inter_token_latency_seconds", "histogram"),
                       ("vllm:e2e_request_latency_seconds", "histogram"),
                       ("vllm:request_queue_time_seconds", "histogram")):
        assert before[name].type == kind, name
    assert sample(before, "vllm:num_requests_waiting", model_name=MODEL) == 0
    assert sample(before, "vllm:kv_cache_usage_perc", model_name=MODEL) == 0  # idle
    # The prefix cache's blocks: 16 tokens.
    (info,) = before["vllm:cache_config_info"].samples
    assert (info.labels["block_size"], info.value) == ("16", 1)
    assert int(info.labels["num_gpu_blocks"]) > 0
    metadata = (("authorization", f"Bearer {KEY}"),)
    prompt_tokens = completion = 0
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:  # gRPC still needs the key
            list(stub.Generate(chat_request("hi", max_tokens=2)))
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        for question in ("Where is pier four?", "When does the ferry leave?", "Is it windy?"):
            request = chat_request(question, temperature=0, max_tokens=8, ignore_eos=True)
            request.chat.messages.insert(0, generation_pb2.ChatMessage(
                role=generation_pb2.ROLE_SYSTEM, content=SYSTEM))
            responses = list(stub.Generate(request, metadata=metadata))
            usage = responses[-1].usage
            prompt_tokens += usage.prompt_tokens
            completion += usage.completion_tokens

    def idle() -> dict | None:
        families = scrape(metrics_port)
        return families if (sample(families, "vllm:num_requests_running", model_name=MODEL),
                            sample(families, "vllm:kv_cache_usage_perc", model_name=MODEL)
                            ) == (0, 0) else None

    # The engine drops a finished request's rows just after answering it.
    after = wait_until(idle)
    assert after, "the engine did not return to idle"

    def grew(family, suffix=""):
        return (sample(after, family, suffix, model_name=MODEL)
                - sample(before, family, suffix, 0.0, model_name=MODEL))

    assert grew("vllm:prompt_tokens", "_total") == prompt_tokens
    assert grew("vllm:prefix_cache_queries", "_total") == prompt_tokens
    # The shared system prompt's blocks are served from the prefix cache.
    assert 0 < grew("vllm:prefix_cache_hits", "_total") < prompt_tokens
    assert grew("vllm:generation_tokens", "_total") == completion == 24
    for family in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                   "vllm:request_queue_time_seconds"):
        assert grew(family, "_count") == 3, family
    # One per token after each request's first, however the outputs were merged.
    assert grew("vllm:inter_token_latency_seconds", "_count") == 3 * 7


def test_readyz_and_health_on_the_metrics_port(engine):
    _, metrics_port = engine
    for path in ("/readyz", "/health"):
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}{path}") as reply:
            body = json.loads(reply.read())
        assert reply.status == 200
        assert body == {"status": "ready", "model": MODEL, "state_store": "available"}


def test_many_observations_at_once_equal_as_many_observe_calls():
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from service.request_metrics import ITL_BUCKETS, observe_many

    registries = [CollectorRegistry(), CollectorRegistry()]
    one, many = (Histogram("itl", "t", ["m"], buckets=ITL_BUCKETS, registry=r).labels("x")
                 for r in registries)
    for amount, count in ((0.003, 5), (0.2, 31), (0.2, 1), (99.0, 3), (0.0, 2)):
        for _ in range(count):
            one.observe(amount)
        observe_many(many, amount, count)
    def samples(registry):
        text = generate_latest(registry).decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples
                if not s.name.endswith("_created")}

    expected, got = samples(registries[0]), samples(registries[1])
    assert expected.keys() == got.keys() and len(expected) > 3
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key


def test_a_streamed_requests_tally_reaches_the_histogram_as_observe_calls_would(monkeypatch):
    from prometheus_client import CollectorRegistry, Histogram

    from service import request_metrics
    from service.request_metrics import ITL_BUCKETS, ITL_FLUSH_S, RequestMetrics

    clock = [100.0]
    monkeypatch.setattr(request_metrics.time, "monotonic", lambda: clock[0])
    timer = RequestMetrics(CollectorRegistry()).request(MODEL, started=100.0)
    itl = timer._m.itl.labels(MODEL)
    expected = Histogram("itl", "t", ["m"], buckets=ITL_BUCKETS,
                         registry=CollectorRegistry()).labels("x")

    def state(h):
        return [b.get() for b in h._buckets], h._sum.get()

    clock[0] += 0.02
    timer.step(1)  # the first token: time to first token, no gap
    for gap, tokens in ((0.004, 1), (0.3, 3), (0.011, 1), (ITL_FLUSH_S, 2), (0.05, 1)):
        clock[0] += gap
        timer.step(tokens)
        for _ in range(tokens):
            expected.observe(gap / tokens)
        if clock[0] - 100.0 < ITL_FLUSH_S:  # tallied, not yet in the histogram
            assert state(itl) == ([0] * len(ITL_BUCKETS) + [0], 0.0)
    timer.finished(10, 0)  # what is left of the tally goes in at the end
    (got, total), (want, want_total) = state(itl), state(expected)
    assert got == want and sum(got) == 8
    assert total == pytest.approx(want_total, rel=1e-12)
