"""Fair admission (engines/transformers/scheduler.py): a request that does not
fit the free rows no longer blocks the small ones behind it, until it has
waited MILLM_ADMISSION_AGING_S; one request holds at most
MILLM_MAX_ROWS_PER_REQUEST rows and runs a larger n in parts; a request may
ask for at most MAX_REQUEST_ROWS choices.

Orders of events, not timings: each engine of its own, with a small batch so
the "big" request cannot fit beside the long streams.
"""

from __future__ import annotations

import concurrent.futures
import time

import grpc
import pytest

from millm.v1 import generation_pb2, generation_service_pb2_grpc, server_service_pb2_grpc
from service.engines.transformers.prefix_cache import BLOCK_TOKENS
from service.requests.generation import MAX_REQUEST_ROWS
from tests.conftest import inference_status, wait_until
from tests.grpc_helpers import error_info, prompt_request, run
from tests.harness import start_engine, wait_serving

LONG = dict(max_tokens=400, temperature=0, ignore_eos=True)


class _Engine:
    def __init__(self, tmp, **env):
        self.proc, port = start_engine(tmp, **{"MILLM_MAX_BATCH": "16", **env})
        wait_serving(self.proc, port)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = generation_service_pb2_grpc.GenerationServiceStub(self.channel)
        self.server = server_service_pb2_grpc.ServerServiceStub(self.channel)

    def close(self):
        self.channel.close()
        self.proc.stop()


@pytest.fixture
def engine_factory(tmp_path):
    made = []

    def make(**env):
        folder = tmp_path / str(len(made))
        folder.mkdir()
        made.append(_Engine(folder, **env))
        return made[-1]

    yield make
    for engine in made:
        engine.close()


def _timeline(stub, request, marks: dict, name: str) -> None:
    """Stream `request`; note when its first choice arrived and when it ended."""
    for response in stub.Generate(request, timeout=120):
        if response.choices and f"{name}.first" not in marks:
            marks[f"{name}.first"] = time.monotonic()
    marks[f"{name}.end"] = time.monotonic()


def _scenario(engine, big_tokens: int = 150) -> dict:
    """Four long streams hold 4 of 16 rows; a request needing all 16 arrives,
    then a 2-token one."""
    marks: dict = {}
    stub = engine.stub
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        streams = [pool.submit(_timeline, stub, prompt_request(f"Stream {i}", **LONG), marks,
                               f"s{i}") for i in range(4)]
        assert wait_until(lambda: sum(k.endswith(".first") for k in marks) == 4, 30, 0.01)
        big = pool.submit(_timeline, stub, prompt_request("Big", n=16, max_tokens=big_tokens,
                                                          temperature=1.0), marks, "big")
        # The big request is queued and cannot fit (whole, or past its share).
        assert wait_until(lambda: inference_status(engine.server).queued_requests >= 1, 30)
        small = pool.submit(_timeline, stub, prompt_request("Small", max_tokens=2,
                                                            temperature=0), marks, "small")
        for future in [*streams, big, small]:
            future.result()
    return marks


def test_a_small_request_passes_one_that_does_not_fit(engine_factory):
    engine = engine_factory(MILLM_MAX_ROWS_PER_REQUEST="16")
    marks = _scenario(engine)
    # The small request was served while the big one still waited for rows.
    assert marks["small.end"] < marks["big.first"]
    assert marks["small.end"] < min(marks[f"s{i}.end"] for i in range(4))


def test_once_aged_a_waiting_request_is_passed_by_nobody(engine_factory):
    engine = engine_factory(MILLM_MAX_ROWS_PER_REQUEST="16", MILLM_ADMISSION_AGING_S="0")
    marks = _scenario(engine)
    # No passing: the small request waited for the big one to start.
    assert marks["small.first"] > marks["big.first"]


def test_a_request_holds_its_share_and_runs_a_larger_n_in_parts(engine_factory):
    engine = engine_factory()  # share: half of 16 rows
    marks = _scenario(engine, big_tokens=500)  # two parts of 500 tokens: long after a 2-token one
    # The big request started at once with its share, and the small one was
    # admitted beside it rather than waiting for it to end.
    assert marks["big.first"] < marks["s0.end"]
    assert marks["small.end"] < marks["big.end"]


def test_parts_answer_every_choice_once_and_stay_reproducible(engine_factory):
    stub = engine_factory().stub
    request = prompt_request("Once upon a time", n=20, max_tokens=8, temperature=1.0, seed=7,
                             ignore_eos=True)
    _, texts, tokens, finish, usage, _ = run(stub, request)
    assert sorted(texts) == list(range(20))
    assert all(finish[i] == generation_pb2.FINISH_REASON_LENGTH for i in range(20))
    assert usage.completion_tokens == 20 * 8
    again = run(stub, request)[1]
    assert again == texts  # seeded: the same split, the same text
    assert len(set(texts.values())) > 1


def test_prompt_tokens_and_cache_hits_count_a_split_prompt_once(engine_factory):
    """n=20 runs in three parts (8 rows each by default), each starting from the
    prompt's cached blocks; usage counts the prompt, and its cache hits, once."""
    stub = engine_factory().stub
    prompt = ("The lighthouse keeper climbed the stairs every evening to light the lamp "
              "and watch the ships pass the rocks below the cliffs of the northern coast")
    one = run(stub, prompt_request(prompt, max_tokens=1, temperature=0))[4]
    assert one.prompt_tokens > 2 * BLOCK_TOKENS
    assert one.cached_tokens == 0  # a fresh engine: nothing cached before
    many = run(stub, prompt_request(prompt, n=20, max_tokens=3, temperature=1.0))[4]
    again = run(stub, prompt_request(prompt, max_tokens=1, temperature=0))[4]
    assert many.prompt_tokens == one.prompt_tokens
    # Every full block but the one holding the last prompt token came from the cache,
    # counted once for the three parts: the same as an n=1 rerun.
    reusable = (one.prompt_tokens - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    assert many.cached_tokens == again.cached_tokens == reusable


def test_a_request_asking_for_too_many_choices_is_refused_naming_the_field(engine_factory):
    stub = engine_factory().stub
    prompts = [f"p{i}" for i in range(MAX_REQUEST_ROWS // 128 + 1)]
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Generate(prompt_request(*prompts, n=128, max_tokens=1), timeout=60))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(caught.value)
    assert (info.reason, info.metadata["param"]) == ("invalid_parameter", "n")
    # The same prompts at n=1 are fine, as is echo-free scoring of many prompts.
    _, texts, *_ = run(stub, prompt_request(*prompts, max_tokens=1, temperature=0))
    assert len(texts) == len(prompts)

