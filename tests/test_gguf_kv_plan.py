"""The GGUF engine sizes its KV cells to memory (engines/gguf/kv_plan.py): the
rule on its own, its cost formula against the sizes llama.cpp itself reports,
and a long-context file (the demo weights re-labelled as trained on 131,072
tokens) loaded by a real engine with no context setting."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from tests import harness
from tests.http_helpers import call, post

MIB = 1024 * 1024
LONG = "millm-long:F32"
TRAINED = 131072


def long_models_dir(tmp):
    """A models dir holding only the demo F32 export with llama.context_length
    rewritten to 131,072 (same weights: llama.cpp runs it at any window)."""
    import gguf

    target = tmp / "models" / "millm-long"
    target.mkdir(parents=True)
    path = target / "millm-long-F32.gguf"
    shutil.copyfile(harness.gguf_file("millm-tiny-gguf:F32"), path)
    reader = gguf.GGUFReader(path, "r+")
    field = reader.fields["llama.context_length"]
    field.parts[field.data[0]][0] = TRAINED
    reader.data.flush()
    del reader
    assert int(gguf.GGUFReader(path).fields["llama.context_length"].contents()) == TRAINED
    return tmp / "models"


# -- the rule ---------------------------------------------------------------------

def test_the_rule_keeps_the_slots_and_shrinks_the_window_to_memory():
    from service.engines.gguf.kv_plan import FLOOR, STEP, CellCost, engine_bytes, plan

    cost = CellCost(kv_bytes=128 * 1024, heads=32)  # a Llama-3-8B cell
    roomy = plan(cost, TRAINED, 8, engine_bytes(cost, TRAINED, 8))
    assert (roomy.window, roomy.slots, roomy.refusal) == (TRAINED, 8, "")
    assert roomy.kv_bytes == 8 * TRAINED * 128 * 1024
    budget = 20 * 1024 * MIB
    shrunk = plan(cost, TRAINED, 8, budget)
    assert shrunk.slots == 8 and FLOOR <= shrunk.window < TRAINED
    assert shrunk.window % STEP == 0 and "limited by memory" in shrunk.reason
    assert shrunk.engine_bytes <= budget < engine_bytes(cost, shrunk.window + STEP, 8)
    # Below the floor for 8 slots: fewer slots at the floor.
    few = plan(cost, TRAINED, 8, engine_bytes(cost, FLOOR, 3))
    assert (few.window, few.slots) == (FLOOR, 3) and "3 of 8 slots" in few.reason
    # Not one slot at the floor: refused, with the figures.
    none = plan(cost, TRAINED, 8, engine_bytes(cost, FLOOR, 1) - 1)
    assert none.refusal and "MiB" in none.refusal
    # A file trained shorter than the floor keeps its own window as the floor.
    short = plan(cost, 1024, 8, engine_bytes(cost, 1024, 2))
    assert (short.window, short.slots) == (1024, 2)


def test_f32_cells_are_planned_at_twice_the_bytes():
    """MILLM_GGUF_KV_TYPE=f32: the same budget holds half the cells."""
    from service.engines.gguf.kv_plan import CellCost, engine_bytes, plan

    cost = CellCost(kv_bytes=128 * 1024, heads=32)
    budget = engine_bytes(cost, TRAINED, 8)
    f16, f32 = plan(cost, TRAINED, 8, budget), plan(cost, TRAINED, 8, budget, kv_width=4)
    assert f16.window == TRAINED and f32.window < TRAINED
    assert f32.kv_bytes == 2 * f32.window * 8 * 128 * 1024
    assert engine_bytes(cost, 1024, 8, 4) > engine_bytes(cost, 1024, 8) and \
        f32.engine_bytes <= budget


def test_an_explicit_context_wins_or_is_refused_never_changed():
    from service.engines.gguf.kv_plan import CellCost, engine_bytes, plan

    cost = CellCost(kv_bytes=256, heads=4)
    budget = engine_bytes(cost, 3000, 8)
    chosen = plan(cost, TRAINED, 8, budget, context=3000)  # not a multiple of 256: as set
    assert (chosen.window, chosen.slots, chosen.refusal) == (3000, 8, "")
    assert plan(cost, 1024, 8, budget, context=3000).window == 1024  # capped by the trained
    refused = plan(cost, TRAINED, 8, budget, context=3001)
    assert "MILLM_GGUF_CONTEXT=3001" in refused.refusal and refused.slots == 8


# -- the formula against llama.cpp ---------------------------------------------------

PROBE = """
import sys
from llama_cpp import Llama, llama_cpp as lib
from llama_cpp._internals import LlamaContext
path, cells, seqs, type_kv = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = Llama(model_path=path, n_ctx=64, n_batch=64, verbose=True)
params = lib.llama_context_params.from_buffer_copy(llm.context_params)
batch = min(512, cells)
params.n_ctx, params.n_batch, params.n_ubatch = cells, batch, batch
params.n_seq_max, params.kv_unified = seqs, True
params.type_k = params.type_v = type_kv
LlamaContext(model=llm._model, params=params, verbose=True)
"""


def llama_cpp_sizes(path, cells: int, seqs: int, type_kv: int) -> tuple[float, float]:
    """(KV cache MiB, compute buffer MiB) llama.cpp logs for a context as the
    engine opens them (llama-cpp-python's parameters, unified cache)."""
    log = subprocess.run([sys.executable, "-c", PROBE, str(path), str(cells), str(seqs),
                          str(type_kv)], capture_output=True, text=True, timeout=120).stderr
    kv = re.findall(rf"llama_kv_cache: size = +([\d.]+) MiB \( *{cells} cells", log)
    compute = re.findall(r"sched_reserve: +CPU compute buffer size = +([\d.]+) MiB", log)
    assert kv and compute, log[-2000:]
    return float(kv[-1]), float(compute[-1])


@pytest.mark.parametrize("cells,seqs,type_kv", [(8 * 1024, 8, 1), (8 * 4096, 8, 1),
                                                (1024, 1, 0)])
def test_the_cost_of_a_cell_is_what_llama_cpp_allocates(cells, seqs, type_kv):
    from service.engines import kinds
    from service.models.registry import ModelRegistry

    entry = ModelRegistry(harness.models_dir()).resolve("millm-tiny-gguf:F32")
    cost = kinds.cell_cost(entry)
    # 2 layers x 2 KV heads x (16 + 16) values x 2 bytes (f16); 4 attention heads.
    assert (cost.kv_bytes, cost.heads) == (256, 4)
    width = 2 if type_kv == 1 else 4  # GGML_TYPE_F16 / F32
    kv, compute = llama_cpp_sizes(entry.path, cells, seqs, type_kv)
    assert kv * MIB == cells * cost.kv_bytes * width // 2  # to the byte (MiB to 2 decimals)
    ours = cost.context_bytes(cells, kv_width=width) / MIB
    # llama.cpp's allocator reuses its compute buffer between the attention
    # scratch and the logits of one micro-batch (512 x vocabulary f32 values),
    # so the buffer is the larger of the two plus a small fixed part
    # (activations: under 1 MiB here). The plan counts the scratch; the logits
    # are left to the headroom (kv_plan.py), and win only on short contexts.
    logits = min(512, cells) * harness.demo_config()["vocab_size"] * 4 / MIB
    assert 0 <= (kv + compute) - max(ours, kv + logits) < 1.0, (kv, compute, ours, logits)


# -- a long-context file on a real engine ------------------------------------------

def test_a_long_context_file_is_planned_to_memory_not_refused(tmp_path):
    """No setting: the load check (before any unload) plans a window for it
    from the memory this machine has free, instead of refusing it."""
    from service.errors import EngineError
    from service.models.lifecycle import ModelLifecycle
    from service.models.lifecycle_config import LifecycleConfig
    from service.models.registry import ModelRegistry

    registry = ModelRegistry(long_models_dir(tmp_path))
    entry = registry.resolve(LONG)
    assert entry.context_length == TRAINED
    kv = ModelLifecycle(registry, LifecycleConfig(device="cpu")).check_load(entry)
    assert kv is not None and not kv.refusal and kv.slots >= 1
    assert min(2048, TRAINED) <= kv.window <= TRAINED
    # An explicit context that cannot fit in what the engine may use is refused clearly.
    tight = LifecycleConfig(device="cpu", gguf_context=TRAINED, gguf_kv_memory_bytes=64 * MIB)
    with pytest.raises(EngineError) as caught:
        ModelLifecycle(registry, tight).check_load(entry)
    assert caught.value.code == "insufficient_memory"
    assert f"MILLM_GGUF_CONTEXT={TRAINED}" in caught.value.message


@pytest.fixture(scope="module")
def long_dir(tmp_path_factory):
    return long_models_dir(tmp_path_factory.mktemp("long"))


def capabilities(stack) -> dict:
    reply = call(stack.http_port, "GET", "/api/capabilities")
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_memory_limit_shrinks_the_window_and_keeps_the_slots(long_dir, tmp_path):
    from service.engines.gguf.kv_plan import CellCost, embedding_window, engine_bytes

    stack = harness.OwnStack(tmp_path, MILLM_MODELS_DIR=str(long_dir), MILLM_MODEL=LONG,
                             MILLM_GGUF_SLOTS="2", MILLM_GGUF_KV_MEMORY_MIB="256")
    try:
        caps = capabilities(stack)
        window = int(caps["context_window"])
        assert caps["model"] == LONG and caps["features"]["max_batch"] == "2"
        # The longest multiple of 256 whose contexts fit in 256 MiB.
        cost = CellCost(256, 4)
        assert 2048 <= window < TRAINED and window % 256 == 0
        assert engine_bytes(cost, window, 2) <= 256 * MIB < engine_bytes(cost, window + 256, 2)
        logged = re.search(r"GGUF KV cache: 2 slots × (\d+) cells = ([\d.]+) MiB "
                           r"\(trained 131072; limited by memory", stack.engine.log())
        assert logged and int(logged.group(1)) == window, stack.engine.log()[-3000:]
        # The window is what requests are held to, and it serves.
        # (Under X-miLLM-Strict a max_tokens past the room is refused rather
        # than capped, so the refusal shows the window.)
        body = {"model": LONG, "prompt": "Hello", "max_tokens": window, "temperature": 0}
        status, content = post(stack.http_port, "/v1/completions", body,
                               headers={"X-miLLM-Strict": "1"})
        error = json.loads(content)["error"]
        assert status.status == 400 and error["code"] == "context_length_exceeded", content
        assert str(window) in error["message"]
        body["max_tokens"] = 4
        assert call(stack.http_port, "POST", "/v1/completions", body).status_code == 200
        # Embeddings read a whole input at once: their window is capped so that
        # the reader's quadratic scratch stays bounded, and past it is a 400.
        embed = embedding_window(cost, window)
        assert embed < window and f"embedding inputs up to {embed} tokens" in stack.engine.log()
        too_long = {"model": LONG, "input": [[5] * (embed + 1)]}
        reply = call(stack.http_port, "POST", "/v1/embeddings", too_long)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert (error["code"], error["param"]) == ("context_length_exceeded", "input[0]")
        assert f"longest embedding input is {embed} tokens" in error["message"]
        fits = {"model": LONG, "input": [[5] * embed]}
        reply = call(stack.http_port, "POST", "/v1/embeddings", fits)
        assert reply.status_code == 200 and len(reply.json()["data"][0]["embedding"]) == 64
    finally:
        stack.stop()


def test_an_explicit_context_wins_over_the_plan(long_dir, tmp_path):
    stack = harness.OwnStack(tmp_path, MILLM_MODELS_DIR=str(long_dir), MILLM_MODEL=LONG,
                             MILLM_GGUF_SLOTS="2", MILLM_GGUF_KV_MEMORY_MIB="256",
                             MILLM_GGUF_CONTEXT="3000")
    try:
        caps = capabilities(stack)
        assert caps["context_window"] == "3000" and caps["features"]["max_batch"] == "2"
        assert "2 slots × 3000 cells" in stack.engine.log()
        assert "MILLM_GGUF_CONTEXT" in stack.engine.log()
    finally:
        stack.stop()


def test_the_embedding_window_bounds_its_quadratic_scratch():
    # The demo file's cell (256 bytes of f16 K+V, 4 heads) at a 32k window:
    # a whole-window micro-batch would need ~20 GiB of scratch.
    from service.engines.gguf import kv_plan

    cost = kv_plan.CellCost(kv_bytes=256, heads=4)
    assert kv_plan.embedding_window(cost, 1024) == 1024
    capped = kv_plan.embedding_window(cost, 32768)
    assert capped % kv_plan.STEP == 0 and 2048 <= capped < 32768
    assert cost.context_bytes(capped, kv_width=4, micro=capped) <= kv_plan.EMBED_BYTES
    longer = capped + kv_plan.STEP
    assert cost.context_bytes(longer, kv_width=4, micro=longer) > kv_plan.EMBED_BYTES
    planned = kv_plan.plan(cost, trained=32768, slots=8, budget=64 * 1024 * kv_plan.MIB)
    assert planned.window == 32768 and planned.embed_window == capped
