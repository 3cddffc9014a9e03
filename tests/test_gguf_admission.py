"""The engine-wide admission settings on the GGUF engine (engines/admission.py
over engines/gguf/batch.py's slots), issue 41 item 4.

On the runner over a real llama.cpp context: MILLM_MAX_ROWS_PER_REQUEST=1
runs an n = 4 request one row at a time; serial batching runs one request at
a time; a request whose cells do not fit lets a small one pass until it has
aged; MILLM_PREFIX_CACHE_TOKENS=0 reuses no prefix. Through a whole stack:
MILLM_MAX_ROWS_PER_REQUEST=1 holds an `n: 4` chat completion to one running
row, and MILLM_MAX_BATCH, MILLM_BATCHING=serial and MILLM_PREFIX_CACHE_TOKENS=0
show in the engine's status and usage.
"""

from __future__ import annotations

import grpc
import openai
import pytest
from llama_cpp import llama_cpp as lib
from llama_cpp._internals import LlamaBatch, LlamaContext

from millm.v1 import generation_service_pb2_grpc, server_service_pb2_grpc
from service.engines.admission import SchedulerLimits
from service.engines.gguf.batch import Runner
from service.engines.gguf.lanes import Lanes, lane_opener
from service.engines.gguf.sampling import sampler_chain
from service.engines.gguf.slots import Slots
from service.engines.gguf.vocab import token_piece
from service.generation.job import GroupDone
from tests import harness
from tests.conftest import inference_status
from tests.grpc_helpers import MaxRunningRows, concurrently, prompt_request, run
from tests.test_gguf_choices import PROMPT, SLOTS, WINDOW, Counting, Job, drive, llm, spec

__all__ = ["llm"]  # the llama.cpp model fixture, shared with test_gguf_choices.py

GGUF = "millm-tiny-gguf:Q8_0"


# -- the runner on llama.cpp ------------------------------------------------------------------


@pytest.fixture
def make_runner(llm):
    """Runner(limits, cells, keep_prefixes): a runner over a real shared
    context of SLOTS sequences, its slots bookkeeping `cells` cells."""
    made = []

    def make(limits: SchedulerLimits, cells: int = SLOTS * WINDOW,
             keep_prefixes: bool = True) -> Runner:
        params = lib.llama_context_params.from_buffer_copy(llm.context_params)
        params.n_ctx, params.n_batch, params.n_ubatch = SLOTS * WINDOW, 512, 512
        params.n_seq_max, params.kv_unified = SLOTS, True
        ctx = LlamaContext(model=llm._model, params=params, verbose=False)
        batch = LlamaBatch(n_tokens=512, embd=0, n_seq_max=1, verbose=False)
        n_vocab = llm.n_vocab()
        eog = frozenset(i for i in range(n_vocab) if lib.llama_vocab_is_eog(llm._model.vocab, i))

        def tools(spec, seed):
            return sampler_chain(spec.options, n_vocab, eog, seed, history=WINDOW), None, None

        lanes = Lanes(lane_opener(llm._model, llm.context_params, WINDOW))
        pieces = [token_piece(llm._model.vocab, i, special=False) for i in range(n_vocab)]
        runner = Runner(Counting(ctx), batch, 512, Slots(SLOTS, cells, False, keep_prefixes),
                        lanes, eog, tools, pieces, lambda what, amount: None, limits=limits)
        made.append((lanes, batch, ctx))
        return runner

    yield make
    for lanes, batch, ctx in made:
        lanes.close()
        batch.close()
        ctx.close()


def held_by(runner: Runner, job: Job) -> int:
    return sum(row.job is job for row in runner.rows)


def test_one_row_per_request_runs_n_four_one_choice_at_a_time(llm, make_runner):
    runner = make_runner(SchedulerLimits(max_rows_per_request=1))
    four, other = Job(spec(llm, PROMPT, 4, 6)), Job(spec(llm, "Cats sleep.", 1, 6))
    most = {"four": 0, "together": 0}

    def watch() -> None:
        most["four"] = max(most["four"], held_by(runner, four))
        most["together"] = max(most["together"], len(runner.rows))

    drive(runner, [four, other], watch)
    assert most["four"] == 1
    assert most["together"] == 2  # the other request ran beside it
    assert sorted(four.texts()) == [0, 1, 2, 3] and four.error is None


def test_serial_batching_runs_one_request_at_a_time(llm, make_runner):
    runner = make_runner(SchedulerLimits(serial=True))
    first, second = Job(spec(llm, PROMPT, 3, 5)), Job(spec(llm, "Cats sleep.", 1, 5))
    overlap = {"jobs": 0, "first": 0}

    def watch() -> None:
        overlap["jobs"] = max(overlap["jobs"], len({id(row.job) for row in runner.rows}))
        overlap["first"] = max(overlap["first"], held_by(runner, first))

    drive(runner, [first, second], watch)
    assert overlap == {"jobs": 1, "first": 3}  # all its choices at once, nobody beside it
    assert second.done and sorted(second.texts()) == [0]


