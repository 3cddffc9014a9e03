"""The grammar the engine compiles for a schema must only ever let through
documents its validator accepts: otherwise a constrained choice ends in
constrained_output_invalid. These draw random documents from the compiled
grammar itself (a one-character-per-token vocabulary, random allowed steps)
and validate every one, for each string format and numeric keyword of the
subset. In process, no model: xgrammar and jsonschema only."""

from __future__ import annotations

import json
import random
import string

import jsonschema
import pytest
import torch
import xgrammar

from service.structured_output import FORMATS, check_schema, grammar_schema

VOCAB = [c for c in string.printable if c not in "\t\n\r\x0b\x0c"] + ["</s>"]
STOP = len(VOCAB) - 1
DRAWS = 250


@pytest.fixture(scope="module")
def compiler():
    info = xgrammar.TokenizerInfo(VOCAB, vocab_type=xgrammar.VocabType.RAW, stop_token_ids=[STOP])
    return xgrammar.GrammarCompiler(info, max_threads=1)


def draw(compiled, rng: random.Random, limit: int = 120) -> str | None:
    matcher = xgrammar.GrammarMatcher(compiled)
    bitmask = xgrammar.allocate_token_bitmask(1, len(VOCAB))
    text = []
    for _ in range(limit):
        matcher.fill_next_token_bitmask(bitmask)
        logits = torch.zeros(len(VOCAB))
        xgrammar.apply_token_bitmask_inplace(logits, bitmask)
        allowed = torch.isfinite(logits).nonzero().flatten().tolist()
        if STOP in allowed and (len(allowed) == 1 or rng.random() < 0.3):
            return "".join(text)
        choices = [t for t in allowed if t != STOP]
        quote = VOCAB.index('"')
        # Now and then close an open string, so free-form strings end too.
        token = quote if quote in choices and rng.random() < 0.1 else rng.choice(choices)
        assert matcher.accept_token(token)
        text.append(VOCAB[token])
    return None  # too long: not a verdict either way


SCHEMAS = {
    **{f"format-{f}": {"type": "string", "format": f} for f in FORMATS},
    "exclusive-integer": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 40},
    "exclusive-number": {"type": "number", "exclusiveMinimum": -1.5, "exclusiveMaximum": 2},
    "multiple-of": {"type": "integer", "multipleOf": 7},
    # An optional group holding a repetition (service.structured_output.grammar_pattern).
    "optional-fraction": {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?$"},
    "optional-lazy-nested": {"type": "string", "pattern": "^x((a[0-9]+)?b)??[)?]$"},
    "nested-format": {"type": "object", "properties": {
        "format": {"type": "string", "format": "date"},
        "items": {"type": "array", "items": {"type": "string", "format": "ipv4"},
                  "maxItems": 2}},
        "required": ["format", "items"], "additionalProperties": False},
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_document_the_grammar_allows_validates(compiler, name):
    schema = check_schema(json.dumps(SCHEMAS[name]))
    compiled = compiler.compile_json_schema(json.dumps(grammar_schema(schema)),
                                            any_whitespace=False, strict_mode=True)
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    rng = random.Random(name)
    drawn = [d for d in (draw(compiled, rng) for _ in range(DRAWS)) if d is not None]
    assert len(drawn) > DRAWS // 2, f"{name}: the grammar rarely finishes"
    bad = [d for d in drawn if not validator.is_valid(json.loads(d))]
    assert not bad, f"{name}: the grammar allows {bad[:5]}"
    assert len(set(drawn)) > 10  # the draws explore, they do not repeat one string


def test_the_loose_formats_fail_without_our_patterns(compiler):
    """The test can fail: xgrammar's own date grammar allows a 31st of November."""
    schema = {"type": "string", "format": "date"}
    compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                            strict_mode=True)
    matcher = xgrammar.GrammarMatcher(compiled)
    assert all(matcher.accept_token(VOCAB.index(c)) for c in '"2023-11-31"')
    assert not jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER).is_valid(
        "2023-11-31")


def test_an_optional_group_holding_a_repetition_needs_the_explicit_bound(compiler):
    """The test can fail: compiled as written, "(\\.[0-9]+)?" lets "12" through
    where only a digit and an optional fraction may stand."""
    schema = {"type": "string", "pattern": "^[0-9](\\.[0-9]+)?$"}
    raw = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                       strict_mode=True)
    fixed = compiler.compile_json_schema(json.dumps(grammar_schema(schema)),
                                         any_whitespace=False, strict_mode=True)

    def accepts(compiled, text: str) -> bool:
        matcher = xgrammar.GrammarMatcher(compiled)
        return all(matcher.accept_token(VOCAB.index(c)) for c in text) and \
            matcher.accept_token(STOP)

    assert accepts(raw, '"12"') and not accepts(fixed, '"12"')
    assert accepts(fixed, '"1.25"') and accepts(fixed, '"7"')


def test_an_embedded_ipv4_with_a_leading_zero_is_not_an_ipv6(compiler):
    """xgrammar's own ipv6 grammar lets "::15.00.7.15" through (a build of the
    demo model wrote it, and the validator refused the finished document);
    our pattern does not."""
    text = '"::15.00.7.15"'
    schema = {"type": "string", "format": "ipv6"}
    loose = xgrammar.GrammarMatcher(compiler.compile_json_schema(
        json.dumps(schema), any_whitespace=False, strict_mode=True))
    assert all(loose.accept_token(VOCAB.index(c)) for c in text)
    ours = xgrammar.GrammarMatcher(compiler.compile_json_schema(
        json.dumps(grammar_schema(check_schema(json.dumps(schema)))), any_whitespace=False,
        strict_mode=True))
    assert not all(ours.accept_token(VOCAB.index(c)) for c in text)
