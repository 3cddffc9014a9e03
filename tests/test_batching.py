"""Continuous batching: rows of different requests share forward passes, and
that changes no answer. Functional checks, not timings."""

from __future__ import annotations

import concurrent.futures
import random
import threading

import grpc
import pytest

from tests.conftest import MODEL, inference_status, wait_until
from tests.grpc_helpers import MaxRunningRows, chat_request, concurrently, prompt_request, run


def texts_of(stub, request) -> dict:
    return run(stub, request)[1]


GREEDY = [
    prompt_request("The river ran", max_tokens=40, temperature=0, ignore_eos=True),
    prompt_request("Cats sleep most of the day. They find a warm spot", max_tokens=25,
                   temperature=0, ignore_eos=True),
    chat_request("Tell me a story.", max_tokens=30, temperature=0, ignore_eos=True),
    prompt_request("A", max_tokens=50, temperature=0, ignore_eos=True),
    prompt_request("The lighthouse keeper wrote in his journal every night.", max_tokens=12,
                   temperature=0, ignore_eos=True),
]


def test_batched_greedy_equals_alone(generation_stub, server_stub):
    alone = [texts_of(generation_stub, r) for r in GREEDY]
    with MaxRunningRows(server_stub) as rows:
        batched = concurrently(generation_stub, GREEDY)
    assert rows.value >= 3, "the requests did not share the batch"
    assert batched == alone


def test_per_row_parameters_reach_their_rows(generation_stub, server_stub):
    base = dict(max_tokens=30, temperature=0, ignore_eos=True)
    requests = [
        prompt_request("The river ran", **base),
        prompt_request("The river ran", presence_penalty=2.0, **base),
        prompt_request("The river ran", repetition_penalty=1.8, **base),
        prompt_request("The river ran", frequency_penalty=-2.0, **base),
        prompt_request("The river ran", max_tokens=7, temperature=0),
    ]
    alone = [texts_of(generation_stub, r) for r in requests]
    assert len({a[0] for a in alone[:4]}) == 4, "the penalties should change the greedy text"
    with MaxRunningRows(server_stub) as rows:
        batched = concurrently(generation_stub, requests, stagger=0)
    assert rows.value >= 3
    assert batched == alone


def test_stop_and_lengths_per_row(client):
    base = dict(model=MODEL, prompt="The river ran", temperature=0,
                extra_body={"ignore_eos": True})
    full = client.completions.create(max_tokens=30, **base).choices[0].text
    stop = full.split()[4]

    def one(kind):
        if kind == "stop":
            return client.completions.create(max_tokens=30, stop=stop, **base).choices[0]
        return client.completions.create(max_tokens=5, **base).choices[0]

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, ["stop", "len"] * 3))
    for choice in results[0::2]:
        assert choice.text == full[: full.index(stop)] and choice.finish_reason == "stop"
    for choice in results[1::2]:
        assert choice.finish_reason == "length"


def test_cancelling_one_row_leaves_the_others_untouched(generation_stub, server_stub):
    keep = GREEDY[:3]
    alone = [texts_of(generation_stub, r) for r in keep]
    victim = generation_stub.Generate(
        prompt_request("The market", max_tokens=500, temperature=0, ignore_eos=True))
    next(victim)
    next(victim)

    def cancel_later():
        threading.Event().wait(0.1)
        victim.cancel()

    canceller = threading.Thread(target=cancel_later)
    canceller.start()
    batched = concurrently(generation_stub, keep, stagger=0)
    canceller.join()
    assert victim.code() == grpc.StatusCode.CANCELLED
    assert batched == alone


def test_penalised_rows_joining_and_leaving_unpenalised_ones_keep_their_text(
        generation_stub, server_stub):
    """A lane tracks token counts only while a row has a penalty: a penalised
    row joins a lane that tracked none, an unpenalised one joins it, the
    penalised row leaves (the counts go), and another penalised row joins.
    Staggered so that each joins a running lane; every text equals its own."""
    base = dict(temperature=0, ignore_eos=True)
    requests = [
        prompt_request("The river ran", max_tokens=240, **base),
        prompt_request("Cats sleep most of the day.", max_tokens=70, presence_penalty=2.0,
                       **base),
        prompt_request("Tell me a story.", max_tokens=90, **base),
        prompt_request("The lighthouse keeper", max_tokens=40, repetition_penalty=1.8, **base),
    ]
    alone = [texts_of(generation_stub, r) for r in requests]
    unpenalised = texts_of(generation_stub, prompt_request(
        "Cats sleep most of the day.", max_tokens=70, **base))
    assert unpenalised != alone[1], "the penalty should change the greedy text"
    with MaxRunningRows(server_stub) as rows:
        batched = concurrently(generation_stub, requests, stagger=0.08)
    assert rows.value >= 2, "the requests did not share the batch"
    assert batched == alone


def test_seeded_text_does_not_depend_on_other_traffic(generation_stub, server_stub):
    seeded = chat_request("Tell me a story.", max_tokens=30, seed=77, n=2)
    alone = texts_of(generation_stub, seeded)
    noise = [prompt_request(f"noise {i}", max_tokens=40, ignore_eos=True) for i in range(4)]
    with MaxRunningRows(server_stub) as rows:
        results = concurrently(generation_stub, [*noise, seeded], stagger=0.01)
    assert rows.value >= 3
    assert results[-1] == alone


