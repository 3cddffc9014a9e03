"""Short input is tokenized on the event loop, long input in a worker thread
(service/inference.py, on_loop_or_thread), by the characters a request asks
to tokenize (GenerateParams.text_chars)."""

from __future__ import annotations

import asyncio
import threading

from service.inference import INLINE_TEXT_CHARS, on_loop_or_thread
from service.requests.params import ChatTurn, GenerateParams
from service.requests.tools import FunctionTool, ToolCallRecord


def _thread_of(chars: int) -> bool:
    """Whether fn ran on the event loop's own thread."""
    async def main():
        loop_thread = threading.get_ident()
        ran_on = await on_loop_or_thread(chars, threading.get_ident)
        return ran_on == loop_thread
    return asyncio.run(main())


def test_short_input_runs_on_the_loop_and_long_input_in_a_thread():
    assert _thread_of(0) is True
    assert _thread_of(INLINE_TEXT_CHARS) is True
    assert _thread_of(INLINE_TEXT_CHARS + 1) is False


def test_an_error_reaches_the_caller_either_way():
    def fail():
        raise ValueError("no")

    for chars in (1, INLINE_TEXT_CHARS * 2):
        try:
            asyncio.run(on_loop_or_thread(chars, fail))
        except ValueError as exc:
            assert str(exc) == "no"
        else:
            raise AssertionError("the error was lost")


def test_text_chars_counts_every_conversation_tool_and_prompt():
    call = ToolCallRecord(id="c1", name="get", arguments_json='{"a":1}')  # 3 + 7
    turns = (ChatTurn(role="system", content="x" * 100),
             ChatTurn(role="assistant", content="", reasoning_content="r" * 5,
                      tool_calls=(call,)),
             ChatTurn(role="tool", content="y" * 20, name="get"))  # 20 + 3
    params = GenerateParams(model="m", messages=turns, extra_chats=(turns[:1],),
                            tools=(FunctionTool(name="get", description="d" * 10,
                                                parameters_json="{}"),))  # 3 + 10 + 2
    assert params.text_chars == 100 + 5 + 10 + 23 + 100 + 15
    prompts = GenerateParams(model="m", prompts=("z" * 40, (1, 2, 3)))
    assert prompts.text_chars == 43
