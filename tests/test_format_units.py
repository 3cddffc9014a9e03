"""Each family's unit on its own (service/formats): detection from template
text, the grammar and the parser agreeing on every character of a call,
and the reasoning splitter; no model is served here (tests/test_model_formats.py
serves them)."""

from __future__ import annotations

import json

import pytest
import xgrammar

from service import formats
from service.errors import EngineError
from service.formats import deepseek, gemma4, harmony, hermes, llama3, mistral, qwen3_coder
from service.formats.base import OPEN, OPTIONAL, THINK
from service.generation.reasoning import ChoiceReasoning
from service.generation.tool_calls import ChoiceCalls
from service.requests.tools import AUTO, FUNCTION, REQUIRED, ToolPlan
from tests import format_models

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                           "when": {"type": "object"}},
          "required": ["city"], "additionalProperties": False}
TOOLS = (("get_weather", "", SCHEMA), ("ping", "", {"type": "object"}))
SYNTAXES = [hermes.CALLS, llama3.CALLS, mistral.CALLS, deepseek.R1_CALLS, deepseek.V31_CALLS,
            harmony.CALLS, qwen3_coder.CALLS, gemma4.CALLS]
ARGS = '{"city": "Pa{r}is \\"x\\"", "when": {"day": [1, 2]}}'


def test_each_template_is_detected_from_its_text_alone():
    found = {model: formats.detect(t) for model, t in format_models.TEMPLATES.items()}
    assert {m: (f.tool_call_format, f.reasoning_format) for m, f in found.items()} == {
        "tiny-r1": ("deepseek_r1", "think"), "tiny-v31": ("deepseek_v3_1", "think"),
        "tiny-mistral": ("mistral", "none"), "tiny-llama31": ("llama3_json", "none"),
        "tiny-qwen3": ("hermes", "think"), "tiny-harmony": ("harmony", "harmony"),
        "tiny-qwen3-coder": ("qwen3_coder", "none"), "tiny-gemma4": ("gemma4", "gemma4")}
    assert formats.detect("{{ messages }}").tool_call_format == "hermes"
    assert formats.detect("x", ("<think>",)).reasoning_format == "think"


def test_settings_override_and_unknown_names_are_refused_naming_the_setting():
    chosen = formats.resolve(format_models.QWEN3, (), {"tool_call_format": "llama3_json",
                                                       "reasoning_format": "none"})
    assert (chosen.tool_call_format, chosen.reasoning_format) == ("llama3_json", "none")
    for setting in ("tool_call_format", "reasoning_format"):
        with pytest.raises(EngineError) as caught:
            formats.resolve("", (), {setting: "nope"})
        assert caught.value.param == setting and "nope" in caught.value.message


def feed(parser: ChoiceCalls, text: str, size: int):
    content, calls = [], {}
    for i in range(0, len(text), size):
        piece, fragments = parser.feed(text[i:i + size])
        content.append(piece)
        for f in fragments:
            name, arguments = calls.get(f.index, ("", ""))
            calls[f.index] = (name + f.name, arguments + f.arguments)
    held, reason = parser.finish("stop")
    return "".join(content) + held, [calls[k] for k in sorted(calls)], reason


@pytest.mark.parametrize("syntax", SYNTAXES, ids=lambda s: s.name)
@pytest.mark.parametrize("size", [1, 3, 1000])
def test_the_parser_reads_what_the_grammar_allows(syntax, size):
    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo([b"a"]))
    for mode, name in ((FUNCTION, "get_weather"), (REQUIRED, ""), (AUTO, "")):
        plan = ToolPlan(TOOLS, mode, name, True, syntax)
        text = syntax.call_text("get_weather", ARGS)
        if mode == AUTO:
            text = "Let me see. " + text
        matcher = xgrammar.GrammarMatcher(plan.compile(compiler))
        assert matcher.accept_string(text), (syntax.name, mode)
        content, calls, reason = feed(ChoiceCalls(plan), text, size)
        assert reason == "tool_calls" and [name for name, _ in calls] == ["get_weather"]
        assert json.loads(calls[0][1]) == json.loads(ARGS)
        assert content == ("Let me see." if mode == AUTO else "")


