"""The transformers engine's oneDNN-packed linears (engines/transformers/
packed_linear.py): same answers as PyTorch's own linear on the demo model, the
memory of an untied weight given back, a tied head packed only when small, and the engine's
greedy text equal with MILLM_TORCH_LINEAR=packed and plain (the demo
model is in cache, so the default, auto, leaves it plain: packed forces it).
bf16 computes in bfloat16 exactly where packed_linear's own CPU rule says
so, and in float32 elsewhere."""

from __future__ import annotations

import grpc
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from millm.v1 import generation_service_pb2_grpc
from service.engines.transformers import packed_linear
from service.engines.transformers.packed_linear import PLAIN, PackedLinear, pack_linears
from tests import harness
from tests.grpc_helpers import concurrently, prompt_request

MODEL = "millm-tiny"


def _demo():
    path = harness.models_dir() / MODEL
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_packed_logits_match_plain_ones_and_untied_weights_are_dropped():
    plain, packed = _demo(), _demo()
    count = pack_linears(packed, "packed")
    linears = [m for m in plain.modules() if type(m) is torch.nn.Linear]
    assert count == len(linears) > 0
    assert pack_linears(_demo(), PLAIN) == 0
    assert pack_linears(_demo(), "auto") == 0  # 2 MiB of weights: in cache, left plain
    head = packed.get_output_embeddings()
    assert isinstance(head, PackedLinear)
    # The untied head's shape is still readable (the engine reads the
    # vocabulary width from it), and holds no memory of its own.
    assert head.weight.shape == plain.get_output_embeddings().weight.shape
    assert head.weight.stride() == (0, 0)
    ids = torch.tensor([[5, 17, 300, 42, 9, 1000, 77]])
    with torch.inference_mode():
        for rows in (1, 3, 5):  # under and over the four rows oneDNN is padded to
            batch = ids.repeat(rows, 1)
            want, got = plain(input_ids=batch).logits, packed(input_ids=batch).logits
            assert torch.allclose(want, got, rtol=1e-4, atol=1e-5)
            assert torch.equal(want.argmax(-1), got.argmax(-1))


def _tied(vocab: int) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def test_a_tied_head_is_packed_only_while_its_copy_is_small():
    ids = torch.tensor([[1, 2, 3, 4]])
    # 64 x 32 beside 2 x 27,648 layer weights: a 4 % copy. 3,000 x 32: 63 %.
    for vocab, head_packed in ((64, True), (3000, False)):
        model = _tied(vocab)
        with torch.inference_mode():
            want = model(input_ids=ids).logits
        assert pack_linears(model, "packed") == 14 + head_packed
        head, embedding = model.get_output_embeddings(), model.get_input_embeddings().weight
        assert isinstance(head, PackedLinear) == head_packed
        assert head.weight is embedding  # the embedding keeps its rows either way
        assert embedding.stride() == (32, 1)
        with torch.inference_mode():
            assert torch.allclose(model(input_ids=ids).logits, want, rtol=1e-4, atol=1e-5)


def test_engine_greedy_text_is_the_same_packed_and_plain(tmp_path):
    prompts = ["The river ran", "Once upon a time", "Gardens need patience and",
               "In the morning the market"]
    texts, logs = {}, {}
    for layout in ("packed", "plain"):
        (tmp_path / layout).mkdir()
        process, port = harness.start_engine(tmp_path / layout, MILLM_TORCH_LINEAR=layout)
        try:
            harness.wait_serving(process, port)
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
                requests = [prompt_request(p, max_tokens=24, temperature=0,
                                                 ignore_eos=True) for p in prompts]
                # Batched (staggered into one lane) and alone.
                texts[layout] = (concurrently(stub, requests, tokens=True),
                                 [concurrently(stub, [r], tokens=True) for r in requests])
        finally:
            process.stop()
        logs[layout] = process.log()
    assert "oneDNN's packed layout" in logs["packed"]
    assert "oneDNN's packed layout" not in logs["plain"]
    assert all(len(ids[0]) == 24 for ids in texts["plain"][0]), texts
    assert texts["packed"] == texts["plain"]


def test_bf16_is_opt_in_and_close():
    # The engine's own rule (AVX512-BF16 or AMX), not oneDNN's
    # _is_mkldnn_bf16_supported, which also says yes where bfloat16 is emulated.
    fast = packed_linear._bf16_fast()
    plain, half = _demo(), _demo()
    assert pack_linears(half, "bf16") > 0
    head = half.get_output_embeddings()
    assert head.dtype == (torch.bfloat16 if fast else torch.float32)
    ids = torch.tensor([[5, 17, 300, 42, 9, 1000, 77]])
    with torch.inference_mode():
        want, got = plain(input_ids=ids).logits, half(input_ids=ids).logits
    assert got.dtype == torch.float32
    assert torch.allclose(want, got, atol=0.05 * float(want.abs().max()))
    if fast:
        assert not torch.equal(want, got)  # rounded: why it is never the default


def test_bf16_without_bfloat16_instructions_packs_float32(monkeypatch):
    """Where the rule says no, bf16 still packs, in float32: the products
    match the plain model's to float32 rounding."""
    monkeypatch.setattr(packed_linear, "_bf16_fast", lambda: False)
    plain, model = _demo(), _demo()
    assert pack_linears(model, "bf16") > 0
    head = model.get_output_embeddings()
    assert isinstance(head, PackedLinear) and head.dtype == torch.float32
    ids = torch.tensor([[5, 17, 300, 42, 9, 1000, 77]])
    with torch.inference_mode():
        want, got = plain(input_ids=ids).logits, model(input_ids=ids).logits
    assert torch.allclose(want, got, rtol=1e-4, atol=1e-5)


def test_auto_packs_a_model_past_its_threshold(monkeypatch):
    """auto is "packed" for a model whose linear weights reach AUTO_MIN_BYTES:
    the demo model counts once the threshold is below its 2 MiB."""
    monkeypatch.setattr(packed_linear, "AUTO_MIN_BYTES", 1024)
    linears = [m for m in _demo().modules() if type(m) is torch.nn.Linear]
    assert pack_linears(_demo(), "auto") == len(linears) > 0
