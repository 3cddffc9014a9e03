"""Continuous batching on the GGUF engine (engines/gguf/batch.py): concurrent
requests share llama.cpp decode steps, each still gets the tokens it gets
alone, seeded requests decode in lanes of their own beside the others and keep
their text, and a caller who leaves frees its slot while the others go on.
Functional checks over gRPC, not timings: progress is counted in tokens."""

from __future__ import annotations

import threading

import grpc
import pytest

from millm.v1 import generation_service_pb2_grpc, server_service_pb2_grpc
from tests import harness
from tests.conftest import inference_status as status
from tests.conftest import wait_until
from tests.grpc_helpers import MaxRunningRows, concurrently, prompt_request, run

PROMPTS = ["The river ran past the mill and", "Cats sleep most of the day.",
           "Tell me a story about the sea.", "A", "The lighthouse keeper wrote",
           "In the morning the market", "Gardens need patience", "The train left the station"]


@pytest.fixture(scope="module", params=["millm-tiny-gguf:F32", "millm-tiny-gguf:Q8_0"])
def engine(request, tmp_path_factory):
    process, port = harness.start_engine(tmp_path_factory.mktemp("gguf-batching"),
                                         MILLM_MODEL=request.param)
    try:
        harness.wait_serving(process, port)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield (request.param, generation_service_pb2_grpc.GenerationServiceStub(channel),
                   server_service_pb2_grpc.ServerServiceStub(channel))
    finally:
        process.stop()


def greedy(model: str, text: str, tokens: int, **extra):
    return prompt_request(text, model=model, max_tokens=tokens, temperature=0, ignore_eos=True,
                          **extra)


def together(stub, server, requests, stagger: float = 0.02) -> tuple[list[dict], int]:
    """Run requests at once (staggered so they join at different steps):
    their token ids, and the most rows seen running together."""
    with MaxRunningRows(server) as rows:
        answers = concurrently(stub, requests, stagger, tokens=True)
    return answers, rows.value


def test_the_engine_says_it_batches(engine):
    _, _, server = engine
    reply = status(server)
    assert (reply.backend, reply.max_batch) == ("gguf/continuous-batching", 8)


def test_concurrent_requests_share_steps_and_answer_as_alone(engine):
    model, stub, server = engine
    # Long enough that they overlap for a while on a fast, loaded machine: the
    # status poll that sees them together is answered by the engine's event
    # loop between the model thread's turns.
    requests = [greedy(model, text, 240 + 3 * i) for i, text in enumerate(PROMPTS)]
    alone = [run(stub, r)[2] for r in requests]
    answers, peak = together(stub, server, requests, stagger=0.002)
    assert peak >= 4
    assert answers == alone
    assert all(len(a[0]) == 240 + 3 * i for i, a in enumerate(answers))


def test_more_requests_than_slots_wait_for_one(engine):
    model, stub, server = engine
    requests = [greedy(model, PROMPTS[i % len(PROMPTS)], 40) for i in range(20)]
    answers, peak = together(stub, server, requests, stagger=0)
    assert peak == 8  # every slot in use while the others waited, and never more
    assert [len(a[0]) for a in answers] == [40] * 20
    assert answers[0] == answers[8] == answers[16]  # the same prompt, the same tokens


def seeded_request(model: str, text: str, tokens: int, seed: int):
    return prompt_request(text, model=model, max_tokens=tokens, temperature=1.0, seed=seed,
                          ignore_eos=True)


def test_a_seeded_request_repeats_itself_beside_other_traffic(engine):
    model, stub, server = engine
    seeded = seeded_request(model, PROMPTS[2], 60, seed=11)
    first = run(stub, seeded)[2]
    busy = [greedy(model, text, 60) for text in PROMPTS[:5]]
    with MaxRunningRows(server) as seen:
        answers = concurrently(stub, [*busy[:3], seeded, *busy[3:]], 0.005, tokens=True)
    assert answers[3] == first
    assert seen.lanes >= 2  # it ran in a lane of its own beside the shared batch


def test_seeded_requests_side_by_side_each_keep_their_text(engine):
    model, stub, server = engine
    seeded = [seeded_request(model, text, 80, seed=20 + i) for i, text in enumerate(PROMPTS[:3])]
    alone = [run(stub, r)[2] for r in seeded]
    busy = [greedy(model, text, 80) for text in PROMPTS[3:7]]
    mixed = [seeded[0], busy[0], seeded[1], busy[1], seeded[2], busy[2], busy[3]]
    with MaxRunningRows(server) as seen:
        answers = concurrently(stub, mixed, 0.005, tokens=True)
    assert [answers[0], answers[2], answers[4]] == alone
    assert seen.lanes >= 3  # the shared batch and at least two seeded lanes at once
    assert [len(a[0]) for a in answers] == [80] * 7


def test_a_short_request_beside_a_long_seeded_one_finishes_long_before_it(engine):
    model, stub, server = engine
    stream = stub.Generate(seeded_request(model, PROMPTS[2], 900, seed=11), timeout=60)
    next(stream)  # metadata
    received = [len(next(stream).choices[0].token_ids)]  # its first token: it runs

    def read():
        for response in stream:
            received.extend(len(d.token_ids) for d in response.choices)

    reader = threading.Thread(target=read)
    reader.start()
    short = run(stub, greedy(model, PROMPTS[0], 4))
    seeded_so_far = sum(received)
    reader.join()
    assert len(short[2][0]) == 4
    assert sum(received) == 900
    # Admission went on: the short request was done before the seeded one was
    # half way (while seeded requests ran alone, it waited for all 900 tokens).
    assert seeded_so_far < 450


def test_a_caller_who_leaves_frees_its_slot(engine):
    model, stub, server = engine
    long_one = greedy(model, PROMPTS[0], 400)
    others = [greedy(model, text, 40) for text in PROMPTS[1:4]]
    before = status(server).cancelled_generations_total
    stream = stub.Generate(long_one, timeout=60)
    next(stream)  # admitted: its metadata came back
    answers, _ = together(stub, server, others)
    stream.cancel()
    assert [len(a[0]) for a in answers] == [40, 40, 40]
    reply = wait_until(lambda: (r := status(server)).running_rows == 0
                       and r.cancelled_generations_total == before + 1 and r) or status(server)
    assert (reply.running_rows, reply.cancelled_generations_total) == (0, before + 1)
