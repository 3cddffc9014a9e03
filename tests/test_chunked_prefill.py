"""Chunked prefill (engines/transformers/prefill.py): a long prompt is read a
chunk per scheduler turn, between the running streams' decode steps.

Two engines from the same checkpoint: chunks of 16 prompt tokens, and chunks
larger than the window (a prompt in one forward pass, as before chunking).
Counts of tokens, not timings: how many tokens a running stream receives
between a long request's sending and its first token; and outputs compared
token for token between the two engines.
"""

from __future__ import annotations

import concurrent.futures
import threading

import grpc
import pytest

from millm.v1 import generation_service_pb2_grpc
from tests.grpc_helpers import prompt_request, run
from tests.harness import start_engine, wait_serving

CHUNK = 16


def long_text(rules: int = 45, topic: str = "lamp") -> str:
    """About 20 tokens a rule with the demo tokenizer: 45 rules make a prompt
    of about 890 tokens."""
    return " ".join(f"Rule {i}: the keeper lights {topic} {i} at dusk and logs ship {i * 7}."
                    for i in range(rules))


class _Engine:
    def __init__(self, tmp, chunk: int):
        self.proc, port = start_engine(tmp, MILLM_PREFILL_CHUNK_TOKENS=str(chunk))
        wait_serving(self.proc, port)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = generation_service_pb2_grpc.GenerationServiceStub(self.channel)

    def close(self):
        self.channel.close()
        self.proc.stop()


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    chunked = _Engine(tmp_path_factory.mktemp("chunked"), CHUNK)
    whole = _Engine(tmp_path_factory.mktemp("whole"), 100_000)
    yield chunked, whole
    chunked.close()
    whole.close()


def stream_beside_long(engine: _Engine, long_request) -> tuple[int, list[int]]:
    """A greedy stream runs; once it has 10 tokens, `long_request` is sent.
    Returns (tokens the stream received between the long request's sending
    and its first token, the long request's tokens)."""
    got = []  # the stream's token count, as each response arrives
    lock = threading.Lock()
    started, sent, first = threading.Event(), threading.Event(), threading.Event()
    marks: dict = {}
    stream = engine.stub.Generate(prompt_request("Stream", max_tokens=1000, temperature=0,
                                                 ignore_eos=True), timeout=120)

    def read_stream():
        for response in stream:
            with lock:
                got.append(sum(len(c.token_ids) for c in response.choices))
                if sum(got) >= 10:
                    started.set()
                if first.is_set() and "first" not in marks:
                    marks["first"] = sum(got)
                if sent.is_set() and "sent" not in marks:
                    marks["sent"] = sum(got)

    tokens: list[int] = []

    def read_long():
        for response in engine.stub.Generate(long_request, timeout=120):
            for choice in response.choices:
                if choice.token_ids and not first.is_set():
                    with lock:
                        marks["first"] = sum(got)
                    first.set()
                tokens.extend(choice.token_ids)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        reader = pool.submit(read_stream)
        assert started.wait(60)
        with lock:
            marks["sent"] = sum(got)
        sent.set()
        pool.submit(read_long).result()
        stream.cancel()
        reader.exception()
    return marks["first"] - marks["sent"], tokens


def test_a_running_stream_keeps_its_pace_while_a_long_prompt_is_read(engines):
    chunked, whole = engines
    request = prompt_request(long_text(), max_tokens=8, temperature=0, ignore_eos=True)
    prompt_tokens = run(chunked.stub, request)[4].prompt_tokens
    assert prompt_tokens > 800  # about 53 chunks of 16
    during_chunked, chunked_tokens = stream_beside_long(chunked, prompt_request(
        long_text(topic="torch"), max_tokens=8, temperature=0, ignore_eos=True))
    during_whole, whole_tokens = stream_beside_long(whole, prompt_request(
        long_text(topic="torch"), max_tokens=8, temperature=0, ignore_eos=True))
    # One decode step per chunk: the stream got a token for most of the ~53
    # chunks, where a prompt read in one pass let it have at most a few.
    print(f"stream tokens while the long prompt was read: chunked {during_chunked}, "
          f"one pass {during_whole}")
    assert during_chunked >= 30, (during_chunked, during_whole)
    assert during_whole <= 10, (during_chunked, during_whole)
    # Reading it in chunks beside a stream changed none of its tokens.
    assert chunked_tokens == whole_tokens and len(chunked_tokens) == 8


def test_chunked_output_equals_one_pass_output(engines):
    chunked, whole = engines
    for prompt in (long_text(12, "bell"), "A short one", long_text(3, "horn")):
        request = prompt_request(prompt, max_tokens=24, temperature=0, ignore_eos=True)
        assert run(chunked.stub, request)[2] == run(whole.stub, request)[2], prompt[:20]


def test_several_prompts_of_one_request_prefilled_in_chunks_equal_one_pass(engines):
    """Left-padded groups prefilled together, a chunk of columns at a time."""
    chunked, whole = engines
    request = prompt_request(long_text(4, "kite"), "Cats sleep", long_text(2, "oar"),
                             max_tokens=16, temperature=0, ignore_eos=True)
    assert run(chunked.stub, request)[2] == run(whole.stub, request)[2]


def test_the_next_turn_reuses_the_long_prefix(engines):
    chunked, whole = engines
    system = long_text(38, "beacon")
    first = prompt_request(system + " Question: what is rule 3?", max_tokens=12,
                           temperature=0, ignore_eos=True)
    second = prompt_request(system + " Question: and rule 9?", max_tokens=12, temperature=0,
                            ignore_eos=True)
    for engine in (chunked, whole):
        assert run(engine.stub, first)[4].cached_tokens == 0
    _, _, tokens, _, usage, _ = run(chunked.stub, second)
    assert usage.prompt_tokens > 700
    # Every full 16-token block of the shared part came from the cache.
    assert usage.cached_tokens >= usage.prompt_tokens - 40, usage
    # Starting after the cached part changes nothing: the same tokens as the
    # engine that reads its whole prompt in one pass (from its own cache).
    assert tokens == run(whole.stub, second)[2]


def test_a_seeded_long_prompt_gives_the_same_text_beside_traffic(engines):
    """A seeded prompt's chunks are cut at the same columns whatever runs beside it."""
    chunked, _ = engines
    request = prompt_request(long_text(20, "flare"), max_tokens=16, temperature=1.0, seed=11,
                             ignore_eos=True)
    alone = run(chunked.stub, request)[2][0]
    during, beside = stream_beside_long(chunked, request)
    assert during >= 20  # it was read in chunks while the stream ran
    assert beside == alone and len(alone) == 16