def test_prefix_cache_reuse_is_reported_and_changes_nothing(client):
    system = ("You are the keeper of a quiet lighthouse on a rocky coast. You answer every "
              "question briefly, kindly and with care, and you never forget the weather. "
              f"Session {random.random()}.")

    def ask(question):
        return client.chat.completions.create(
            model=MODEL, temperature=0, max_tokens=20,
            messages=[{"role": "system", "content": system},
                      {"role": "user", "content": question}])

    cold = ask("What do you see tonight?")
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    warm = ask("What do you see tonight?")
    cached = warm.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached % 16 == 0 and cached < warm.usage.prompt_tokens
    assert warm.choices[0].message.content == cold.choices[0].message.content
    # Another question after the same system prompt reuses the shared part.
    other = ask("Is the sea calm?")
    assert other.usage.prompt_tokens_details.cached_tokens >= 16


def test_inference_health_reports_the_backend(stack):
    from tests.http_helpers import request

    reply, content = request(stack.http_port, "GET", "/api/health/inference")
    assert reply.status == 200
    import json

    body = json.loads(content)
    assert body["backend"] == "transformers/continuous-batching"
    assert body["model"] == MODEL
    assert body["max_batch"] == 64 and body["max_queued"] == 256
    assert isinstance(body["kv_tokens_in_use"], int)


def test_mixed_load_with_disconnects_leaks_nothing(generation_stub, server_stub):
    rng = random.Random(2026)
    before = wait_until(lambda: (s := inference_status(server_stub)).active_generations == 0
                        and s)

    def one(i):
        r = random.Random(i)
        kind = r.choice(["chat", "prompt", "prompts"])
        sampling = dict(max_tokens=r.randint(1, 40), n=r.choice([1, 1, 2, 3]),
                        temperature=r.choice([0, 0.7, 1.0]))
        if r.random() < 0.3:
            sampling["seed"] = r.randint(0, 1000)
        if r.random() < 0.3:
            sampling["stop"] = ["e"]
        if kind == "chat":
            request = chat_request(f"Question {i}?", **sampling)
        elif kind == "prompt":
            request = prompt_request(f"The river {i}", **sampling)
        else:
            request = prompt_request("The market", f"Cats {i}", **sampling)
        call = generation_stub.Generate(request, timeout=120)
        leave_after = r.randint(0, 6) if r.random() < 0.35 else None
        received = 0
        try:
            for _ in call:
                received += 1
                if leave_after is not None and received > leave_after:
                    call.cancel()
                    break
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.CANCELLED
        return call

    order = list(range(200))
    rng.shuffle(order)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(one, order))
    after = wait_until(lambda: (s := inference_status(server_stub)).active_generations == 0
                       and s.queued_requests == 0 and s)
    assert after, inference_status(server_stub)
    assert after.running_rows == 0 and after.lanes == 0
    assert after.kv_tokens_in_use == 0 and after.kv_padding_tokens == 0
    assert after.failed_generations_total == before.failed_generations_total
    ended = (after.completed_generations_total + after.cancelled_generations_total) - (
        before.completed_generations_total + before.cancelled_generations_total)
    assert ended == 200


@pytest.fixture(scope="module")
def tiny_queue_stack(tmp_path_factory):
    from tests import harness

    tmp = tmp_path_factory.mktemp("queue")
    engine, grpc_port = harness.start_engine(tmp, MILLM_MAX_BATCH="1", MILLM_MAX_QUEUED="1")
    bridge = None
    try:
        harness.wait_serving(engine, grpc_port)
        bridge, http_port = harness.start_bridge(tmp, grpc_port)
        harness.wait_http(bridge, f"http://127.0.0.1:{http_port}/readyz")
        yield grpc_port, http_port
    finally:
        if bridge is not None:
            bridge.stop()
        engine.stop()


def test_queue_full_is_503_with_retry_after(tiny_queue_stack):
    from millm.v1 import generation_service_pb2_grpc, server_service_pb2_grpc
    from tests.grpc_helpers import error_info
    from tests.http_helpers import post

    grpc_port, http_port = tiny_queue_stack
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        status = server_service_pb2_grpc.ServerServiceStub(channel)
        long = dict(max_tokens=900, temperature=0, ignore_eos=True)
        running = stub.Generate(prompt_request("The river", **long))
        next(running)
        assert wait_until(lambda: inference_status(status).running_rows == 1)
        waiting = stub.Generate(prompt_request("The market", **long))
        next(waiting)  # metadata: accepted into the queue
        assert inference_status(status).queued_requests == 1
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Generate(prompt_request("Cats", **long), timeout=30))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_info(err.value).reason == "queue_full"
        reply, content = post(http_port, "/v1/completions",
                              {"model": MODEL, "prompt": "x", "max_tokens": 2})
        assert reply.status == 503
        assert reply.getheader("retry-after") == "1"
        import json

        assert json.loads(content)["error"]["code"] == "queue_full"
        # The waiting request's caller leaves: it is dropped without running.
        waiting.cancel()
        assert wait_until(lambda: inference_status(status).queued_requests == 0)
        running.cancel()
        final = wait_until(lambda: (s := inference_status(status)).active_generations == 0 and s)
        assert final.cancelled_generations_total == 2


def test_padded_prefill_of_different_lengths_equals_alone(generation_stub):
    """Prompts of one request are prefilled together, left-padded to the longest."""
    prompts = ["A", "The river ran quietly past the old mill, and the miller", "Cats sleep"]
    together = texts_of(generation_stub, prompt_request(*prompts, max_tokens=20, temperature=0,
                                                        ignore_eos=True))
    for i, prompt in enumerate(prompts):
        alone = texts_of(generation_stub, prompt_request(prompt, max_tokens=20, temperature=0,
                                                         ignore_eos=True))
        assert together[i] == alone[0], prompt
