"""n > 1 on the GGUF engine (engines/gguf/forks.py), issue 30.

On llama.cpp itself (the runner over a real shared context, a counting
decode): a request's n choices evaluate the prompt once, each choice of a
greedy request gives the n = 1 answer from the shared cells, and one
request holds at most half the slots while another request waiting behind it
starts at once. Through the bridge with the real OpenAI SDK: `n: 3` answers
three choices, streamed and not, a seeded request's choices are reproducible
and its choice 0 is the n = 1 answer, and a constraint holds on every choice.
"""

from __future__ import annotations

import threading

import openai
import pytest
from llama_cpp import Llama
from llama_cpp import llama_cpp as lib
from llama_cpp._internals import LlamaBatch, LlamaContext

from service.engines.gguf.batch import Runner
from service.engines.gguf.forks import part_count
from service.engines.gguf.lanes import Lanes, lane_opener
from service.engines.gguf.sampling import sampler_chain
from service.engines.gguf.slots import Slots
from service.engines.gguf.vocab import token_piece
from service.generation.job import GroupDone, StepOutput
from service.requests.generation import PromptGroup, ValidatedGeneration, row_seeds
from service.sampling import SamplingOptions
from tests import harness

WINDOW, SLOTS = 512, 8
GGUF = "millm-tiny-gguf:Q8_0"
ASK = [{"role": "user", "content": "Tell me about the mill."}]


# -- the runner on llama.cpp ------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm():
    path = harness.models_dir() / "millm-tiny-gguf" / "millm-tiny-gguf-F32.gguf"
    model = Llama(model_path=str(path), n_ctx=64, n_batch=64, n_threads=1, n_threads_batch=1,
                  verbose=False)
    yield model
    model.close()


class Counting:
    """The shared context, counting the tokens each llama_decode evaluates."""

    def __init__(self, ctx):
        self._ctx, self.evaluated = ctx, 0

    def decode(self, batch) -> None:
        self.evaluated += batch.batch.n_tokens
        self._ctx.decode(batch)

    def __getattr__(self, name):
        return getattr(self._ctx, name)


class Job:
    """What the runner reads of a GenerationJob, with its events kept."""

    def __init__(self, spec: ValidatedGeneration):
        self.spec, self.cancelled, self.outcome = spec, threading.Event(), None
        self.parts, self.monitor, self.events, self.error = part_count(spec.groups), None, [], None

    def post(self, event) -> None:
        self.events.append(event)

    def stage(self, event) -> None:  # generation/job.py post_all: kept, nothing to wake
        self.events.append(event)

    def stalled(self, stall_s: float) -> bool:
        return False

    def fail_from_thread(self, error) -> None:
        self.error = error

    @property
    def done(self) -> bool:
        return sum(isinstance(e, GroupDone) for e in self.events) == self.parts

    def texts(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for event in self.events:
            if isinstance(event, StepOutput):
                for delta in event.deltas:
                    out.setdefault(delta.index, []).extend(delta.token_ids)
        return out


def spec(llm, text: str, n: int, max_tokens: int) -> ValidatedGeneration:
    prompt = tuple(llm.tokenize(text.encode(), add_bos=True))
    group = PromptGroup(prompt, n, max_tokens, 0, row_seeds(None, n))
    return ValidatedGeneration(request_id="t", model="m", groups=(group,),
                               options=SamplingOptions(temperature=0.0), stop=(), seed=None,
                               ignore_eos=True)


@pytest.fixture
def runner(llm):
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
    made = Runner(Counting(ctx), batch, 512, Slots(SLOTS, SLOTS * WINDOW), lanes, eog, tools,
                  pieces, lambda what, amount: None)
    yield made
    lanes.close()
    batch.close()
    ctx.close()


def drive(runner: Runner, jobs: list[Job], watch=None) -> None:
    for job in jobs:
        runner.add(job)
    for _ in range(500):
        runner.admit()
        if watch is not None:
            watch()
        if runner.rows:
            runner.step()
        if all(job.done for job in jobs):
            return
    raise AssertionError("the jobs did not finish")


PROMPT = "The river ran past the mill and the cats slept in the sun all day long."


def test_n_choices_evaluate_the_prompt_once(llm, runner):
    job = Job(spec(llm, PROMPT, 4, 12))
    prompt = len(job.spec.groups[0].prompt_ids)
    drive(runner, [job])
    # The prompt once, then each choice's tokens but its last (never fed back).
    assert runner.ctx.evaluated == prompt + 4 * (12 - 1)
    assert job.error is None and sorted(job.texts()) == [0, 1, 2, 3]


def test_each_greedy_choice_is_the_single_answer(llm, runner):
    alone = Job(spec(llm, PROMPT, 1, 16))
    drive(runner, [alone])
    runner.clear_idle()  # the next request reads no cached prefix: it forks
    four = Job(spec(llm, PROMPT, 4, 16))
    drive(runner, [four])
    assert [four.texts()[i] for i in range(4)] == [alone.texts()[0]] * 4


def test_one_request_holds_at_most_half_the_slots(llm, runner):
    many, small = Job(spec(llm, PROMPT, 8, 6)), Job(spec(llm, "Cats sleep.", 1, 6))
    seen = {"most": 0, "small_started": None}

    def watch() -> None:
        held = sum(row.job is many for row in runner.rows)
        seen["most"] = max(seen["most"], held)
        if seen["small_started"] is None and any(row.job is small for row in runner.rows):
            seen["small_started"] = sum(1 for e in many.events if isinstance(e, GroupDone))

    drive(runner, [many, small], watch)
    assert seen["most"] == SLOTS // 2
    assert seen["small_started"] == 0  # it started before any of the eight finished
    assert sorted(many.texts()) == list(range(8))


# -- through the bridge -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    stack = harness.OwnStack(tmp_path_factory.mktemp("gguf-choices"), MILLM_MODEL=GGUF)
    try:
        yield openai.OpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0)
    finally:
        stack.stop()


def test_n_three_answers_three_choices(client):
    reply = client.chat.completions.create(model=GGUF, messages=ASK, n=3, max_tokens=10,
                                           temperature=1.0)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    # (A sampled choice may end at once: its content is then empty.)
    assert all(c.finish_reason in ("stop", "length") for c in reply.choices), reply
    assert reply.usage.completion_tokens <= 30
    text = client.completions.create(model=GGUF, prompt=["The mill", "The sea"], n=2,
                                     max_tokens=5)
    assert [c.index for c in text.choices] == [0, 1, 2, 3]


def test_n_streams_each_choice_and_a_seed_repeats(client):
    kwargs = dict(model=GGUF, messages=ASK, n=3, max_tokens=10, temperature=1.0, seed=21)
    whole = client.chat.completions.create(**kwargs)
    texts, finished = {}, {}
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                assert choice.index not in finished
                finished[choice.index] = choice.finish_reason
    assert sorted(finished) == [0, 1, 2]
    assert [texts[i] for i in range(3)] == [c.message.content for c in whole.choices]
    single = client.chat.completions.create(**{**kwargs, "n": 1})
    assert single.choices[0].message.content == whole.choices[0].message.content
    assert len({c.message.content for c in whole.choices}) > 1  # each its own row seed


def test_a_constraint_holds_on_every_choice(client):
    reply = client.chat.completions.create(
        model=GGUF, messages=ASK, n=4, temperature=1.0,
        extra_body={"structured_outputs": {"choice": ["north", "south", "east", "west"]}})
    assert {c.message.content for c in reply.choices} <= {"north", "south", "east", "west"}
    assert len(reply.choices) == 4