def _aging(llm, make_runner, aging_s: float) -> dict:
    """A long row holds a third of 300 cells; a request whose cells cannot fit
    beside it waits, and a small one arrives behind it: when each started."""
    runner = make_runner(SchedulerLimits(aging_s=aging_s), cells=300)
    long, big = Job(spec(llm, PROMPT, 1, 100)), Job(spec(llm, PROMPT, 1, 250))
    small = Job(spec(llm, "Cats sleep.", 1, 4))
    steps, started = [0], {}

    def watch() -> None:
        steps[0] += 1
        for name, job in (("long", long), ("big", big), ("small", small)):
            if name not in started and held_by(runner, job):
                started[name] = steps[0]
        if long.done and "long_done" not in started:
            started["long_done"] = steps[0]

    drive(runner, [long, big, small], watch)
    assert all(job.done and job.error is None for job in (long, big, small))
    return started


def test_a_request_whose_cells_do_not_fit_is_passed_until_it_has_aged(llm, make_runner):
    young = _aging(llm, make_runner, aging_s=60.0)
    assert young["small"] == young["long"] < young["big"]  # the small one passed it
    aged = _aging(llm, make_runner, aging_s=0.0)
    assert aged["big"] <= aged["small"]  # once aged, nobody passes it
    assert aged["small"] > aged["long"]


def test_no_prefix_reuse_when_the_prefix_cache_is_off(llm, make_runner):
    for keep, reused in ((True, True), (False, False)):
        runner = make_runner(SchedulerLimits(), keep_prefixes=keep)
        drive(runner, [Job(spec(llm, PROMPT, 1, 4))])
        evaluated = runner.ctx.evaluated
        again = Job(spec(llm, PROMPT, 1, 4))
        drive(runner, [again])
        prompt = len(again.spec.groups[0].prompt_ids)
        done = next(e for e in again.events if isinstance(e, GroupDone))
        assert (done.cached_tokens > 0) is reused
        assert runner.ctx.evaluated - evaluated == prompt - done.cached_tokens + 3
        assert (runner.slots.idle_tokens() > 0) is keep


# -- through a whole stack --------------------------------------------------------------------


def test_one_row_per_request_holds_an_n_four_completion_to_one_row(tmp_path):
    """The acceptance check: MILLM_MAX_ROWS_PER_REQUEST=1 on a GGUF model."""
    stack = harness.OwnStack(tmp_path, MILLM_MODEL=GGUF, MILLM_MAX_ROWS_PER_REQUEST="1")
    try:
        client = openai.OpenAI(base_url=stack.base_url + "/v1", api_key="unused",
                               max_retries=0, timeout=120)
        with grpc.insecure_channel(stack.grpc_target) as channel:
            server = server_service_pb2_grpc.ServerServiceStub(channel)
            with MaxRunningRows(server) as rows:
                reply = client.completions.create(
                    model=GGUF, prompt="The river ran past the mill and", n=4, max_tokens=40,
                    temperature=1.0, extra_body={"ignore_eos": True})
            assert rows.value == 1
    finally:
        stack.stop()
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert reply.usage.completion_tokens == 4 * 40


def test_max_batch_serial_and_no_prefix_cache_apply_to_gguf(tmp_path):
    process, port = harness.start_engine(tmp_path, MILLM_MODEL=GGUF, MILLM_MAX_BATCH="2",
                                         MILLM_BATCHING="serial", MILLM_PREFIX_CACHE_TOKENS="0")
    try:
        harness.wait_serving(process, port)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
            server = server_service_pb2_grpc.ServerServiceStub(channel)
            status = inference_status(server)
            assert (status.backend, status.max_batch) == ("gguf/serial", 2)
            greedy = prompt_request(PROMPT, model=GGUF, max_tokens=30, temperature=0,
                                    ignore_eos=True)
            with MaxRunningRows(server) as alone:
                answers = concurrently(stub, [greedy, greedy], stagger=0.01)
            assert alone.value == 1 and answers[0] == answers[1]  # one request at a time
            four = prompt_request(PROMPT, model=GGUF, n=4, max_tokens=30, temperature=1.0,
                                  ignore_eos=True)
            with MaxRunningRows(server) as rows:
                assert sorted(run(stub, four)[1]) == [0, 1, 2, 3]
            assert rows.value == 2  # serial: all the batch, and the batch is MILLM_MAX_BATCH
            assert run(stub, greedy)[4].cached_tokens == 0  # no prefix reused
            assert inference_status(server).prefix_cache_tokens == 0
    finally:
        process.stop()
