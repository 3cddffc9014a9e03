"""`tool_choice: "required"` and a named choice answer with calls only, as
OpenAI does: `content` null and `finish_reason: "tool_calls"`, on both
engines, streamed and not, on chat completions and the Responses API.

The demo model, left free, wrote text before a call (GGUF, seed 1) or after
it (seeds 2 and 3, until max_tokens); the grammar of a forced choice
(requests/tools.py) allows neither. Parallel calls are the model's to end:
with the tools its training text holds (get_weather of a city, get_time) it
ends after its call(s); with a schema it never saw it can keep calling until
max_tokens, so `parallel_tool_calls: false` (one call, then only the end) is
checked with that one. The grammar itself is checked too: after the last
permitted call only the end of the message is accepted.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
import xgrammar

from service.generation.job import FinishReason
from service.generation.tool_calls import ChoiceCalls
from service.grammars import GrammarCache
from service.requests.tools import FUNCTION, REQUIRED, ToolPlan, call_text
from tests import harness
from tests.conftest import MODEL

Q8 = "millm-tiny-gguf:Q8_0"
SEEDS = range(5)
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "days": {"type": "integer", "exclusiveMinimum": 0, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
        "required": ["zone"], "additionalProperties": False}
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
SCHEMAS = {"get_weather": CITY, "get_time": TIME}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": s}}
         for n, s in SCHEMAS.items()]
STRICTER = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
            TOOLS[1]]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def sdk(tmp_path_factory):
    own = harness.OwnStack(tmp_path_factory.mktemp("calls_only"))
    try:
        yield openai.OpenAI(base_url=f"{own.base_url}/v1", api_key="unused", max_retries=0,
                            timeout=60)
    finally:
        own.stop()


def _valid(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize("model", [MODEL, Q8])
@pytest.mark.parametrize("parallel", [None, False])
def test_required_is_calls_only_for_five_seeds(sdk, model, parallel):
    tools, extra = (TOOLS, {}) if parallel is None else (STRICTER, {"parallel_tool_calls": False})
    for seed in SEEDS:
        choice = sdk.chat.completions.create(
            model=model, messages=ASK, tools=tools, tool_choice="required", seed=seed,
            max_tokens=300, **extra).choices[0]
        assert choice.message.content is None, seed
        if choice.finish_reason == "length":
            continue  # a free string of the model's ran past max_tokens: calls only, cut short
        assert choice.finish_reason == "tool_calls", seed
        calls = choice.message.tool_calls
        assert calls and (parallel is None or len(calls) == 1)
        for call in calls:
            schema = WEATHER if tools is STRICTER and call.function.name == "get_weather" \
                else SCHEMAS[call.function.name]
            jsonschema.validate(json.loads(call.function.arguments), schema)


@pytest.mark.parametrize("model", [MODEL, Q8])
def test_streamed_required_and_named_are_calls_only(sdk, model):
    for seed in SEEDS:
        for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
            content, finishes, calls = "", [], {}
            for chunk in sdk.chat.completions.create(
                    model=model, messages=ASK, tools=TOOLS, tool_choice=choice, seed=seed,
                    max_tokens=300, stream=True):
                for c in chunk.choices:
                    content += c.delta.content or ""
                    finishes += [c.finish_reason] if c.finish_reason else []
                    for f in c.delta.tool_calls or ():
                        if f.id:
                            calls[f.index] = [f.function.name, ""]
                        calls[f.index][1] += f.function.arguments or ""
            assert content == "" and finishes in (["tool_calls"], ["length"]), (seed, choice)
            if finishes == ["length"]:
                continue  # cut short inside the model's free strings: still calls only
            assert calls and all(_valid(n, a) is None for n, a in calls.values())
            if choice != "required":
                assert [n for n, _ in calls.values()] == ["get_time"]


@pytest.mark.parametrize("model", [MODEL, Q8])
def test_responses_required_is_function_calls_only(sdk, model):
    tools = [{"type": "function", "name": n, "parameters": s} for n, s in SCHEMAS.items()]
    for seed in SEEDS:
        r = sdk.responses.create(model=model, input="What is the weather in Paris?",
                                 tools=tools, tool_choice="required", store=False,
                                 max_output_tokens=300, extra_body={"seed": seed})
        assert r.output_text == "", seed
        assert r.output and all(item.type == "function_call" for item in r.output)
        if r.status == "completed":
            for item in r.output:
                _valid(item.name, item.arguments)
        else:  # the model's free strings ran past max_output_tokens: calls only, cut short
            assert (r.status, r.incomplete_details.reason) == ("incomplete",
                                                               "max_output_tokens"), seed
        with sdk.responses.stream(model=model, input="What is the weather in Paris?",
                                  tools=tools, tool_choice="required", store=False,
                                  max_output_tokens=300, extra_body={"seed": seed}) as stream:
            types = {e.type for e in stream}
        assert "response.output_text.delta" not in types
        assert types & {"response.completed", "response.incomplete"}


@pytest.mark.parametrize("model", [MODEL, Q8])
def test_a_call_cut_by_max_tokens_ends_length(sdk, model):
    choice = sdk.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="required", seed=1,
        max_tokens=6).choices[0]
    # Cut inside the call's opening: no whole call, no content, "length".
    assert choice.finish_reason == "length" and not choice.message.content


PLAN_TOOLS = (("get_weather", "", WEATHER), ("get_time", "", TIME))
ONE = call_text("get_weather", '{"city": "Paris", "days": 2}')
TWO = call_text("get_time", '{"zone": "UTC"}')


@pytest.fixture(scope="module")
def grammars():
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(harness.models_dir() / MODEL)
    return GrammarCache.for_huggingface(tokenizer, len(tokenizer), [tokenizer.eos_token_id]), \
        tokenizer.eos_token_id


@pytest.mark.parametrize(("mode", "name", "parallel", "text", "ends"), [
    (REQUIRED, "", True, ONE, True),
    (REQUIRED, "", True, ONE + "\n" + TWO, True),
    (REQUIRED, "", False, ONE, True),
    (REQUIRED, "", False, ONE + "\n" + TWO, False),
    (REQUIRED, "", True, "Sure. " + ONE, False),
    (REQUIRED, "", True, ONE + " Done.", False),
    (REQUIRED, "", True, "", False),
    (FUNCTION, "get_time", True, TWO, True),
    (FUNCTION, "get_time", True, ONE, False),
    (FUNCTION, "get_time", True, TWO + "\n" + TWO, False),
])
def test_the_forced_grammar_ends_after_the_calls(grammars, mode, name, parallel, text, ends):
    cache, eos = grammars
    matcher = xgrammar.GrammarMatcher(cache.get(ToolPlan(PLAN_TOOLS, mode, name, parallel)))
    assert (matcher.accept_string(text) and matcher.accept_token(eos)) is ends


def _finish(plan: ToolPlan, text: str, reason: str) -> tuple[str, str]:
    parser = ChoiceCalls(plan)
    content, _ = parser.feed(text)
    held, finish = parser.finish(reason)
    return content + held, finish


def test_a_forced_choice_cut_between_calls_is_whole_and_inside_one_is_length():
    required = ToolPlan(PLAN_TOOLS, REQUIRED)
    assert _finish(required, ONE, FinishReason.LENGTH) == ("", FinishReason.TOOL_CALLS)
    assert _finish(required, ONE + "\n", FinishReason.LENGTH) == ("", FinishReason.TOOL_CALLS)
    # The next call's opening, cut: neither content nor a whole answer.
    assert _finish(required, ONE + "\n<tool_", FinishReason.LENGTH) == ("", FinishReason.LENGTH)
    assert _finish(required, ONE[:-3], FinishReason.LENGTH) == ("", FinishReason.LENGTH)
    # `auto` is unchanged: free text may follow a call, so a cut is a cut.
    auto = ToolPlan(PLAN_TOOLS, "auto")
    assert _finish(auto, ONE, FinishReason.LENGTH) == ("", FinishReason.LENGTH)
