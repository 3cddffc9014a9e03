"""Custom tools' grammars rewritten for JSON-escaped text
(service/requests/custom_tools.py), and the names namespace members are
offered under (rest_bridge/serving/responses_tools.py). No stack needed."""

from __future__ import annotations

import json

import pytest
from xgrammar.testing import _is_grammar_accept_string as accepts

from rest_bridge.serving.responses_tools import offered_name
from service.requests import custom_tools
from service.requests.tools import FunctionTool, ToolChoice, check_tools

PATCH = r'''
start: begin add+ end
begin: "*** Begin Patch" LF
add: "*** Add File: " /[^\n]+/ LF line+
line: "+" /[^\n]*/ LF
end: "*** End Patch" LF?
%import common.LF
'''
GOOD = ('*** Begin Patch\n*** Add File: a "b"\\c.txt\n+tab\there \u00e9 \U0001f600\n+\n'
        '*** End Patch\n')


def _args(text: str) -> str:
    return json.dumps({"input": text}, ensure_ascii=False)


def test_a_lark_grammar_constrains_the_json_spelling_of_its_text():
    ebnf = custom_tools.arguments_grammar(custom_tools.LARK, PATCH)
    assert ebnf is not None
    assert accepts(ebnf, _args(GOOD))
    assert not accepts(ebnf, _args("*** Begin Patch\n*** End Patch\n"))  # no hunk
    assert not accepts(ebnf, _args(GOOD)[:-12] + '"}')  # cut inside the last line
    # A raw newline or quote is not JSON: the grammar never lets one through.
    assert not accepts(ebnf, '{"input": "' + GOOD + '"}')


def test_a_regex_and_negated_classes_keep_their_escapes():
    ebnf = custom_tools.arguments_grammar(custom_tools.REGEX, r'[^a]+ "q"\\\d')
    assert accepts(ebnf, _args('b\n\x01é "q"\\7'))
    assert not accepts(ebnf, _args('ba "q"\\7'))


@pytest.mark.parametrize("syntax, definition", [
    (custom_tools.LARK, "start: ???"), (custom_tools.REGEX, "(unclosed"),
    (custom_tools.LARK, ""), (custom_tools.FREE, "anything")])
def test_what_cannot_be_compiled_leaves_the_text_free(syntax, definition):
    assert custom_tools.arguments_grammar(syntax, definition) is None


def test_check_tools_reports_a_grammar_it_cannot_use():
    unused: list[str] = []
    plan = check_tools((FunctionTool("f"), FunctionTool("edit", custom=("lark", "start: ???")),
                        FunctionTool("patch", custom=("lark", PATCH))),
                       ToolChoice("function", "patch"), None, unused)
    assert unused == ["tools[1].custom"]
    assert [name for name, _, _ in plan.tools] == ["f", "edit", "patch"]
    assert plan.schema_of("edit") == custom_tools.INPUT_SCHEMA
    assert [(name, i) for name, _, i in plan.custom] == [("patch", 2)]
    assert "patch" in plan.key


def test_offered_names_join_namespace_and_name():
    assert offered_name("", "exec") == "exec"
    assert offered_name("collab", "spawn_agent") == "collab__spawn_agent"
    assert offered_name("mcp__files__", "read") == "mcp__files__read"
    long = offered_name("mcp__" + "x" * 50, "y" * 30)
    assert len(long) == 64 and long == offered_name("mcp__" + "x" * 50, "y" * 30)


def test_a_cut_custom_call_shows_the_text_written_so_far():
    from rest_bridge.serving.responses_tools import custom_input

    assert custom_input('{"input": "a\\nb"}') == "a\nb"
    assert custom_input('{"input": "*** Add \\"sun\\') == '*** Add "sun'
    assert custom_input('{"input": "ab\\u00') == "ab"
    assert custom_input("not json") == "not json"
