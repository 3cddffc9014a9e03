"""Non-strict tool schemas (service/schema_relax.py): any JSON Schema is
accepted, relaxed into the structured-output subset, and the relaxed schema
still accepts what the original accepts; strict tools keep the subset.

No engine: the relaxed schemas are checked against the subset's own walk,
compiled with xgrammar, and fed documents valid against the original."""

from __future__ import annotations

import json

import jsonschema
import pytest
import xgrammar
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from service import json_text
from service.errors import EngineError
from service.requests.tools import FUNCTION, FunctionTool, ToolChoice, check_tools
from service.schema_relax import relax
from service.structured_output import check_schema
from tests.fuzz_support import ANY_JSON
from tests.schema_corpus import UNSUPPORTED

# The shapes coding agents send: unions of edit kinds, draft-07 definitions,
# a recursive tree, mixins, conditions and pattern-keyed maps.
AGENT = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {
        "file_path": {"type": "string", "description": "absolute path"},
        "edits": {"type": "array", "items": {"oneOf": [
            {"type": "object", "properties": {"old": {"type": "string"},
                                              "new": {"type": "string"}},
             "required": ["old", "new"], "additionalProperties": False},
            {"$ref": "#/definitions/Range"}]}},
        "mode": {"anyOf": [{"const": "append"}, {"const": "replace"}], "not": {"const": "x"}},
        "tree": {"$ref": "#"},
        "env": {"type": "object", "patternProperties": {"^[A-Z_]+$": {"type": "string"}}},
        "pair": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}],
                 "additionalItems": False},
        "when": {"type": "string", "pattern": "^(?!never).*$"},
        "timeout": {"type": ["integer", "null"], "minimum": 0, "maximum": 600000},
    },
    "required": ["file_path"],
    "allOf": [{"properties": {"dry_run": {"type": "boolean"}}}],
    "anyOf": [{"required": ["edits"]}, {"required": ["mode"]}],
    "if": {"properties": {"mode": {"const": "append"}}}, "then": {"required": ["edits"]},
    "definitions": {"Range": {"type": "object", "properties": {
        "start": {"type": "integer", "minimum": 0}, "end": {"type": "integer"}},
        "required": ["start"], "additionalProperties": False}},
}
# (In the schema's property order, the order the grammar writes them in;
# allOf's properties come after the schema's own.)
VALID = [
    {"file_path": "/a", "edits": [{"old": "x", "new": "y"}, {"start": 3}]},
    {"file_path": "/a", "mode": "replace", "env": {"HOME": "/root"}, "dry_run": True},
    {"file_path": "/a", "edits": [], "mode": "append",
     "tree": {"file_path": "/b", "mode": "replace"}, "pair": ["a", 1], "timeout": None},
]


def _grammar(schema: dict):
    info = xgrammar.TokenizerInfo([bytes([b]) for b in range(256)], xgrammar.VocabType.RAW)
    return xgrammar.GrammarCompiler(info).compile_json_schema(
        json.dumps(schema), any_whitespace=False, separators=(", ", ": "), strict_mode=True)


def _accepts(grammar, document) -> bool:
    matcher = xgrammar.GrammarMatcher(grammar)
    text = json.dumps(document, separators=(", ", ": "))
    return matcher.accept_string(text) and matcher.is_completed()


def test_an_agent_schema_relaxes_into_the_subset_and_keeps_what_it_accepts():
    for document in VALID:
        jsonschema.validate(document, AGENT)  # the examples are right
    relaxed = relax(AGENT)
    check_schema(json.dumps(relaxed))  # inside the subset: nothing refused
    grammar = _grammar(relaxed)
    for document in VALID:
        jsonschema.Draft202012Validator(relaxed).validate(document)
        assert _accepts(grammar, document), document
    # What the grammar can still enforce, it does: the union's branches, the
    # types, the definitions' required names and the mixin's required ones.
    assert not _accepts(grammar, {"file_path": "/a"})  # neither edits nor mode
    assert not _accepts(grammar, {"file_path": 1, "mode": "append"})
    assert not _accepts(grammar, {"file_path": "/a", "edits": [{"end": 3}]})
    assert not _accepts(grammar, {"file_path": "/a", "mode": "other"})


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_every_keyword_outside_the_subset_relaxes(name):
    schema = {"type": "object", "properties": {"x": UNSUPPORTED[name][0]}}
    relaxed = relax(schema)
    check_schema(json.dumps(relaxed))
    _grammar(relaxed)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"type": "string", "maxLength": 10**9}}},
    {"type": "object", "properties": {"a": {"type": "string", "pattern": "a{0,999999}"}}},
    {"type": "object", "properties": {"a": {"type": "number", "minimum": 1e300}}},
    {"type": "object", "properties": {"a": {"type": "nonsense", "required": True}}},
    {"type": "object", "required": "a", "properties": {"a": {"$ref": "#/nowhere"}}},
])
def test_numbers_past_the_caps_and_invalid_keywords_are_dropped_not_refused(schema):
    check_schema(json.dumps(relax(schema)))


def _tools(schema: dict, strict: bool | None = None):
    return (FunctionTool("edit", "Edit a file", json.dumps(schema), strict),)


def test_a_non_strict_rich_tool_is_planned_and_shown_as_sent():
    plan = check_tools(_tools(AGENT), ToolChoice(FUNCTION, "edit"), None, [])
    assert plan.schema_of("edit") == relax(AGENT)
    assert plan.openai_tools()[0]["function"]["parameters"] == AGENT


def test_a_strict_rich_tool_is_still_refused_naming_its_parameters():
    with pytest.raises(EngineError) as caught:
        check_tools(_tools(AGENT, strict=True), None, None, [])
    assert caught.value.code == "response_format_unsupported"
    assert caught.value.param == "tools[0].function.parameters"
    assert "oneOf" in caught.value.message


@pytest.mark.parametrize(("text", "code"), [
    ('{"type": "string"}', "invalid_parameter"),
    ("[1]", "invalid_parameter"),
    ("{", "invalid_parameter"),
])
def test_a_non_strict_tool_still_describes_an_object(text, code):
    with pytest.raises(EngineError) as caught:
        check_tools((FunctionTool("f", "", text, None),), None, None, [])
    assert (caught.value.code, caught.value.param) == (code, "tools[0].function.parameters")


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(["type", "properties", "anyOf", "oneOf", "allOf", "$ref",
                                        "required", "items", "prefixItems", "not",
                                        "patternProperties", "additionalProperties", "$defs",
                                        "pattern", "format", "minimum", "enum"]), ANY_JSON,
                       max_size=6))
def test_whatever_a_schema_holds_relaxing_it_never_fails(schema):
    schema = {**schema, "type": "object"}
    try:  # what a request can carry: json_text's parser bounds the nesting
        json_text.loads(json.dumps(schema))
    except ValueError:
        assume(False)
    assume(len(json.dumps(schema)) <= 16 * 1024)  # inputs are capped at 64 KiB
    relaxed = relax(schema)
    check_schema(json.dumps(relaxed))  # (escaped: ASCII; the walk is what is checked)


def test_refs_copied_by_many_branches_cannot_blow_the_schema_up():
    big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(200)}}
    schema = {"type": "object", "properties": {"a": {"type": "string"}},
              "anyOf": [{"$ref": "#/$defs/big"}] * 1000, "$defs": {"big": big}}
    assert relax(schema) == {"type": "object"}  # past MAX_NODES: any object, logged
