"""Seeded lanes on the GGUF engine (engines/gguf/lanes.py), on llama.cpp itself:
a sequence decoded in a lane gives bit-identical logits whatever the shared
context does between its steps, and so does a lane that was emptied and
kept for the next seeded group. (In the shared context the same traffic
moved them by up to 1.4e-4 when measured: docs/gguf.md, Seeds.)
"""

from __future__ import annotations

import numpy as np
import pytest
from llama_cpp import Llama
from llama_cpp import llama_cpp as lib
from llama_cpp._internals import LlamaBatch, LlamaContext

from service.engines.gguf.lanes import Lanes, lane_opener
from tests import harness

WINDOW = 512
STEPS = 40


@pytest.fixture(scope="module")
def llm():
    path = harness.models_dir() / "millm-tiny-gguf" / "millm-tiny-gguf-F32.gguf"
    model = Llama(model_path=str(path), n_ctx=64, n_batch=64, n_threads=1, n_threads_batch=1,
                  verbose=False)
    yield model
    model.close()


def shared_context(llm):
    """A context like the engine's shared one: 8 sequences, unified cells."""
    params = lib.llama_context_params.from_buffer_copy(llm.context_params)
    params.n_ctx, params.n_batch, params.n_ubatch = 8 * WINDOW, 512, 512
    params.n_seq_max, params.kv_unified = 8, True
    return (LlamaContext(model=llm._model, params=params, verbose=False),
            LlamaBatch(n_tokens=512, embd=0, n_seq_max=1, verbose=False))


def decode(ctx, batch, parts) -> list[np.ndarray]:
    """One llama_decode of (sequence, first position, tokens) parts: the
    logits after each part's last token."""
    b = batch.batch
    b.n_tokens, ends = 0, []
    for seq, start, tokens in parts:
        for offset, token in enumerate(tokens):
            j = b.n_tokens
            b.token[j], b.pos[j], b.n_seq_id[j], b.logits[j] = token, start + offset, 1, False
            b.seq_id[j][0] = seq
            b.n_tokens += 1
        b.logits[b.n_tokens - 1] = True
        ends.append(b.n_tokens - 1)
    ctx.decode(batch)
    shape = (ctx.model.n_vocab(),)
    return [np.ctypeslib.as_array(lib.llama_get_logits_ith(ctx.ctx, end), shape=shape).copy()
            for end in ends]


def greedy_run(llm, where, seq: int, traffic=None) -> list[np.ndarray]:
    """A prompt, then STEPS greedy tokens, each step decoded alone in `where`
    (a (context, batch)); `traffic(k)` runs between steps."""
    prompt = llm.tokenize(b"Tell me a story about the sea.", add_bos=False)
    logits = [decode(*where, [(seq, 0, prompt)])[0]]
    for k in range(STEPS):
        if traffic is not None:
            traffic(k)
        token = int(np.argmax(logits[-1]))
        logits.append(decode(*where, [(seq, len(prompt) + k, [token])])[0])
    return logits


def busy_shared(llm, shared):
    """Other sequences fill the shared context, one leaves (a hole), and
    between the runner's steps they decode and new ones arrive."""
    other = llm.tokenize(b"The river ran past the mill and the cats slept all day. " * 3,
                         add_bos=False)
    decode(*shared, [(0, 0, other)])
    decode(*shared, [(1, 0, other[:20])])
    lib.llama_memory_seq_rm(shared[0].memory, 0, 0, -1)

    def traffic(k: int) -> None:
        decode(*shared, [(1, 20 + k, [5])])
        if k == 10:
            decode(*shared, [(2, 0, other[:50])])

    return traffic


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_lane_is_bit_identical_whatever_the_shared_context_does(llm):
    lanes = Lanes(lane_opener(llm._model, llm.context_params, WINDOW))
    try:
        lane = lanes.take()
        alone = greedy_run(llm, (lane.ctx, lane.batch), 0)
        lane.slot.row = None  # its row left: emptied and kept spare
        lanes.release_free()
        assert lanes.spare == [lane] and not lanes.active
        again = lanes.take()
        assert again is lane
        shared = shared_context(llm)
        beside = greedy_run(llm, (lane.ctx, lane.batch), 0, busy_shared(llm, shared))
        assert same(alone, beside)
        shared[1].close()
        shared[0].close()
    finally:
        lanes.close()
