"""Decode steps hand SDPA the padding mask ready-made only where that is the
whole mask, and a lone prompt after cached columns the causal one
(engines/transformers/decode_mask.py); the lanes' greedy text staying equal to
a row's alone is tests/test_batching.py's, a prefix-cache hit's text equal to
a miss's test_batching.py's too."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from service.engines.transformers import decode_mask
from tests.harness import models_dir


def _model(**kwargs):
    return AutoModelForCausalLM.from_pretrained(models_dir() / "millm-tiny",
                                                dtype=torch.float32, **kwargs).eval()


@pytest.fixture(scope="module")
def sdpa_model():
    return _model(attn_implementation="sdpa")


def test_the_padding_mask_is_the_decode_mask_of_a_plain_sdpa_model(sdpa_model):
    assert decode_mask.suffices(sdpa_model, recurrent=False)
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    ready = decode_mask.decode_mask(mask)
    assert ready.shape == (2, 1, 1, 3) and ready.dtype == torch.bool
    assert ready[0, 0, 0].tolist() == [False, True, True]


def test_anything_else_in_the_mask_keeps_the_one_transformers_builds(sdpa_model):
    assert not decode_mask.suffices(sdpa_model, recurrent=True)
    assert not decode_mask.suffices(_model(attn_implementation="eager"), recurrent=False)
    windowed = _model(attn_implementation="sdpa")
    windowed.config.sliding_window = 4
    assert not decode_mask.suffices(windowed, recurrent=False)


def test_a_mask_that_moves_the_logits_is_refused_at_load(sdpa_model, monkeypatch):
    """The load-time check compares logits: a ready mask that lets the padded
    row attend to its padding (all True) must make it keep transformers' own."""
    monkeypatch.setattr(decode_mask, "decode_mask",
                        lambda mask: torch.ones_like(mask, dtype=torch.bool)[:, None, None, :])
    assert not decode_mask.suffices(sdpa_model, recurrent=False)


def test_the_prefix_mask_is_the_causal_rule_over_cached_columns(sdpa_model):
    ready = decode_mask.prefix_mask(2, 5, "cpu")
    assert ready.shape == (1, 1, 3, 5) and ready.dtype == torch.bool
    assert ready[0, 0].int().tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


def test_a_prefix_mask_that_moves_the_logits_is_refused_at_load(sdpa_model, monkeypatch):
    """A ready prefix mask that lets each column see the columns after it
    must make the model keep transformers' masks, decode steps' included."""
    monkeypatch.setattr(decode_mask, "prefix_mask",
                        lambda start, end, device: torch.ones((1, 1, end - start, end),
                                                              dtype=torch.bool))
    assert not decode_mask.suffices(sdpa_model, recurrent=False)
