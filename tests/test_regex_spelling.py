"""service/regex_spelling.py: a pattern is rewritten for xgrammar without
changing its language. Checked against Python's `re` (the rewrites are plain
regular-expression identities) and against xgrammar compiling the rewritten
pattern (what it lets a row write matches the pattern as the caller wrote
it). In process, no model."""

from __future__ import annotations

import random
import re

import pytest

from service.regex_spelling import MAX_COPIES, MAX_GROWTH, grammar_pattern
from tests.test_format_grammars import VOCAB, compiler, draw  # noqa: F401 - the fixture

REWRITES = [
    ("[a-z]{8}( [a-z]{4,8}){3}", "[a-z]{8}( [a-z]{4,8})( [a-z]{4,8})( [a-z]{4,8})"),
    ("x((a[0-9]+)?b)??y", "x((a[0-9]+){0,1}b){0,1}?y"),
    ("(ab){3}?c", "(ab)(ab)(ab)c"),  # lazy: still exactly three
    ("((ab){2}){2}", "((ab)(ab))((ab)(ab))"),
    ("(?:ab){2}", "(?:ab)(?:ab)"),
]
KEPT = [
    "(ab){3}+",  # possessive: left to the compiler
    "(?P<n>a){3}",  # a named group cannot be copied
    "[(]{3}(a){1}",  # one copy is the group itself
    "\\(a){2}",  # an escaped parenthesis opens no group
    f"(a){{{MAX_COPIES + 1}}}",
    "(" + "a" * (MAX_GROWTH // 2) + "){3}",  # would grow past the bound
]


@pytest.mark.parametrize(("pattern", "rewritten"), REWRITES)
def test_a_repeated_group_is_written_out(pattern, rewritten):
    assert grammar_pattern(pattern) == rewritten


@pytest.mark.parametrize("pattern", KEPT)
def test_what_cannot_be_copied_safely_stays_as_written(pattern):
    assert grammar_pattern(pattern) == pattern


LANGUAGES = ["[a-c]{2}( [a-c]{1,3}){3}", "(a|bc){2}d?", "((ab)?c){2}", "([0-9]+(\\.[0-9])?){2}"]


@pytest.mark.parametrize("pattern", LANGUAGES)
def test_the_rewritten_pattern_has_the_same_language(compiler, pattern):  # noqa: F811
    """Random strings over the pattern's alphabet match both or neither, and
    every string xgrammar lets a row write under the rewrite matches the
    original (the test can fail: a copy too many or too few changes both)."""
    rewritten = grammar_pattern(pattern)
    assert rewritten != pattern
    rng = random.Random(pattern)
    alphabet = "abcd .0123"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        assert bool(re.fullmatch(pattern, text)) == bool(re.fullmatch(rewritten, text)), text
    compiled = compiler.compile_regex(rewritten)
    drawn = [d for d in (draw(compiled, rng, limit=40) for _ in range(200)) if d is not None]
    assert len(set(drawn)) >= 4  # ((ab)?c){2} has four strings
    assert all(re.fullmatch(pattern, d) for d in drawn), [d for d in drawn
                                                          if not re.fullmatch(pattern, d)]
