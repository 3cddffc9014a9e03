"""Priority (engines/admission.py): a waiting request with a lower `priority`
starts first, and background work (priority above 0, a batch's lines) never
takes the last MILLM_PRIORITY_RESERVE rows, so a request at 0 arriving beside
a full batch of it starts at once. Orders of events, not timings, on engines
of their own with small batches; the same rule on both engines."""

from __future__ import annotations

import concurrent.futures

import grpc
import pytest

from tests.conftest import MODEL, inference_status, wait_until
from tests.grpc_helpers import prompt_request
from tests.http_helpers import call
from tests.test_fair_admission import _Engine, _timeline

GGUF = "millm-tiny-gguf:Q8_0"
LONG = dict(max_tokens=300, temperature=0, ignore_eos=True)


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


def _beside_background(engine, model: str, rows: int) -> dict:
    """`rows` + 2 background streams (priority 1) arrive, then one request at
    priority 0 once some of them wait."""
    marks: dict = {}
    stub = engine.stub
    with concurrent.futures.ThreadPoolExecutor(rows + 3) as pool:
        background = [pool.submit(_timeline, stub, prompt_request(
            f"Background {i}", model=model, priority=1, **LONG), marks, f"b{i}")
            for i in range(rows + 2)]
        assert wait_until(lambda: inference_status(engine.server).queued_requests >= 2, 60)
        assert wait_until(lambda: sum(k.endswith(".first") for k in marks) >= rows - 1, 60)
        small = pool.submit(_timeline, stub, prompt_request("Now", model=model, max_tokens=2,
                                                            temperature=0), marks, "small")
        for future in [*background, small]:
            future.result()
    marks["background_first_end"] = min(marks[f"b{i}.end"] for i in range(rows + 2))
    return marks


@pytest.mark.parametrize("model", [MODEL, GGUF])
def test_a_request_beside_a_full_batch_of_background_work_starts_at_once(engine_factory,
                                                                         model):
    engine = engine_factory(MILLM_MODEL=model, MILLM_MAX_BATCH="4", MILLM_GGUF_SLOTS="4")
    marks = _beside_background(engine, model, 4)
    # Served on the reserved row while every background stream still ran.
    assert marks["small.end"] < marks["background_first_end"]


def test_without_a_reserve_it_waits_for_a_background_row(engine_factory):
    """The test above can fail: with no reserve the batch is full of
    background rows, and the request (first in line) waits for one to end."""
    engine = engine_factory(MILLM_MAX_BATCH="4", MILLM_PRIORITY_RESERVE="0")
    marks = _beside_background(engine, MODEL, 4)
    assert marks["small.first"] > marks["background_first_end"]


def test_a_lower_priority_value_starts_first_whatever_came_first(engine_factory):
    """Two streams fill both rows; a request at priority 5 queues, then one at
    0: when a row frees, the one at 0 starts first, though the other waited
    longer (past the aging time, which orders within a priority only)."""
    engine = engine_factory(MILLM_MAX_BATCH="2", MILLM_PRIORITY_RESERVE="0",
                            MILLM_ADMISSION_AGING_S="0")
    marks: dict = {}
    stub = engine.stub
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        streams = [pool.submit(_timeline, stub, prompt_request(f"Stream {i}", **LONG), marks,
                               f"s{i}") for i in range(2)]
        assert wait_until(lambda: sum(k.endswith(".first") for k in marks) == 2, 60, 0.01)
        late = pool.submit(_timeline, stub, prompt_request("Later", priority=5, max_tokens=2,
                                                           temperature=0), marks, "later")
        assert wait_until(lambda: inference_status(engine.server).queued_requests >= 1, 30)
        urgent = pool.submit(_timeline, stub, prompt_request("Urgent", priority=0, max_tokens=2,
                                                             temperature=0), marks, "urgent")
        assert wait_until(lambda: inference_status(engine.server).queued_requests >= 2, 30)
        for future in [*streams, late, urgent]:
            future.result()
    assert marks["urgent.first"] < marks["later.first"]


@pytest.mark.parametrize("value", [1_000_001, -1_000_001])
def test_a_priority_out_of_range_is_400_naming_it(stack, value):
    reply = call(stack.http_port, "POST", "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
        "priority": value})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "priority"


def test_priority_over_grpc_is_checked_by_the_engine(generation_stub):
    with pytest.raises(grpc.RpcError) as caught:
        list(generation_stub.Generate(prompt_request("Hi", max_tokens=1, priority=10**7)))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
