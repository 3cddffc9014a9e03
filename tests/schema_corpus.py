"""JSON schemas covering every keyword of the supported subset, alone and in
combination. Strings are mostly bounded (enum, maxLength, pattern) so that the
tiny demo model, which rambles inside free strings, finishes its documents."""

from __future__ import annotations

WORD = {"type": "string", "minLength": 1, "maxLength": 8}
COLOUR = {"enum": ["red", "green", "blue"]}

SCHEMAS: dict[str, dict] = {
    # -- each type alone --
    "string-bounded": {"type": "string", "maxLength": 6},
    "string-min-max": {"type": "string", "minLength": 2, "maxLength": 4},
    "number": {"type": "number", "minimum": -5, "maximum": 5},
    "integer": {"type": "integer"},
    "integer-bounded": {"type": "integer", "minimum": 10, "maximum": 99},
    "integer-negative-range": {"type": "integer", "minimum": -20, "maximum": -10},
    "boolean": {"type": "boolean"},
    "null": {"type": "null"},
    "type-list": {"type": ["integer", "null"]},
    "array-of-integers": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                     "maximum": 9}, "maxItems": 4},
    "object-empty-closed": {"type": "object", "additionalProperties": False},
    # -- enum and const --
    "enum-strings": COLOUR,
    "enum-mixed": {"enum": ["a", 1, True, None]},
    "const-string": {"const": "fixed"},
    "const-object": {"const": {"k": [1, 2]}},
    "judge": {"type": "object", "properties": {"label": {"enum": ["humor", "not_humor"]}},
              "required": ["label"], "additionalProperties": False},
    # -- objects --
    "object-required": {"type": "object", "properties": {"name": WORD, "age": {
        "type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"]},
    "object-optional": {"type": "object", "properties": {"a": {"type": "boolean"},
                                                         "b": {"type": "null"}}},
    "object-nested": {"type": "object", "properties": {"outer": {"type": "object", "properties": {
        "inner": {"type": "object", "properties": {"v": {"type": "integer"}},
                  "required": ["v"]}}, "required": ["inner"]}}, "required": ["outer"]},
    "object-additional-schema": {"type": "object", "properties": {"id": {"type": "integer"}},
                                 "required": ["id"], "additionalProperties": {"type": "boolean"}},
    "object-additional-true": {"type": "object", "properties": {"x": COLOUR}, "required": ["x"],
                               "additionalProperties": True},
    "object-many-fields": {"type": "object", "properties": {
        f"f{i}": {"type": "integer", "minimum": 0, "maximum": 9} for i in range(8)},
        "required": [f"f{i}" for i in range(8)], "additionalProperties": False},
    "object-with-annotations": {"title": "Person", "description": "someone",
                                "type": "object", "properties": {"n": {
                                    "type": "integer", "default": 3, "examples": [1, 2]}},
                                "required": ["n"]},
    # -- arrays --
    "array-of-enums": {"type": "array", "items": COLOUR, "minItems": 1, "maxItems": 3},
    "array-exact-length": {"type": "array", "items": {"type": "boolean"}, "minItems": 2,
                           "maxItems": 2},
    "array-of-objects": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"c": COLOUR, "n": {"type": "integer", "minimum": 0,
                                                             "maximum": 5}},
        "required": ["c", "n"], "additionalProperties": False}},
    "array-nested": {"type": "array", "maxItems": 2, "items": {
        "type": "array", "maxItems": 2, "items": {"type": "integer", "minimum": 0,
                                                  "maximum": 3}}},
    "object-with-array": {"type": "object", "properties": {"tags": {
        "type": "array", "items": WORD, "maxItems": 3}}, "required": ["tags"]},
    # -- patterns --
    "pattern-digits": {"type": "string", "pattern": "^[0-9]{3}$"},
    "pattern-date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
    "pattern-word": {"type": "string", "pattern": "^[a-z]{1,6}$"},
    "pattern-in-object": {"type": "object", "properties": {"code": {
        "type": "string", "pattern": "^[A-Z]{2}[0-9]$"}}, "required": ["code"]},
    # -- anyOf --
    "anyof-scalars": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                {"type": "boolean"}]},
    "anyof-objects": {"anyOf": [
        {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {
            "type": "integer", "minimum": 1, "maximum": 9}}, "required": ["kind", "lives"],
         "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "dog"}, "good": {
            "type": "boolean"}}, "required": ["kind", "good"], "additionalProperties": False}]},
    "anyof-null": {"type": "object", "properties": {"v": {"anyOf": [COLOUR, {"type": "null"}]}},
                   "required": ["v"]},
    # -- $ref --
    "ref-simple": {"$defs": {"colour": COLOUR}, "type": "object", "properties": {
        "fg": {"$ref": "#/$defs/colour"}, "bg": {"$ref": "#/$defs/colour"}},
        "required": ["fg", "bg"]},
    "ref-in-array": {"$defs": {"point": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": 0, "maximum": 9},
        "y": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x", "y"],
        "additionalProperties": False}},
        "type": "array", "items": {"$ref": "#/$defs/point"}, "maxItems": 2},
    # A list of nodes, each holding the rest of the list in an array of at
    # most one: the recursion ends with an empty array. (Ended by a null
    # instead, the demo model never ends it: compact JSON's "null" is a token
    # its training text never uses, so its logit is the pushed-down one of
    # the ~7,400 unused tokens, and the grammar's other choice, '{"', wins
    # every time. null in an anyOf is covered by "anyof-null".)
    "ref-recursive": {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer", "minimum": 0, "maximum": 9},
        "next": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 1}},
        "required": ["v", "next"], "additionalProperties": False}},
        "$ref": "#/$defs/node"},
    "ref-chain": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"type": "boolean"}},
                  "type": "object", "properties": {"flag": {"$ref": "#/$defs/a"}},
                  "required": ["flag"]},
    # -- numeric bounds --
    "number-bounded-object": {"type": "object", "properties": {
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "rank": {"type": "integer", "minimum": 1, "maximum": 3}},
        "required": ["score", "rank"], "additionalProperties": False},
    "integer-zero": {"type": "integer", "minimum": 0, "maximum": 0},
    "exclusive-bounds": {"type": "object", "properties": {
        "gt0": {"type": "integer", "exclusiveMinimum": 0, "maximum": 50},
        "lt1": {"type": "number", "minimum": 0, "exclusiveMaximum": 1}},
        "required": ["gt0", "lt1"], "additionalProperties": False},
    "integer-multiple-of": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 95},
    # -- string formats (OpenAI strict mode's) --
    **{f"format-{f}": {"type": "object", "properties": {"v": {"type": "string", "format": f}},
                       "required": ["v"], "additionalProperties": False}
       for f in ("date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6",
                 "uuid")},
    # -- what pydantic writes for datetime, UUID and Field(gt=0) --
    "pydantic-event": {"title": "Event", "type": "object", "properties": {
        "when": {"title": "When", "type": "string", "format": "date-time"},
        "id": {"title": "Id", "type": "string", "format": "uuid"},
        "count": {"title": "Count", "type": "integer", "exclusiveMinimum": 0}},
        "required": ["when", "id", "count"], "additionalProperties": False},
    # -- a judge-like combination --
    "judge-rich": {"type": "object", "properties": {
        "verdict": {"enum": ["pass", "fail"]},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
        "reasons": {"type": "array", "items": {"enum": ["style", "facts", "tone"]},
                    "maxItems": 2},
        "note": {"anyOf": [WORD, {"type": "null"}]}},
        "required": ["verdict", "confidence", "reasons", "note"],
        "additionalProperties": False},
    "true-schema-property": {"type": "object", "properties": {"any": {"type": "boolean"},
                                                              "z": {"const": 0}},
                             "required": ["z"]},
}

