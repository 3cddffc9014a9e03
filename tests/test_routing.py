"""The bridge's router over several engines (rest_bridge/routing/): the engines'
load reports over real gRPC, and through a real bridge over real engines that
requests sharing a long prompt prefix reach one replica (whose prefix cache
then hits) while round-robin splits them, and that a request goes to the
replica that has its model loaded. The policy itself is also checked as the
pure function it is."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from millm.v1 import server_service_pb2, server_service_pb2_grpc
from rest_bridge.routing import picker
from rest_bridge.routing.prefix import BLOCK_CHARS, PrefixIndex, block_hashes
from rest_bridge.routing.router import Router, dns_name
from tests import harness
from tests.conftest import MODEL, inference_status, wait_until
from tests.grpc_helpers import error_info
from tests.http_helpers import call

GGUF = "millm-tiny-gguf:Q8_0"
SERVING = server_service_pb2.REPLICA_STATE_SERVING


class Engine:
    def __init__(self, tmp, name: str, **env):
        (tmp / name).mkdir()
        self.process, self.port = harness.start_engine(tmp / name, **env)
        self.channel = None

    def ready(self) -> None:
        harness.wait_serving(self.process, self.port)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.server = server_service_pb2_grpc.ServerServiceStub(self.channel)

    def completed(self) -> int:
        return inference_status(self.server).completed_generations_total

    def first_report(self, interval_ms: int = 0) -> server_service_pb2.WatchLoadResponse:
        stream = self.server.WatchLoad(server_service_pb2.WatchLoadRequest(
            interval_ms=interval_ms), timeout=10)
        report = next(stream)
        stream.cancel()
        return report

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
        self.process.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("routing")
    engines = {"a": Engine(tmp, "a"), "b": Engine(tmp, "b"),
               "gguf": Engine(tmp, "gguf", MILLM_MODEL=GGUF)}
    bridges = []
    try:
        for engine in engines.values():
            engine.ready()

        def bridge(names, routing):
            targets = ",".join(f"127.0.0.1:{engines[n].port}" for n in names)
            process, http = harness.start_bridge(tmp, engines[names[0]].port,
                                                 MILLM_ENGINE_TARGETS=targets,
                                                 MILLM_ROUTING=routing)
            bridges.append(process)
            harness.wait_http(process, f"http://127.0.0.1:{http}/readyz")
            return http

        yield engines, bridge
    finally:
        for process in bridges:
            process.stop()
        for engine in engines.values():
            engine.stop()


def test_an_engine_reports_its_state_model_and_load(fleet):
    engines, _ = fleet
    report = engines["a"].first_report()
    assert report.state == SERVING
    assert report.model == MODEL and list(report.model_names) == [MODEL]
    assert len(report.replica_id) == 32 and report.max_batch > 0
    assert report.kv_cache_utilization == 0  # idle: no row holds KV
    assert report.running_requests == 0 and report.waiting_requests == 0
    gguf = engines["gguf"].first_report(interval_ms=50)
    assert gguf.model == GGUF and set(gguf.model_names) == {GGUF, "millm-tiny-gguf"}
    assert gguf.replica_id != report.replica_id
    with pytest.raises(grpc.RpcError) as refused:
        engines["a"].first_report(interval_ms=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(refused.value).reason == "invalid_parameter"


def _chat(http: int, system: str, user: str, model: str = MODEL) -> dict:
    reply = call(http, "POST", "/v1/chat/completions", {
        "model": model, "max_tokens": 2, "temperature": 0,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]})
    assert reply.status_code == 200, reply.text
    return reply.json()


SYSTEMS = [f"You are assistant number {i}. " + "Answer briefly and kindly. " * 24
           for i in range(3)]


def _spread(engines, http: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Per system prompt, (requests a served, requests b served); and the cached
    tokens of every request after each prompt's first."""
    spread, cached = [], []
    for system in SYSTEMS:
        before = engines["a"].completed(), engines["b"].completed()
        for i in range(4):
            body = _chat(http, system, f"Question {i}: what is the sea?")
            if i:
                cached.append(body["usage"]["prompt_tokens_details"]["cached_tokens"])
        deadline = time.monotonic() + 5  # an engine counts a generation just after answering
        while True:
            pair = (engines["a"].completed() - before[0], engines["b"].completed() - before[1])
            if sum(pair) == 4 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        spread.append(pair)
    return spread, cached


