"""The piecewise chat tokenizer (engines/transformers/segments.py) gives
exactly the tokenizer's own ids, and stands down for tokenizers whose pieces
are not independent."""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import AutoTokenizer

from service.engines.transformers import segments
from service.engines.transformers.segments import SegmentTokenizer
from tests.harness import models_dir

SYSTEM = ("You are a careful assistant. " * 40).strip()


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(models_dir() / "millm-tiny")


def _whole(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("question", ["What do you see?", " lead space", "tail space ",
                                      "\n\nnew lines\n", "日本語の🙂 émoji", "",
                                      "<|im_end|><|im_start|>", "x<|im_end|>y",
                                      "<|im_start<|im_end|>|>", "12345 67 8.9"])
def test_rendered_chats_tokenize_the_same(tokenizer, question):
    segmented = SegmentTokenizer.for_tokenizer(tokenizer)
    assert segmented is not None
    for system in (SYSTEM, SYSTEM + " " + question, question + SYSTEM):
        text = tokenizer.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": question}],
            add_generation_prompt=True, tokenize=False)
        assert "<|im_start|>" in text
        first = segmented.encode(text)
        assert first == _whole(tokenizer, text)
        assert segmented.encode(text) == first  # the long pieces come from the cache now
        assert segmented.encode(text + question) == _whole(tokenizer, text + question)


def test_the_cache_keeps_only_long_pieces_within_its_budget(tokenizer, monkeypatch):
    monkeypatch.setattr(segments, "CACHED_CHARS", 3 * len(SYSTEM))
    segmented = SegmentTokenizer.for_tokenizer(tokenizer)
    for i in range(10):
        text = f"<|im_start|>system\n{i} {SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        assert segmented.encode(text) == _whole(tokenizer, text)
    assert len(segmented._pieces) == 2  # the last ones; "Hi" and "user\n" are short
    assert segmented._chars <= 3 * len(SYSTEM)


def test_a_tokenizer_whose_pieces_depend_on_each_other_is_not_split(tokenizer, tmp_path):
    # An added token that strips the whitespace before it changes its neighbour's ids.
    shutil.copytree(models_dir() / "millm-tiny", tmp_path / "m",
                    ignore=shutil.ignore_patterns("*.safetensors"))
    path = tmp_path / "m" / "tokenizer.json"
    config = json.loads(path.read_text())
    config["added_tokens"][1]["lstrip"] = True
    path.write_text(json.dumps(config))
    assert SegmentTokenizer.for_tokenizer(AutoTokenizer.from_pretrained(tmp_path / "m")) is None
    config["added_tokens"][1]["lstrip"] = False
    config["pre_tokenizer"]["add_prefix_space"] = True
    path.write_text(json.dumps(config))
    assert SegmentTokenizer.for_tokenizer(AutoTokenizer.from_pretrained(tmp_path / "m")) is None