@pytest.mark.parametrize("syntax", [mistral.CALLS, deepseek.V31_CALLS, hermes.CALLS,
                                    qwen3_coder.CALLS, gemma4.CALLS], ids=lambda s: s.name)
def test_two_calls_in_one_answer(syntax):
    one, two = ("get_weather", '{"city": "Oslo"}'), ("ping", "{}")
    if syntax.group_open:
        text = (syntax.group_open + syntax.call_open + one[0] + syntax.name_close + one[1]
                + syntax.call_close + syntax.separator + syntax.call_open + two[0]
                + syntax.name_close + two[1] + syntax.call_close + syntax.group_close)
    else:
        text = syntax.call_text(*one) + syntax.separator + syntax.call_text(*two)
    _, calls, reason = feed(ChoiceCalls(ToolPlan(TOOLS, REQUIRED, "", True, syntax)), text, 2)
    assert calls == [one, two] and reason == "tool_calls"


def test_a_choice_cut_inside_markup_ends_length_without_a_refusal():
    syntax = deepseek.V31_CALLS
    parser = ChoiceCalls(ToolPlan(TOOLS, FUNCTION, "ping", True, syntax))
    parser.feed(syntax.group_open + syntax.call_open + "ping" + syntax.name_close + "{}")
    parser.feed("<｜tool\ufffd", cut=True)  # a character cut in half by max_tokens
    assert parser.finish("length") == ("", "length")
    with pytest.raises(EngineError):
        ChoiceCalls(ToolPlan(TOOLS, FUNCTION, "ping", True, syntax)).feed(
            syntax.group_open + "nonsense")


@pytest.mark.parametrize("size", [1, 2, 5, 100])
def test_reasoning_is_split_without_markers_at_any_cut(size):
    text = "\nWeigh it.\nThen answer.\n</think>\n\n{\"ok\": true}"
    splitter = ChoiceReasoning(THINK, OPEN)
    reasoning, answer = [], []
    for i in range(0, len(text), size):
        r, a = splitter.feed(text[i:i + size], 1)
        reasoning.append(r)
        answer.append(a)
    r, a = splitter.finish()
    assert ("".join(reasoning) + r, "".join(answer) + a) == (
        "Weigh it.\nThen answer.", '{"ok": true}')
    assert splitter.tokens >= 1


def test_reasoning_is_only_opened_at_the_start_of_an_optional_answer():
    splitter = ChoiceReasoning(THINK, OPTIONAL)
    assert splitter.feed("Hi <think>no</think>") == ("", "Hi <think>no</think>")
    splitter = ChoiceReasoning(THINK, OPTIONAL)
    assert [splitter.feed(p) for p in (" <thi", "nk>yes</th", "ink> ok")] == [
        ("", ""), ("yes", ""), ("", "ok")]
    cut = ChoiceReasoning(THINK, OPEN)
    assert cut.feed("long thought </thi") == ("long thought", "")
    assert cut.finish() == (" </thi", "")  # max_tokens inside the close: still reasoning


def test_harmony_channels_split_into_reasoning_answer_and_calls():
    text = ("<|channel|>analysis<|message|>Sunny or not?<|end|><|start|>assistant"
            "<|channel|>final<|message|>It is sunny.<|return|>")
    for size in (1, 4, 100):
        splitter = ChoiceReasoning(harmony.REASONING, OPTIONAL)
        parts = [splitter.feed(text[i:i + size]) for i in range(0, len(text), size)]
        parts.append(splitter.finish())
        assert ("".join(r for r, _ in parts), "".join(a for _, a in parts)) == (
            "Sunny or not?", "It is sunny.")
    from service.requests.reasoning import prompt_mode
    assert prompt_mode(harmony.REASONING, "<|end|><|start|>assistant") == OPTIONAL


