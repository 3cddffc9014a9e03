"""The JSON-prefix reader the structured-output tests lean on (json_prefix.py):
every prefix of a valid document is accepted, and text that no document
starts with is refused, checked against json.loads on real documents."""

from __future__ import annotations

import json

import pytest

from tests.json_prefix import is_json_prefix

DOCUMENTS = [
    {"city": "Paris", "temp": -3.5e2, "ok": True, "none": None, "list": [1, 0, [], {}]},
    {"esc": "a\"b\\c\u00e9\n\t/", "n": 0, "f": False, "nested": {"a": [{"b": "c"}]}},
    {}, {"": ""},
]


@pytest.mark.parametrize("document", DOCUMENTS)
@pytest.mark.parametrize("indent", [None, 2])
def test_every_prefix_of_a_document_is_a_prefix(document, indent):
    text = json.dumps(document, indent=indent, ensure_ascii=False)
    for k in range(len(text) + 1):
        assert is_json_prefix(text[:k]), text[:k]
    escaped = json.dumps(document, ensure_ascii=True)
    for k in range(len(escaped) + 1):
        assert is_json_prefix(escaped[:k]), escaped[:k]


@pytest.mark.parametrize("text", [
    "[1]", '"x"', "1", "x", '{"a" 1', '{"a":1,}', '{"a":1]', '{a:1}', '{"a":tru}',
    '{"a":01}', '{"a":1.}x', '{"a":"\\x"}', '{"a":"\\u12g4"}', '{"a":"b\x01"}',
    '{"a":1}}', '{"a":1} x', '{"a":-}', '{"a":[1 2]}', '{"a":nul ', '{,',
])
def test_text_no_document_starts_with_is_refused(text):
    assert not is_json_prefix(text)


def test_a_complete_document_and_any_top_value():
    assert is_json_prefix('{"a": [1, 2]}  ')
    assert is_json_prefix("[1, 2", top="[") and is_json_prefix("tr", top="")
    assert is_json_prefix("-1.5e", top="") and not is_json_prefix("-1.5e+x", top="")
