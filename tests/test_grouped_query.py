"""Masked passes of several query columns read GQA's K/V heads in place on a
CPU, with the same logits as transformers' copied heads, for the thread that
asks and no other (engines/transformers/grouped_query.py). The engine's text
on a prefix hit equal to a miss's is tests/test_batching.py's."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.integrations import sdpa_attention

from service.engines.transformers import grouped_query, kv
from service.engines.transformers.decode_mask import prefix_mask
from tests.harness import models_dir

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def demo():
    return AutoModelForCausalLM.from_pretrained(models_dir() / "millm-tiny",
                                                dtype=torch.float32).eval()


def _question_after_prefix(model, grouped: bool) -> torch.Tensor:
    """20 columns after 512 cached ones, as a prefix-cache hit computes them."""
    ids = torch.arange(10, 542)[None] % 7000 + 10
    with torch.inference_mode():
        cache = kv.new_cache(model.config)
        model(input_ids=ids[:, :512], past_key_values=cache, use_cache=True)
        with grouped_query.multi_column(grouped):
            return model(input_ids=ids[:, 512:], attention_mask=prefix_mask(512, 532, CPU),
                         position_ids=torch.arange(512, 532)[None], past_key_values=cache,
                         use_cache=True).logits


def test_the_demo_model_takes_its_groups_in_place_with_the_same_logits(demo, monkeypatch):
    assert demo.config.num_key_value_heads < demo.config.num_attention_heads
    assert grouped_query.choose(demo, CPU)
    copies = []
    original = sdpa_attention.repeat_kv

    def counted(hidden, n_rep):
        copies.append(n_rep)
        return original(hidden, n_rep)

    monkeypatch.setattr(sdpa_attention, "repeat_kv", counted)
    copied = _question_after_prefix(demo, False)
    layers = demo.config.num_hidden_layers
    assert len(copies) == 2 * layers  # keys and values, every layer: transformers' copy
    copies.clear()
    in_place = _question_after_prefix(demo, True)
    assert copies == []  # the pass really took the groups in place
    assert torch.equal(copied, in_place)


def test_only_the_thread_that_asks_and_only_on_a_cpu(demo):
    assert grouped_query.install()
    key = torch.zeros(1, 2, 4, 16)
    mask = torch.ones(1, 1, 2, 4, dtype=torch.bool)
    assert not sdpa_attention.use_gqa_in_sdpa(mask, key, key)  # transformers' own answer
    seen = {}
    with grouped_query.multi_column(True):
        assert sdpa_attention.use_gqa_in_sdpa(mask, key, key)
        other = threading.Thread(target=lambda: seen.update(
            other=sdpa_attention.use_gqa_in_sdpa(mask, key, key)))
        other.start()
        other.join()
        meta = torch.zeros(1, 2, 4, 16, device="meta")
        assert not sdpa_attention.use_gqa_in_sdpa(mask, meta, meta)
    assert seen == {"other": False}
    assert not sdpa_attention.use_gqa_in_sdpa(mask, key, key)
    # Without a mask transformers already takes the groups in place.
    assert sdpa_attention.use_gqa_in_sdpa(None, key, key)


def test_a_model_without_groups_or_off_the_cpu_keeps_transformers_path(demo):
    assert not grouped_query.choose(demo, torch.device("cuda"))
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    plain = LlamaForCausalLM(config).eval()
    assert not grouped_query.choose(plain, CPU)