def test_requests_sharing_a_long_prefix_reach_one_replica_and_hit_its_cache(fleet):
    engines, bridge = fleet
    assert all(len(s) > 2 * BLOCK_CHARS for s in SYSTEMS)
    http = bridge(["a", "b"], "load_prefix")
    spread, cached = _spread(engines, http)
    assert all(sorted(pair) == [0, 4] for pair in spread), spread
    assert {a > 0 for a, _ in spread} == {True, False}  # both replicas got prompts
    assert all(c > 0 for c in cached), cached
    # The bridge's metrics say so: each prompt's 3 later requests went by prefix.
    metrics = call(http, "GET", "/metrics").text
    by_prefix = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                    if line.startswith("millm_bridge_routed_requests_total{")
                    and 'reason="prefix"' in line)
    assert by_prefix == 3 * len(SYSTEMS), metrics
    assert metrics.count("millm_bridge_replica_routable{") == 2
    # Round-robin over the same engines splits every prompt's requests.
    rr_spread, _ = _spread(engines, bridge(["a", "b"], "round_robin"))
    assert all(pair == (2, 2) for pair in rr_spread), rr_spread


def _routable(http: int) -> int:
    """How many replicas the bridge's metrics call routable."""
    return sum(line.startswith("millm_bridge_replica_routable{") and line.endswith(" 1.0")
               for line in call(http, "GET", "/metrics").text.splitlines())


def test_a_request_goes_to_the_replica_that_has_its_model(fleet):
    engines, bridge = fleet
    http = bridge(["a", "gguf"], "load_prefix")
    assert wait_until(lambda: _routable(http) == 2)  # both load streams are up
    before = engines["a"].completed(), engines["gguf"].completed()
    for i in range(3):
        assert _chat(http, "Be brief.", f"Hello {i}", model=GGUF)["model"] == GGUF
        assert _chat(http, "Be brief.", f"Hello {i}", model=MODEL)["model"] == MODEL
    # An engine counts a generation just after answering.
    def served():
        return engines["a"].completed() - before[0], engines["gguf"].completed() - before[1]
    wait_until(lambda: sum(served()) >= 6)
    assert served() == (3, 3)
    assert engines["a"].first_report().model == MODEL  # nothing switched


def test_a_dns_target_is_resolved_into_one_replica_per_address(fleet):
    engines, _ = fleet
    port = engines["a"].port

    async def follow() -> tuple[set[str], bool]:
        router = Router((f"dns:///localhost:{port}",))
        router.start()
        try:
            target = f"ipv4:127.0.0.1:{port}"
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                replica = router.replicas.get(target)
                if replica is not None and replica.routable(time.monotonic()):
                    break
                await asyncio.sleep(0.05)
            chosen = router.pick(MODEL)
            return set(router.replicas), chosen is not None and chosen.target == target
        finally:
            await router.close()

    found, picked = asyncio.run(follow())
    assert f"ipv4:127.0.0.1:{port}" in found and picked
    assert dns_name("dns:///engines:50051") == ("engines", 50051)
    assert dns_name("dns://8.8.8.8/engines.svc:7000") == ("engines.svc", 7000)
    assert dns_name("10.0.0.1:50051") is None


# -- the policy, as a pure function -------------------------------------------------


def _replica(target: str, *, load: int = 0, state=SERVING, model: str = MODEL,
             age_s: float = 0.0) -> picker.Replica:
    report = server_service_pb2.WatchLoadResponse(state=state, model=model,
                                                  model_names=[model], running_requests=load)
    return picker.Replica(target, report=report, streaming=True,
                          seen_at=time.monotonic() - age_s)


