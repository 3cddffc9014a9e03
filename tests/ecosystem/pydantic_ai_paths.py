"""pydantic-ai against miLLM, one path per run (.venv-eco).

Paths: output (Agent(output_type=Weather): pydantic-ai's default structured
output, a forced "final_result" tool), native_output (NativeOutput(Weather):
the schema as response_format instead) and tool (an agent with one
@agent.tool_plain tool and text output: the tool call, its result sent back,
then the answer), and responses_tool: the same tool agent made from the
"openai:<model>" shorthand, which pydantic-ai serves with its Responses API
model and OPENAI_BASE_URL. Nothing is changed from pydantic-ai's defaults but the
base URL, the model, a seed and max_tokens, and, on the tool path, a
capability that forces get_weather on the first step only (the way
pydantic-ai documents for that): a tiny random model would otherwise answer
in text as often as not.
"""

from __future__ import annotations

import os

from pydantic_ai import Agent, NativeOutput
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from shared import (
    CALLS,
    MAX_TOKENS,
    PROMPT,
    SEED,
    TOOL_PROMPT,
    Weather,
    cli,
    emit,
    get_weather,
    model_report,
    tool_call,
)

base_url, model_name, path = cli()
model = OpenAIChatModel(model_name, provider=OpenAIProvider(base_url=base_url,
                                                            api_key="unused"))
settings = {"seed": SEED, "max_tokens": MAX_TOKENS}


class ToolFirst(AbstractCapability):
    def get_model_settings(self):
        return lambda ctx: {"tool_choice": ["get_weather"]} if ctx.run_step == 1 else {}


if path == "output":
    agent = Agent(model, output_type=Weather, model_settings=settings)
elif path == "native_output":
    agent = Agent(model, output_type=NativeOutput(Weather), model_settings=settings)
elif path == "tool":
    agent = Agent(model, model_settings=settings, capabilities=[ToolFirst()])
    agent.tool_plain(get_weather)
elif path == "responses_tool":
    os.environ["OPENAI_BASE_URL"] = base_url
    # The Responses API has no seed field: it goes as an extra, as on chat.
    agent = Agent(f"openai:{model_name}", capabilities=[ToolFirst()],
                  model_settings={"max_tokens": MAX_TOKENS, "extra_body": {"seed": SEED}})
    agent.tool_plain(get_weather)
else:
    raise SystemExit(f"unknown path {path}")

result = agent.run_sync(TOOL_PROMPT if path.endswith("tool") else PROMPT)
calls = [tool_call(part.tool_name, part.args_as_dict())
         for message in result.all_messages() if isinstance(message, ModelResponse)
         for part in message.parts if isinstance(part, ToolCallPart)]
responses = [m for m in result.all_messages() if isinstance(m, ModelResponse)]
emit(output=model_report(result.output), tool_calls=calls, executed=CALLS,
     requests=len(responses), model_class=type(agent.model).__name__,
     response_ids=[m.provider_response_id for m in responses])
