"""Bounded grammar work (service/schema_limits.py, service/grammars.py): the
numbers a schema may ask the compiler for are capped, with a 400 naming the
pointer past the cap; compiles run on a thread of their own under a time
limit, at most a few at once, cached by schema."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from service.errors import EngineError
from service.grammars import GrammarCache
from service.requests.tools import FunctionTool, ToolChoice, check_tools
from service.schema_limits import MAX_BOUND, MAX_COUNT, MAX_REPEATS, pattern_repeats
from service.structured_output import JSON_SCHEMA, Constraint, check_schema
from tests import harness
from tests.conftest import MODEL
from tests.http_helpers import post


def prop(**keywords) -> dict:
    return {"type": "object", "properties": {"a": keywords}}


def refusal(schema: dict) -> str:
    with pytest.raises(EngineError) as caught:
        check_schema(json.dumps(schema))
    assert caught.value.code == "response_format_unsupported"
    return caught.value.message


@pytest.mark.parametrize(("pattern", "count"), [
    ("^[a-z]{2,8}$", 8), ("a{3}b{4,}c{,5}", 12), ("(ab){2}(c{1,10}){1,10}", 102),
    ("((a{1,10}){1,10}){1,10}", 1000), (r"\{9}[{]{3}[]{]{4}", 7), ("a*b+c?", 0),
])
def test_pattern_repetitions_are_counted_nested_and_summed(pattern, count):
    assert pattern_repeats(pattern) == count


@pytest.mark.parametrize(("keyword", "at_cap", "past_cap", "kind"), [
    ("maxLength", MAX_COUNT, MAX_COUNT + 1, "string"),
    ("minLength", MAX_COUNT, MAX_COUNT + 1, "string"),
    ("maxItems", MAX_COUNT, MAX_COUNT + 1, "array"),
    ("minItems", MAX_COUNT, MAX_COUNT + 1, "array"),
    ("maximum", MAX_BOUND, MAX_BOUND + 1, "integer"),
    ("minimum", -MAX_BOUND, -MAX_BOUND - 1, "integer"),
    ("exclusiveMaximum", float(MAX_BOUND - 1), 1e300, "number"),
    ("multipleOf", MAX_BOUND, MAX_BOUND + 1, "integer"),
])
def test_each_number_is_capped_naming_its_pointer(keyword, at_cap, past_cap, kind):
    check_schema(json.dumps(prop(type=kind, **{keyword: at_cap})))
    message = refusal(prop(type=kind, **{keyword: past_cap}))
    assert f"/properties/a/{keyword}" in message and str(past_cap) in message


def test_pattern_repetitions_are_budgeted_per_schema():
    check_schema(json.dumps(prop(type="string", pattern=f"^a{{0,{MAX_REPEATS}}}$")))
    assert "/properties/a/pattern" in refusal(
        prop(type="string", pattern=f"^a{{0,{MAX_REPEATS + 1}}}$"))
    assert "/properties/a/pattern" in refusal(prop(type="string", pattern="^(a{1,40}){1,40}$"))
    half = {"type": "string", "pattern": f"^x{{{MAX_REPEATS // 2 + 1}}}$"}
    message = refusal({"type": "object", "properties": {"a": half, "b": half, "c": half}})
    # Named once: the pattern that passed the budget.
    assert "/properties/b/pattern" in message and "/properties/c/" not in message


def test_a_requests_tools_share_one_budget():
    half = json.dumps(prop(type="string", pattern=f"^x{{{MAX_REPEATS // 2 + 1}}}$"))
    tools = (FunctionTool("f", parameters_json=half, strict=True),
             FunctionTool("g", parameters_json=half, strict=True))
    check_tools(tools[:1], ToolChoice("required"), None, [])
    with pytest.raises(EngineError) as caught:
        check_tools(tools, ToolChoice("required"), None, [])
    assert caught.value.param == "tools[1].function.parameters"
    assert "/properties/a/pattern" in caught.value.message
    # Non-strict tools are relaxed instead: the pattern past the budget is dropped.
    loose = (FunctionTool("f", parameters_json=half), FunctionTool("g", parameters_json=half))
    plan = check_tools(loose, ToolChoice("required"), None, [])
    assert "pattern" in plan.schema_of("f")["properties"]["a"]
    assert "pattern" not in plan.schema_of("g")["properties"]["a"]


def test_the_refusal_is_a_400_over_http(stack):
    schema = prop(type="string", maxLength=MAX_COUNT * 10)
    reply, content = post(stack.http_port, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "s", "schema": schema}}})
    body = json.loads(content)
    assert reply.status == 400 and body["error"]["code"] == "response_format_unsupported"
    assert body["error"]["param"] == "response_format"
    assert "/properties/a/maxLength" in body["error"]["message"]


# -- compiling ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    import transformers

    return transformers.AutoTokenizer.from_pretrained(harness.models_dir() / MODEL)


def cache_for(tokenizer, **limits) -> GrammarCache:
    return GrammarCache.for_huggingface(tokenizer, len(tokenizer), [tokenizer.eos_token_id],
                                        **limits)


def slow(tag: str, count: int = 400) -> Constraint:
    """A schema within every cap whose compile takes a while (about 0.2 s for
    400 repetitions of any character on the demo vocabulary)."""
    return Constraint(JSON_SCHEMA, "s", prop(type="string", pattern=f"^{tag}.{{0,{count}}}$"))


class Traced:
    """A constraint that notes the thread its grammar was compiled on."""

    def __init__(self, constraint: Constraint):
        self.constraint, self.thread = constraint, None
        self.key, self.param = constraint.key, constraint.param

    def compile(self, compiler):
        self.thread = threading.current_thread().name
        return self.constraint.compile(compiler)


def test_a_compile_past_the_limit_is_refused_and_not_started_again(tokenizer):
    cache = cache_for(tokenizer, limit_s=0.05)

    async def main():
        with pytest.raises(EngineError) as caught:
            await cache.compiled(slow("a", 1000))
        assert (caught.value.code, caught.value.param) == ("response_format_unsupported",
                                                           "response_format")
        assert "0.05 s" in caught.value.message
        # Asked again while it still runs: the same compile, already too long.
        started = time.monotonic()
        with pytest.raises(EngineError):
            await cache.compiled(slow("a", 1000))
        assert time.monotonic() - started < 0.5

    asyncio.run(main())
    cache.get(slow("a", 1000))  # the abandoned compile finished and was kept
    assert cache.compiled_total == 1


def test_compiles_never_hold_the_default_executor(tokenizer):
    cache = cache_for(tokenizer, max_pending=8)
    traced = Traced(slow("z"))

    async def main():
        waits = [asyncio.ensure_future(cache.compiled(slow(tag))) for tag in "abcdefg"]
        waits.append(asyncio.ensure_future(cache.compiled(traced)))
        await asyncio.sleep(0.05)
        # What the state store does (asyncio.to_thread) is answered at once,
        # though eight grammars are compiling or queued.
        started = time.monotonic()
        await asyncio.to_thread(time.monotonic)
        waited = time.monotonic() - started
        await asyncio.gather(*waits)
        return waited

    assert asyncio.run(main()) < 0.2
    assert traced.thread.startswith("grammar")


def test_too_many_distinct_compiles_at_once_are_refused_as_busy(tokenizer):
    cache = cache_for(tokenizer, max_pending=1)

    async def main():
        first = asyncio.ensure_future(cache.compiled(slow("a")))
        await asyncio.sleep(0)
        with pytest.raises(EngineError) as caught:
            await cache.compiled(slow("b"))
        assert caught.value.code == "queue_full"
        # The same schema joins the compile under way instead.
        await asyncio.gather(first, cache.compiled(slow("a")))

    asyncio.run(main())
    assert cache.compiled_total == 1


def test_grammars_are_cached_by_schema_whatever_its_key_order(tokenizer):
    cache = cache_for(tokenizer)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    reordered = dict(reversed(list(schema.items())))
    first = cache.get(Constraint(JSON_SCHEMA, "x", schema))
    assert cache.get(Constraint(JSON_SCHEMA, "y", reordered)) is first
    assert cache.compiled_total == 1