def test_qwen3_coder_xml_arguments_come_back_as_json():
    plan = ToolPlan(TOOLS, FUNCTION, "get_weather", True, qwen3_coder.CALLS)
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nSt. <Paris>\n</parameter>\n"
            "<parameter=when>\n{\"day\": [1, 2]}\n</parameter>\n</function>\n</tool_call>")
    matcher = xgrammar.GrammarMatcher(plan.compile(
        xgrammar.GrammarCompiler(xgrammar.TokenizerInfo([b"a"]))))
    assert matcher.accept_string(text)
    for size in (1, 7):
        _, calls, reason = feed(ChoiceCalls(plan), text, size)
        assert calls == [("get_weather", '{"city": "St. <Paris>", "when": {"day": [1, 2]}}')]


WALK_SCHEMA = {"type": "object", "properties": {
    "city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "when": {"type": "object", "properties": {"day": {"type": "integer", "minimum": 0,
                                                      "maximum": 9}},
             "required": ["day"], "additionalProperties": False}},
    "required": ["city", "days", "when"], "additionalProperties": False}


@pytest.fixture(scope="module")
def demo_vocabulary():
    from transformers import AutoTokenizer

    from tests import harness

    tokenizer = AutoTokenizer.from_pretrained(harness.models_dir() / "millm-tiny")
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer),
                                                   stop_token_ids=[2])
    return tokenizer, xgrammar.GrammarCompiler(info)


@pytest.mark.parametrize("syntax", SYNTAXES, ids=lambda s: s.name)
def test_whatever_the_grammar_lets_a_model_write_the_parser_reads(syntax, demo_vocabulary):
    """Random walks through each syntax's grammar over the demo vocabulary
    (layout whitespace and all): every finished one parses into a call whose
    arguments validate."""
    import jsonschema
    import torch

    tokenizer, compiler = demo_vocabulary
    plan = ToolPlan((("get_weather", "", WALK_SCHEMA),), FUNCTION, "get_weather", True, syntax)
    grammar = plan.compile(compiler)
    finished = 0
    for seed in range(8):
        torch.manual_seed(seed)
        matcher, out = xgrammar.GrammarMatcher(grammar), []
        mask = xgrammar.allocate_token_bitmask(1, tokenizer.vocab_size + 16)
        for _ in range(400):
            matcher.fill_next_token_bitmask(mask)
            logits = torch.randn(1, mask.shape[1] * 32)
            xgrammar.apply_token_bitmask_inplace(logits, mask)
            token = int(logits[0, :len(tokenizer)].argmax())
            assert matcher.accept_token(token)
            if matcher.is_terminated():
                break
            out.append(token)
        else:
            continue
        finished += 1
        _, calls, reason = feed(ChoiceCalls(plan), tokenizer.decode(out), 1)
        assert reason == "tool_calls" and [n for n, _ in calls] == ["get_weather"]
        jsonschema.validate(json.loads(calls[0][1]), WALK_SCHEMA)
    assert finished >= 4


def test_an_end_of_generation_token_closing_a_call_closes_it():
    """gpt-oss ends a call with <|call|>, an end-of-generation token: the
    text stops before it, and the end closes the call."""
    plan = ToolPlan(TOOLS, FUNCTION, "ping", True, harmony.CALLS)
    parser = ChoiceCalls(plan)
    _, fragments = parser.feed(harmony.CALLS.call_text("ping", "{}").removesuffix("<|call|>"))
    assert [f.name for f in fragments if f.name] == ["ping"]
    assert parser.finish("stop") == ("", "tool_calls")
    cut = ChoiceCalls(plan)
    cut.feed("<|channel|>commentary to=functions.ping <|constrain|>json<|message|>{")
    with pytest.raises(EngineError):
        cut.finish("stop")