def test_the_policy_skips_unroutable_replicas_and_prefers_the_loaded_model():
    switching = _replica("a", state=server_service_pb2.REPLICA_STATE_SWITCHING)
    stale = _replica("b", age_s=picker.HANG_S + 1)
    other_model = _replica("c", model=GGUF)
    serving = _replica("d", load=5)
    for _ in range(4):
        choice = picker.choose([switching, stale, other_model, serving], MODEL, {})
        assert choice.replica is serving
    assert picker.choose([switching, stale], MODEL, {}) is None
    # Nobody has the model: any routable replica (it will load or refuse).
    assert picker.choose([other_model], "elsewhere", {}).replica is other_model
    # A retry leaves out the replicas tried, unless none would be left.
    assert picker.choose([serving, other_model], GGUF, {}, frozenset({"c"})).replica \
        is serving
    assert picker.choose([serving], MODEL, {}, frozenset({"d"})).replica is serving


def test_the_policy_keeps_prefix_affinity_until_the_replica_is_overloaded():
    a, b = _replica("a", load=3), _replica("b", load=0)
    assert picker.choose([a, b], MODEL, {"a": 2}).reason == "prefix"
    assert picker.choose([a, b], MODEL, {"a": 2}).replica is a
    a.in_flight = picker.IMBALANCE_ABS + 1
    choice = picker.choose([a, b], MODEL, {"a": 2})
    assert (choice.replica, choice.reason) == (b, "least_load")
    # Without a match the least loaded wins, ties taken in turn.
    a.in_flight, b.report.running_requests = 0, 0
    a.report.running_requests = 0
    picks = {picker.choose([a, b], MODEL, {}).replica.target for _ in range(4)}
    assert picks == {"a", "b"}


def test_a_late_report_is_not_a_dead_replica():
    """A report a few seconds late (a loaded machine) leaves the replica
    routable; one that came before this bridge's last call there ended no
    longer counts that call: the calls in flight alone do, until the next."""
    late = _replica("a", load=1, age_s=5.0)
    assert late.routable(time.monotonic()) and late.load == 1
    late.done_at = time.monotonic()
    assert late.load == 0
    late.in_flight = 2
    assert late.load == 2
    fresh = _replica("b", load=0)
    picks = {picker.choose([_replica("a", age_s=5.0), fresh], MODEL, {}).replica.target
             for _ in range(4)}
    assert picks == {"a", "b"}
    assert not _replica("c", age_s=picker.HANG_S + 1).routable(time.monotonic())


def test_the_prefix_index_matches_leading_blocks_and_stays_bounded():
    shared = "x" * (3 * BLOCK_CHARS)
    one, two = block_hashes(shared + "a" * BLOCK_CHARS), block_hashes(shared + "b" * BLOCK_CHARS)
    assert len(one) == 4 and one[:3] == two[:3] and one[3] != two[3]
    assert block_hashes("short") == []
    index = PrefixIndex(entries=6)
    index.record(one, "a")
    assert index.matches(two) == {"a": 3}
    index.record(two, "b")
    assert index.matches(one) == {"a": 4, "b": 3}
    assert len(index._sent) <= 6  # the oldest blocks went first
    index.forget("a")
    assert "a" not in index.matches(one)


def test_a_prompt_cache_key_is_a_block_of_its_own():
    # A Responses request's prompt_cache_key leads its prefix: same key,
    # same replica, even before the prompts share a whole block.
    one, two = block_hashes("short", "session-1"), block_hashes("other", "session-1")
    assert one == two and len(one) == 1
    assert block_hashes("short", "session-2") != one
    long = block_hashes("x" * BLOCK_CHARS, "session-1")
    assert long[0] == one[0] and long[1] != block_hashes("x" * BLOCK_CHARS)[0]
    index = PrefixIndex()
    index.record(one, "a")
    assert index.matches(two) == {"a": 1} and index.matches(block_hashes("short")) == {}
