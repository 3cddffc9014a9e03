"""Client-chosen names in log lines are escaped and bounded (common/log_text.py)."""

from __future__ import annotations

from common.log_text import clipped, shown


def test_a_newline_cannot_forge_a_log_line():
    assert shown("m\nINFO forged") == "'m\\nINFO forged'"


def test_control_characters_and_lone_surrogates_are_escaped():
    out = shown("\x00\x1b[31m\ud800\u202e")
    assert out == "'\\x00\\x1b[31m\\ud800\\u202e'"
    out.encode("utf-8")  # writable by any log handler


def test_long_names_are_cut_and_say_how_much_was_left_out():
    assert clipped("p" * 30_000) == "p" * 128 + "…(+29872 chars)"
    assert len(shown("p" * 30_000)) == 128 + len("…(+29872 chars)") + 2
    assert clipped("short") == "short"
