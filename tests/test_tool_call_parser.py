"""Unit tests of the tool-call parser (service/generation/tool_calls.py): the
same text cut into pieces anywhere gives the same content and calls, markup
never reaches the content, and a raw control character inside an argument
string comes out escaped."""

from __future__ import annotations

import json
import random

import pytest

from service.errors import EngineError
from service.generation.job import FinishReason
from service.generation.tool_calls import ChoiceCalls
from service.requests.tools import ToolPlan, call_text

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
PLAN = ToolPlan((("get_weather", "", SCHEMA), ("noop", "", {"type": "object"})), "auto")


def run(text: str, cuts: list[int], reason=FinishReason.STOP):
    parser = ChoiceCalls(PLAN)
    content, calls = "", {}
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    for piece in pieces:
        out, fragments = parser.feed(piece)
        assert "<tool_call>" not in out and "{\"name\"" not in out
        content += out
        for f in fragments:
            if f.id:
                calls[f.index] = [f.name, f.arguments]
            else:
                calls[f.index][1] += f.arguments
    held, finish = parser.finish(reason)
    return content + held, calls, finish


@pytest.mark.parametrize("seed", range(20))
def test_any_cut_gives_the_same_answer(seed):
    text = ("Let me check. " + call_text("get_weather", '{"city": "Paris {x}"}') + "\n"
            + call_text("noop", "{}"))
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 25)))
    content, calls, finish = run(text, cuts)
    assert content == "Let me check." and finish == FinishReason.TOOL_CALLS
    assert calls == {0: ["get_weather", '{"city": "Paris {x}"}'], 1: ["noop", "{}"]}


@pytest.mark.parametrize("cuts", [[], [3, 9, 14], [1, 2, 8, 27]])
def test_text_alone_is_content_whole_and_a_lone_angle_bracket_is_released(cuts):
    text = "a < b, <tool but not a call \n"
    content, calls, finish = run(text, cuts)
    assert (content, calls, finish) == (text, {}, FinishReason.STOP)


def test_a_raw_control_character_in_a_string_is_escaped():
    text = call_text("get_weather", '{"city": "Pa\nris\t"}')
    _, calls, _ = run(text, [30, 31, 33])
    assert calls[0][1] == '{"city": "Pa\\nris\\t"}'
    assert json.loads(calls[0][1]) == {"city": "Pa\nris\t"}


def test_arguments_that_fail_the_schema_are_refused():
    with pytest.raises(EngineError) as caught:
        run(call_text("get_weather", '{"town": "Paris"}'), [20])
    assert caught.value.code == "constrained_output_invalid"


def test_a_call_cut_by_max_tokens_ends_length_as_far_as_it_got():
    text = call_text("get_weather", '{"city": "Par')[:-len('}\n</tool_call>')]
    content, calls, finish = run(text, [12], FinishReason.LENGTH)
    assert (content, finish) == ("", FinishReason.LENGTH)
    assert calls == {0: ["get_weather", '{"city": "Par']}
