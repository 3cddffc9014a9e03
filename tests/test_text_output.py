"""Unit tests of the detokenizer and the stop matcher, on the demo tokenizer."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from service.text_output import IncrementalDetokenizer, StopMatcher
from tests.harness import models_dir


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(models_dir() / "millm-tiny")


def test_multibyte_characters_are_released_whole(tokenizer):
    text = "日本語の🙂 émoji"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    # The corpus is ASCII, so these characters are several byte tokens each.
    assert len(ids) > len(text)
    detok = IncrementalDetokenizer(tokenizer, [])
    pieces = [detok.push(i) for i in ids] + [detok.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert any(p == "" for p in pieces)  # some tokens held back a partial character


def test_flush_releases_an_incomplete_character(tokenizer):
    ids = tokenizer("🙂", add_special_tokens=False)["input_ids"]
    detok = IncrementalDetokenizer(tokenizer, [])
    held = [detok.push(i) for i in ids[:-1]]
    assert held == [""] * len(held)
    assert detok.flush() == "\ufffd"


def test_prompt_context_does_not_leak_into_output(tokenizer):
    prompt = tokenizer("The river ran", add_special_tokens=False)["input_ids"]
    out = tokenizer(" quietly past", add_special_tokens=False)["input_ids"]
    detok = IncrementalDetokenizer(tokenizer, prompt)
    assert "".join(detok.push(i) for i in out) + detok.flush() == " quietly past"


def feed(matcher: StopMatcher, pieces: list[str]) -> tuple[str, bool]:
    out = ""
    for piece in pieces:
        text, hit = matcher.push(piece)
        out += text
        if hit:
            return out, True
    return out + matcher.flush(), False


@pytest.mark.parametrize(
    ("pieces", "stops", "expected"),
    [
        (["Hello wor", "ld and more"], ("world",), ("Hello ", True)),
        (["ab", "c", "d"], ("cd",), ("ab", True)),
        (["a", "b", "c"], ("x",), ("abc", False)),
        (["wo", "rm"], ("world",), ("worm", False)),  # a false start is released
        (["one END two"], ("END", "one"), ("", True)),  # the earliest stop wins
        (["xx</", "s", ">"], ("</s>",), ("xx", True)),
        (["ab"], (), ("ab", False)),
    ],
)
def test_stop_matcher(pieces, stops, expected):
    assert feed(StopMatcher(stops), pieces) == expected


@pytest.mark.parametrize(
    ("pieces", "stops", "matched"),
    [
        (["one END two"], ("END", "one"), "one"),  # the earliest in the text
        (["a stop"], ("stop", "st"), "stop"),  # same place: the first listed
        (["xx</", "s", ">"], ("</s>",), "</s>"),  # split across pieces
        (["abc"], ("x",), ""),  # none matched
    ],
)
def test_stop_matcher_says_which_stop_matched(pieces, stops, matched):
    matcher = StopMatcher(stops)
    feed(matcher, pieces)
    assert matcher.matched == matched


def test_stop_matcher_holds_back_only_possible_prefixes():
    matcher = StopMatcher(("STOP",))
    assert matcher.push("abcST") == ("abc", False)
    assert matcher.push("x") == ("STx", False)


def test_byte_level_fast_path_matches_hf_decode(tokenizer):
    import random

    from service.text_output import ByteLevelDetokenizer, byte_level_table

    table = byte_level_table(tokenizer)
    assert table is not None and len(table) == len(tokenizer)
    rng = random.Random(7)
    for _ in range(50):
        # Random ids make stray continuation bytes and cut characters.
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 40))]
        fast = ByteLevelDetokenizer(table)
        pieces = [fast.push(i) for i in ids] + [fast.flush()]
        assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=False)
    text = "日本語の🙂 émoji"
    fast = ByteLevelDetokenizer(table)
    pieces = [fast.push(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
    assert "".join(pieces) == text and all("\ufffd" not in p for p in pieces)
