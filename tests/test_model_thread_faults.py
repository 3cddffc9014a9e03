"""The supervised model thread (engines/transformers/scheduler.py, and the
GGUF engine's, engines/gguf/), proven by injected faults (engines/faults.py,
MILLM_FAULT_INJECTION): a failing part or row fails its own request only; a
failure in shared batch state fails that batch's rows with 503 engine_failure
and the engine keeps serving; a thread that dies answers everyone, turns
NOT_SERVING and exits non-zero."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from millm.v1 import generation_service_pb2_grpc
from service.server import EXIT_MODEL_THREAD_DIED
from tests.conftest import MODEL
from tests.grpc_helpers import error_info, prompt_request, run
from tests.harness import start_engine, wait_serving

LONG = dict(max_tokens=600, temperature=0, ignore_eos=True)


def _when_running(pool, stub, request):
    """Start a streamed request; return its future once its first token came."""
    started = concurrent.futures.Future()

    def go():
        try:
            for response in stub.Generate(request, timeout=120):
                if response.choices and not started.done():
                    started.set_result(True)
            return "ok", None
        except grpc.RpcError as exc:
            info = error_info(exc)
            return (exc.code(), info.reason, info.metadata["http_status"]), None
        finally:
            if not started.done():
                started.set_result(False)

    future = pool.submit(go)
    assert started.result(timeout=60)
    return future


GGUF = "millm-tiny-gguf:Q8_0"


class _Engine:
    def __init__(self, tmp, faults: str, **env):
        self.proc, port = start_engine(tmp, MILLM_FAULT_INJECTION=faults, **env)
        wait_serving(self.proc, port)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = generation_service_pb2_grpc.GenerationServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def close(self):
        self.channel.close()
        self.proc.stop()


@pytest.fixture
def engine_with(tmp_path):
    made = []

    def make(faults: str, **env) -> _Engine:
        made.append(_Engine(tmp_path, faults, **env))
        return made[-1]

    yield make
    for engine in made:
        engine.close()


def _outcome(stub, request):
    try:
        return "ok", run(stub, request)[1]
    except grpc.RpcError as exc:
        info = error_info(exc)
        return (exc.code(), info.reason, info.metadata["http_status"]), None


def _healthy_afterwards(stub, model: str = MODEL):
    status, texts = _outcome(stub, prompt_request("The river ran", max_tokens=5,
                                                  temperature=0, model=model))
    assert status == "ok" and len(texts[0]) > 0


def test_an_out_of_memory_prefill_fails_that_request_alone(engine_with):
    engine = engine_with("prefill:oom:1")
    assert _outcome(engine.stub, prompt_request("First", max_tokens=3))[0] == (
        grpc.StatusCode.RESOURCE_EXHAUSTED, "insufficient_memory", "503")
    _healthy_afterwards(engine.stub)


def test_a_prefill_shared_by_several_prompts_is_retried_one_by_one(engine_with):
    # Three prompts are prefilled in one forward pass; it fails, each is
    # retried alone, and the request succeeds whole.
    engine = engine_with("prefill:oom:1")
    status, texts = _outcome(engine.stub, prompt_request("One", "Two", "Three", max_tokens=4,
                                                         temperature=0))
    assert status == "ok" and sorted(texts) == [0, 1, 2]
    assert "retrying each alone" in engine.proc.log()


def test_a_failed_decode_step_fails_its_batch_with_503_and_serving_goes_on(engine_with):
    engine = engine_with("decode:oom:5")
    stub = engine.stub
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        outcomes = [f.result()[0] for f in [
            pool.submit(_outcome, stub, prompt_request(f"Row {i}", **LONG)) for i in range(2)]]
    assert (grpc.StatusCode.UNAVAILABLE, "engine_failure", "503") in outcomes
    _healthy_afterwards(stub)


def test_a_failed_lane_merge_resets_the_batch_and_serving_goes_on(engine_with):
    # The first merge is into an empty lane; the second joins a running one.
    engine = engine_with("merge:error:2")
    stub = engine.stub
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = _when_running(pool, stub, prompt_request("Running", **LONG))
        second = pool.submit(_outcome, stub, prompt_request("Joining", **LONG))
        outcomes = [first.result()[0], second.result()[0]]
    assert outcomes == [(grpc.StatusCode.UNAVAILABLE, "engine_failure", "503")] * 2
    _healthy_afterwards(stub)


def test_a_failing_row_fails_its_own_request_only(engine_with):
    # The 40th token taken fails: by then two requests run side by side.
    engine = engine_with("row:error:40")
    stub = engine.stub
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(_outcome, stub, prompt_request(f"Row {i}", **LONG))
                   for i in range(2)]
        outcomes = [f.result()[0] for f in futures]
    assert sorted(map(str, outcomes)) == sorted(map(str, [
        "ok", (grpc.StatusCode.INTERNAL, "internal_error", "500")]))
    _healthy_afterwards(stub)


def test_a_part_that_cannot_be_set_up_fails_its_request_and_nothing_hangs(engine_with):
    # Taken from the queue, it fails before it runs: its caller is answered.
    engine = engine_with("admit:error:1")
    request = prompt_request("First", max_tokens=3)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        outcome = pool.submit(_outcome, engine.stub, request).result(timeout=60)[0]
    assert outcome == (grpc.StatusCode.INTERNAL, "internal_error", "500")
    _healthy_afterwards(engine.stub)


def test_a_failing_gguf_row_fails_its_own_request_only(engine_with):
    # The GGUF engine batches too (MILLM_GGUF_SLOTS): the 40th token taken fails
    # one row, and only its request.
    engine = engine_with("row:error:40", MILLM_MODEL=GGUF)
    stub = engine.stub
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(_outcome, stub, prompt_request(f"Row {i}", model=GGUF, **LONG))
                   for i in range(2)]
        outcomes = [f.result()[0] for f in futures]
    assert sorted(map(str, outcomes)) == sorted(map(str, [
        "ok", (grpc.StatusCode.INTERNAL, "internal_error", "500")]))
    _healthy_afterwards(stub, GGUF)
    assert engine.proc.alive()


def test_a_failed_gguf_decode_step_fails_the_batch_with_503_and_serving_goes_on(engine_with):
    engine = engine_with("decode:error:20", MILLM_MODEL=GGUF)
    assert _outcome(engine.stub, prompt_request("Row", model=GGUF, **LONG))[0] == (
        grpc.StatusCode.UNAVAILABLE, "engine_failure", "503")
    _healthy_afterwards(engine.stub, GGUF)
    assert engine.proc.alive()


def test_a_failed_gguf_seeded_lane_fails_its_request_alone(engine_with):
    # A seeded request decodes in a lane of its own (engines/gguf/lanes.py):
    # when that lane's step fails, the shared batch beside it goes on.
    engine = engine_with("seeded:error:30", MILLM_MODEL=GGUF)
    stub = engine.stub
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        unseeded = _when_running(pool, stub, prompt_request("Row", model=GGUF, **LONG))
        seeded = _outcome(stub, prompt_request("Seeded", model=GGUF, seed=3, **LONG))
        assert seeded[0] == (grpc.StatusCode.UNAVAILABLE, "engine_failure", "503")
        assert unseeded.result()[0] == "ok"
    again = _outcome(stub, prompt_request("Seeded", model=GGUF, seed=3, max_tokens=5))
    assert again[0] == "ok" and len(again[1][0]) > 0
    assert engine.proc.alive()


def test_a_dead_model_thread_answers_everyone_turns_not_serving_and_exits(engine_with):
    engine = engine_with("turn:death:150")
    stub = engine.stub
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(_outcome, stub, prompt_request(f"Row {i}", **LONG))
                   for i in range(3)]
        outcomes = [f.result()[0] for f in futures]
    assert outcomes == [(grpc.StatusCode.UNAVAILABLE, "engine_failure", "503")] * 3
    assert engine.proc.proc.wait(timeout=30) == EXIT_MODEL_THREAD_DIED
    assert "model thread died" in engine.proc.log()


def test_health_is_not_serving_as_soon_as_the_thread_dies(engine_with):
    engine = engine_with("turn:death:100")
    # A health watch sees every change, so NOT_SERVING cannot slip between polls
    # (or be mistaken for the process having gone).
    watch = engine.health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
    statuses: list[int] = []

    def follow():
        try:
            for reply in watch:
                statuses.append(reply.status)
        except grpc.RpcError:
            pass  # the engine stopped

    follower = threading.Thread(target=follow)
    follower.start()
    deadline = time.monotonic() + 10
    while not statuses and time.monotonic() < deadline:
        time.sleep(0.01)
    outcome = _outcome(engine.stub, prompt_request("Row", **LONG))[0]
    assert outcome[0] == grpc.StatusCode.UNAVAILABLE
    follower.join(30)
    assert statuses[0] == health_pb2.HealthCheckResponse.SERVING
    assert health_pb2.HealthCheckResponse.NOT_SERVING in statuses[1:], statuses
    assert engine.proc.proc.wait(timeout=30) == EXIT_MODEL_THREAD_DIED
