"""The OpenAI Agents SDK against miLLM (.venv-eco).

Paths: function_tool (over chat completions, OpenAIChatCompletionsModel) and
responses (the SDK's default: a model given by name, served by its
Responses API model through the default client). Each is an Agent with one
@function_tool and Runner.run for two turns: the tool call (tool_choice
forced to get_weather on the first turn; the SDK's default
reset_tool_choice lets the next turn choose), the tool's result sent back,
then the final answer. Tracing is off (it would post to OpenAI); nothing
else is changed from the SDK's defaults but the base URL, the model, a seed
and max_tokens.
"""

from __future__ import annotations

import asyncio

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from agents.items import ToolCallItem, ToolCallOutputItem
from openai import AsyncOpenAI
from shared import CALLS, MAX_TOKENS, SEED, TOOL_PROMPT, cli, emit, get_weather, tool_call

base_url, model, path = cli()
if path not in ("function_tool", "responses"):
    raise SystemExit(f"unknown path {path}")
set_tracing_disabled(True)


async def main() -> None:
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    if path == "responses":
        set_default_openai_client(client, use_for_tracing=False)
        chosen = model  # a name: the default provider's Responses API model serves it
        # responses.create() takes no seed argument: it goes in the body as an extra.
        seeded = {"extra_body": {"seed": SEED}}
    else:
        chosen = OpenAIChatCompletionsModel(model=model, openai_client=client)
        seeded = {"extra_args": {"seed": SEED}}
    agent = Agent(
        name="weather", instructions="You answer questions about the weather.",
        model=chosen,
        tools=[function_tool(get_weather)],
        model_settings=ModelSettings(tool_choice="get_weather", max_tokens=MAX_TOKENS,
                                     **seeded))
    result = await Runner.run(agent, TOOL_PROMPT)
    emit(output={"class": type(result.final_output).__name__,
                 "repr": repr(result.final_output)[:500]},
         tool_calls=[tool_call(item.raw_item.name, item.raw_item.arguments)
                     for item in result.new_items if isinstance(item, ToolCallItem)],
         tool_outputs=[item.output for item in result.new_items
                       if isinstance(item, ToolCallOutputItem)],
         executed=CALLS, turns=len(result.raw_responses),
         response_ids=[r.response_id for r in result.raw_responses])


asyncio.run(main())
