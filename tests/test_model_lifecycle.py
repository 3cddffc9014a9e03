"""The model registry and lifecycle on engines of their own: switching models by
naming them, explicit load and unload, refusals checked before the unload,
requests during an unload, concurrent model changes, and the model lock."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import threading
import time

import openai
import pytest

from service.demo_model.build import CONTEXT_WINDOW
from tests import harness
from tests.conftest import wait_until
from tests.http_helpers import SseStream
from tests.http_helpers import call as http_call

TINY, F32, Q8 = "millm-tiny", "millm-tiny-gguf:F32", "millm-tiny-gguf:Q8_0"
HUGE_BYTES = 4 * 2**40  # a sparse 4 TiB weights file: no machine here has that free


def call(stack, method: str, path: str, body: dict | None = None, timeout: float = 120):
    reply = http_call(stack.http_port, method, path, body, timeout=timeout)
    return reply.status_code, reply.json(), reply.headers


def chat(stack, model: str, max_tokens: int = 4):
    return call(stack, "POST", "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": "Hello!"}],
        "max_tokens": max_tokens, "temperature": 0})


def states(stack) -> dict[str, str]:
    status, body, _ = call(stack, "GET", "/api/models")
    assert status == 200, body
    return {m["id"]: m["state"] for m in body["data"]}


def models_dir(tmp) -> str:
    """The demo models, plus checkpoints that cannot be loaded for three reasons."""
    source = harness.models_dir()
    target = tmp / "models"
    target.mkdir()
    for name in ("millm-tiny", "millm-tiny-gguf"):
        os.symlink(source / name, target / name)
    tiny = source / "millm-tiny"
    config = json.loads((tiny / "config.json").read_text())
    # A 2-bit GPTQ checkpoint: a quantization the transformers engine cannot run.
    gptq = target / "tiny-gptq-2bit"
    shutil.copytree(tiny, gptq)
    (gptq / "config.json").write_text(json.dumps(
        {**config, "quantization_config": {"quant_method": "gptq", "bits": 2}}))
    # Weights larger than any free memory (a sparse file takes no disk).
    huge = target / "tiny-huge"
    huge.mkdir()
    (huge / "config.json").write_text(json.dumps(config))
    with open(huge / "model.safetensors", "wb") as weights:
        weights.truncate(HUGE_BYTES)
    # Loads fail: the weights file is not a safetensors file.
    broken = target / "tiny-broken"
    shutil.copytree(tiny, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    return str(target)


@pytest.fixture(scope="module")
def life(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lifecycle")
    stack = harness.OwnStack(tmp, MILLM_MODELS_DIR=models_dir(tmp), MILLM_MODEL=TINY,
                             MILLM_GRACEFUL_UNLOAD_TIMEOUT="30")
    yield stack
    stack.stop()


def test_the_registry_lists_checkpoints_and_each_gguf_quantization(life):
    found = states(life)
    assert found[TINY] == "loaded"
    assert found[F32] == found[Q8] == "ready"
    status, body, _ = call(life, "GET", f"/api/models/{Q8}")
    assert status == 200
    assert (body["engine"], body["repo"], body["quantization"]) == ("gguf", "millm-tiny-gguf",
                                                                    "Q8_0")
    assert body["size_bytes"] == (harness.models_dir() / "millm-tiny-gguf" /
                                  "millm-tiny-gguf-Q8_0.gguf").stat().st_size
    listed = openai.OpenAI(base_url=f"{life.base_url}/v1", api_key="x").models.list()
    assert {TINY, F32, Q8} <= {m.id for m in listed.data}


def test_naming_a_model_switches_to_it(life):
    for model in (F32, TINY, Q8, TINY):
        status, body, _ = chat(life, model)
        assert status == 200, body
        assert body["model"] == model
        assert body["system_fingerprint"].endswith(
            ":gguf" if "gguf" in model else ":transformers")
        assert states(life)[model] == "loaded"


def test_an_unloadable_quantization_is_refused_before_the_unload(life):
    status, body, _ = chat(life, "tiny-gptq-2bit")
    assert status == 400 and body["error"]["code"] == "unsupported_quantization"
    assert "gptq-2bit" in body["error"]["message"]
    assert states(life)[TINY] == "loaded"  # still serving


def test_a_model_that_does_not_fit_is_refused_with_the_figures(life):
    status, body, headers = chat(life, "tiny-huge")
    assert status == 503 and body["error"]["code"] == "insufficient_memory"
    message = body["error"]["message"]
    assert "MiB" in message and "cpu" in message and str(HUGE_BYTES // 2**20) in message
    assert states(life)[TINY] == "loaded"
    assert chat(life, TINY)[0] == 200


def test_a_load_failing_after_the_unload_is_model_load_failed(life):
    status, body, _ = chat(life, "tiny-broken")
    assert status == 500 and body["error"]["code"] == "model_load_failed"
    found = states(life)
    assert found["tiny-broken"] == "failed" and "loaded" not in found.values()
    _, detail, _ = call(life, "GET", "/api/models/tiny-broken")
    assert detail["error"]
    # The next request names a good model and is served again.
    assert chat(life, TINY)[0] == 200


def test_explicit_load_and_unload(life):
    status, body, _ = call(life, "POST", f"/api/models/{Q8}/load")
    assert status == 200 and body["state"] == "loaded" and body["context_window"] == CONTEXT_WINDOW
    status, body, _ = call(life, "POST", f"/api/models/{Q8}/unload")
    assert status == 200 and body["state"] == "ready"
    assert "loaded" not in states(life).values()
    status, body, _ = call(life, "POST", f"/api/models/{Q8}/unload")
    assert status == 400  # not loaded
    # With nothing loaded, a request loads what it names.
    assert chat(life, TINY)[0] == 200


def test_requests_during_an_unload_are_model_busy_and_running_ones_finish(life):
    assert chat(life, TINY)[0] == 200
    tokens = 900
    with SseStream(life.base_url, "/v1/completions", timeout=120, body={
            "model": TINY, "prompt": "Once upon a time", "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}) as running:
        lines = running.lines()
        assert next(line for line in lines if line.startswith("data: "))
        loader = concurrent.futures.ThreadPoolExecutor(1).submit(
            call, life, "POST", f"/api/models/{F32}/load")
        assert wait_until(lambda: states(life)[TINY] == "unloading", 10)
        for model in (TINY, Q8):  # the one leaving, and any other
            status, body, headers = chat(life, model)
            assert status == 503 and body["error"]["code"] == "model_busy", body
            assert headers.get("retry-after")
        events = [json.loads(line[6:]) for line in lines
                  if line.startswith("data: ") and line != "data: [DONE]"]
    assert "error" not in events[-1]
    assert events[-1]["usage"]["completion_tokens"] == tokens
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "length"
    status, body, _ = loader.result(timeout=60)
    assert status == 200 and body["id"] == F32 and states(life)[F32] == "loaded"


def test_two_clients_asking_for_two_models_at_once(life):
    assert chat(life, F32)[0] == 200
    barrier = threading.Barrier(2)

    def ask(model):
        barrier.wait()
        return model, chat(life, model)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(ask, (TINY, Q8)))
    for model, (status, body, _) in answers:
        assert (status == 200 and body["model"] == model) or \
            (status == 503 and body["error"]["code"] == "model_busy"), (model, status, body)
    assert any(status == 200 for _, (status, _, _) in answers)
    found = states(life)
    assert list(found.values()).count("loaded") == 1
    assert "loading" not in found.values() and "unloading" not in found.values()


def test_concurrent_requests_for_one_new_model_load_it_once(life):
    assert chat(life, TINY)[0] == 200
    before = life.engine.log().count(f"loaded {Q8} in")
    barrier = threading.Barrier(4)

    def ask(_):
        barrier.wait()
        return chat(life, Q8)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, range(4)))
    for status, body, _ in answers:
        assert status == 200 or (status == 503 and body["error"]["code"] == "model_busy")
    assert any(status == 200 for status, _, _ in answers)
    assert life.engine.log().count(f"loaded {Q8} in") == before + 1


# -- a server locked to one model, whose unloads wait briefly ------------------------------


@pytest.fixture(scope="module")
def locked(tmp_path_factory):
    stack = harness.OwnStack(tmp_path_factory.mktemp("locked"), MILLM_LOCK_MODEL=TINY,
                             MILLM_GRACEFUL_UNLOAD_TIMEOUT="0.3")
    yield stack
    stack.stop()


def test_a_locked_server_lists_and_serves_only_its_model(locked):
    client = openai.OpenAI(base_url=f"{locked.base_url}/v1", api_key="x", max_retries=0)
    assert [m.id for m in client.models.list().data] == [TINY]
    assert client.chat.completions.create(model=TINY,
                                          messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=2).model == TINY
    for other in (Q8, F32, "millm-tiny-gguf"):
        with pytest.raises(openai.NotFoundError) as caught:
            client.chat.completions.create(model=other,
                                           messages=[{"role": "user", "content": "Hi"}])
        assert caught.value.body["code"] == "model_not_found"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve(other)
    # The management view still shows everything on disk.
    _, body, _ = call(locked, "GET", "/api/models")
    locked_out = {m["id"]: m["locked_out"] for m in body["data"]}
    assert locked_out[TINY] is False and locked_out[Q8] is True


def test_an_unload_ends_requests_that_outlast_the_graceful_timeout(locked):
    with SseStream(locked.base_url, "/v1/completions", timeout=60, body={
            "model": TINY, "prompt": "Once upon a time", "max_tokens": 1000, "temperature": 0,
            "ignore_eos": True, "stream": True}) as running:
        lines = running.lines()
        assert next(line for line in lines if line.startswith("data: "))
        started = time.monotonic()
        status, body, _ = call(locked, "POST", f"/api/models/{TINY}/unload")
        assert status == 200 and time.monotonic() - started < 10
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    error = json.loads(rest[-2][6:])
    assert error["error"]["code"] == "model_busy"
    # The next request loads the model again.
    assert chat(locked, TINY)[0] == 200


def test_the_python_client_loads_and_unloads(life):
    from millm.client import Client
    from millm.v1 import model_pb2

    with Client(life.grpc_target) as client:
        assert client.load_model(F32).state == model_pb2.MODEL_STATE_LOADED
        assert client.unload_model(F32).state == model_pb2.MODEL_STATE_READY
        assert client.load_model(TINY).engine == "transformers"


def test_two_changes_claimed_in_the_same_instant_start_one_load():
    """In process, on the real models: two requests for two other models in the
    same event-loop turn; exactly one change runs, the other is model_busy,
    and a third request for the model being loaded waits for it."""
    import asyncio

    from service.errors import EngineError
    from service.models.lifecycle import ModelLifecycle
    from service.models.lifecycle_config import LifecycleConfig
    from service.models.registry import ModelRegistry

    async def main():
        life = ModelLifecycle(ModelRegistry(harness.models_dir()), LifecycleConfig(device="cpu"))
        await life.load(TINY)
        results = await asyncio.gather(life.acquire(F32), life.acquire(Q8), life.acquire(F32),
                                       return_exceptions=True)
        try:
            first, second, third = results
            assert first.info.id == F32 and third.info.id == F32
            assert isinstance(second, EngineError) and second.code == "model_busy"
            assert life.loaded.id == F32
        finally:
            for lease in (first, third):
                if not isinstance(lease, BaseException):
                    lease.release()
            life.shutdown()

    asyncio.run(main())


def test_memory_needed_counts_weights_and_the_gguf_kv_cache():
    from service.engines import kinds
    from service.engines.admission import SchedulerLimits
    from service.engines.gguf.kv_plan import engine_bytes
    from service.models.lifecycle import ModelLifecycle
    from service.models.lifecycle_config import LifecycleConfig
    from service.models.registry import ModelRegistry

    registry = ModelRegistry(harness.models_dir())
    gguf, tiny = registry.resolve(F32), registry.resolve(TINY)
    # 2 layers x 2 KV heads x (16 + 16) dims x 2 bytes (f16), over the file's own context.
    assert (gguf.context_length, gguf.kv_bytes_per_token) == (CONTEXT_WINDOW, 256)
    # ... for each of the 8 slots the GGUF engine decodes together by default, and
    # the lanes and scoring context it may open beside them (engines/gguf/kv_plan.py).
    kv = ModelLifecycle(registry, LifecycleConfig(device="cpu")).check_load(gguf)
    assert (kv.window, kv.slots, kv.kv_bytes) == (CONTEXT_WINDOW, 8, 256 * CONTEXT_WINDOW * 8)
    assert kinds.memory_needed(gguf, "cpu", kv) == (
        gguf.path.stat().st_size, engine_bytes(kinds.cell_cost(gguf), CONTEXT_WINDOW, 8))
    assert kinds.memory_needed(tiny, "cpu") == (tiny.size_bytes, 0)  # float32 as stored
    capped = ModelLifecycle(registry, LifecycleConfig(device="cpu", gguf_context=256,
                                                      gguf_slots=2)).check_load(gguf)
    assert (capped.window, capped.slots, capped.kv_bytes) == (256, 2, 256 * 256 * 2)
    # MILLM_MAX_BATCH is the most rows either engine decodes together: it caps the slots.
    batched = ModelLifecycle(registry, LifecycleConfig(
        device="cpu", gguf_context=256, limits=SchedulerLimits(max_batch=3))).check_load(gguf)
    assert (batched.window, batched.slots) == (256, 3)


def test_the_state_table_refuses_an_illegal_move(tmp_path):
    from service.errors import EngineError
    from service.models.lifecycle import MOVES, ModelLifecycle, Phase
    from service.models.registry import ModelRegistry

    life = ModelLifecycle(ModelRegistry(tmp_path))
    assert life.phase is Phase.STARTING and not life.started
    assert (Phase.STARTING, Phase.LOADED) not in MOVES  # a load always passes through loading
    with pytest.raises(EngineError) as caught:
        life._move(Phase.LOADED, TINY)
    assert caught.value.code == "internal_error"
    assert life.phase is Phase.STARTING and life.engine is None


def test_loads_and_unloads_pass_through_the_expected_states(tmp_path, caplog):
    """In process: every move is logged, and the states a model reports follow them."""
    import asyncio
    import logging
    import pathlib

    from service.errors import EngineError
    from service.models.lifecycle import ModelLifecycle
    from service.models.lifecycle import Phase as P
    from service.models.lifecycle_config import LifecycleConfig
    from service.models.registry import ModelRegistry

    caplog.set_level(logging.DEBUG, logger="service.models.lifecycle")
    registry = ModelRegistry(pathlib.Path(models_dir(tmp_path)))
    life = ModelLifecycle(registry, LifecycleConfig(device="cpu"))
    tiny, f32 = registry.resolve(TINY), registry.resolve(F32)
    announced = []

    async def listener(engine):  # runs while loading (engine) and releasing (None)
        announced.append((life.phase, life.view(tiny).state, life.view(f32).state))

    life.on_engine_change.append(listener)

    def moves():
        found = [r.args[:2] for r in caplog.records if r.getMessage().startswith("model state")]
        caplog.clear()
        return found

    async def main():
        await life.load(TINY)
        assert moves() == [(P.STARTING, P.FIRST_LOAD), (P.FIRST_LOAD, P.LOADED)]
        assert life.started and life.view(tiny).state == "loaded"
        await life.load(F32)
        assert moves() == [(P.LOADED, P.DRAINING), (P.DRAINING, P.RELEASING),
                           (P.RELEASING, P.EMPTY), (P.EMPTY, P.LOADING), (P.LOADING, P.LOADED)]
        assert announced == [(P.FIRST_LOAD, "loading", "ready"),
                             (P.RELEASING, "unloading", "ready"),
                             (P.LOADING, "ready", "loading")]
        await life.unload(F32)
        assert moves() == [(P.LOADED, P.DRAINING), (P.DRAINING, P.RELEASING),
                           (P.RELEASING, P.EMPTY)]
        assert life.engine is None and life.view(f32).state == "ready"
        with pytest.raises(EngineError):
            await life.load("tiny-broken")
        assert moves() == [(P.EMPTY, P.LOADING), (P.LOADING, P.EMPTY)]
        broken = life.view(registry.resolve("tiny-broken"))
        assert broken.state == "failed" and broken.error

    try:
        asyncio.run(main())
    finally:
        life.shutdown()
