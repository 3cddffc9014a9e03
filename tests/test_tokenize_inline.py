"""Where tokenizer calls run (service/tokenizer_calls.py): short text on the
event loop, long text in a worker thread, and anything in a thread while
another call is in one (the engine's tokenizer lock would hold the loop);
GenerateParams.text_chars is the size they go by."""

from __future__ import annotations

import asyncio
import threading

import pytest

from service.requests.params import MARKUP_CHARS, ChatTurn, GenerateParams
from service.requests.tools import FunctionTool, ToolCallRecord
from service.tokenizer_calls import INLINE_TEXT_CHARS, TokenizerCalls


def _on_loop(chars: int | None) -> bool:
    """Whether a call of `chars` characters ran on the event loop's thread."""
    async def main():
        ran_on = await TokenizerCalls().run(chars, threading.get_ident)
        return ran_on == threading.get_ident()
    return asyncio.run(main())


def test_short_text_runs_on_the_loop_and_long_or_unknown_text_in_a_thread():
    assert _on_loop(0) is True
    assert _on_loop(INLINE_TEXT_CHARS) is True
    assert _on_loop(INLINE_TEXT_CHARS + 1) is False
    assert _on_loop(None) is False


def test_a_short_call_goes_to_a_thread_while_another_is_in_one():
    """Even after the long call's caller stopped waiting: the thread still
    holds the tokenizer until it returns."""
    release = threading.Event()

    async def main():
        calls = TokenizerCalls()
        long = asyncio.ensure_future(calls.run(None, release.wait))
        await asyncio.sleep(0.05)  # the long call is in its thread
        long.cancel()
        busy = await calls.run(1, threading.get_ident)
        release.set()
        while calls.in_threads:  # the thread's end is counted on the loop
            await asyncio.sleep(0.01)
        free = await calls.run(1, threading.get_ident)
        return busy, free

    busy, free = asyncio.run(main())
    assert busy != threading.get_ident()
    assert free == threading.get_ident()


@pytest.mark.parametrize("chars", [1, INLINE_TEXT_CHARS * 2])
def test_an_error_reaches_the_caller_either_way(chars):
    def fail():
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        asyncio.run(TokenizerCalls().run(chars, fail))


def test_text_chars_counts_every_conversation_tool_and_prompt_with_its_markup():
    call = ToolCallRecord(id="c1", name="get", arguments_json='{"a":1}')  # 3 + 7
    turns = (ChatTurn(role="system", content="x" * 100),
             ChatTurn(role="assistant", content="", reasoning_content="r" * 5,
                      tool_calls=(call,)),
             ChatTurn(role="tool", content="y" * 20, name="get"))  # 20 + 3
    params = GenerateParams(model="m", messages=turns, extra_chats=(turns[:1],),
                            tools=(FunctionTool(name="get", description="d" * 10,
                                                parameters_json="{}"),))  # 3 + 10 + 2
    markup = MARKUP_CHARS * (3 + 1 + 1 + 1)  # four turns, one call, one tool
    assert params.text_chars == 100 + 5 + 10 + 23 + 100 + 15 + markup
    prompts = GenerateParams(model="m", prompts=("z" * 40, (1, 2, 3)))
    assert prompts.text_chars == 43 + 2 * MARKUP_CHARS
    empty_turns = GenerateParams(model="m", messages=(ChatTurn(role="user", content=""),) * 100)
    assert empty_turns.text_chars > INLINE_TEXT_CHARS  # many empty turns are not free