# Objects open to extra properties: their keys are free strings, in which the
# demo model rambles until max_tokens, so these rarely finish; an email's
# local part is as free; and a duration's numbers are unbounded digit runs,
# which the demo model continues with "09" (its only trained digit tokens,
# from times like 09:15) instead of the designator letter that ends a number,
# a token it never trained. tests/test_format_grammars.py draws finished ones.
OPEN = frozenset({"object-additional-schema", "object-additional-true", "format-email",
                  "format-duration"})

# Every keyword outside the subset, and where it sits: (schema, pointer).
UNSUPPORTED: dict[str, tuple[dict, str]] = {
    "multipleOf": ({"type": "object", "properties": {"x": {"type": "number",
                                                           "multipleOf": 0.5}}},
                   "/properties/x/multipleOf"),
    "not": ({"not": {"type": "string"}}, "/not"),
    "uniqueItems": ({"type": "array", "uniqueItems": True}, "/uniqueItems"),
    "allOf": ({"allOf": [{"type": "string"}]}, "/allOf"),
    "oneOf": ({"oneOf": [{"type": "string"}]}, "/oneOf"),
    "if": ({"if": {"type": "string"}, "then": {"maxLength": 2}}, "/if"),
    "then": ({"if": {"type": "string"}, "then": {"maxLength": 2}}, "/then"),
    "else": ({"type": "string", "else": {"maxLength": 2}}, "/else"),
    "format": ({"type": "object", "properties": {"d": {"type": "string", "format": "uri"}}},
               "/properties/d/format"),
    "patternProperties": ({"type": "object", "patternProperties": {"^x": {}}},
                          "/patternProperties"),
    "dependentRequired": ({"type": "object", "dependentRequired": {"a": ["b"]}},
                          "/dependentRequired"),
    "$schema": ({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "string"},
                "/$schema"),
    "remote $ref": ({"$ref": "https://example.com/s.json"}, "/$ref"),
    "in items": ({"type": "array", "items": {"type": "string", "contentEncoding": "base64"}},
                 "/items/contentEncoding"),
    "in $defs": ({"$defs": {"a": {"type": "integer", "multipleOf": 2.5}}, "$ref": "#/$defs/a"},
                 "/$defs/a/multipleOf"),
    "in anyOf": ({"anyOf": [{"type": "string"}, {"type": "string", "minContains": 1}]},
                 "/anyOf/1/minContains"),
    "minProperties": ({"type": "object", "minProperties": 1}, "/minProperties"),
}
