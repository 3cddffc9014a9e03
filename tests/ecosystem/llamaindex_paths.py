"""LlamaIndex's OpenAILike against miLLM, one path per run (.venv-eco-legacy:
llama-index-llms-openai needs openai<3).

Paths: structured_predict (Weather through a PromptTemplate: the default
program for a function-calling model, a forced tool), chat_with_tools and
predict_and_call (a FunctionTool, tool_required=True: a tiny random model
would otherwise answer in text as often as not). Nothing else is changed
from the defaults but the base URL, the model, a seed and max_tokens.

LlamaIndex keeps only the description of an Annotated parameter, so its
get_weather states the maxLength as a Field default (its own idiom).
"""

from __future__ import annotations

from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai_like import OpenAILike
from pydantic import Field
from shared import (
    CALLS,
    MAX_TOKENS,
    PROMPT,
    SEED,
    TOOL_DESCRIPTION,
    TOOL_PROMPT,
    Weather,
    cli,
    emit,
    get_weather,
    model_report,
    tool_call,
)

base_url, model, path = cli()
llm = OpenAILike(model=model, api_base=base_url, api_key="unused", is_chat_model=True,
                 is_function_calling_model=True, max_tokens=MAX_TOKENS, max_retries=0,
                 timeout=120, additional_kwargs={"seed": SEED})


def weather_tool(city: str = Field(max_length=24, description="The city's name.")) -> str:
    return get_weather(city)


tool = FunctionTool.from_defaults(weather_tool, name="get_weather", description=TOOL_DESCRIPTION)

if path == "structured_predict":
    output = llm.structured_predict(Weather, PromptTemplate("{question}"), question=PROMPT)
    emit(output=model_report(output))
elif path == "chat_with_tools":
    response = llm.chat_with_tools([tool], user_msg=TOOL_PROMPT, tool_required=True)
    emit(tool_calls=[tool_call(s.tool_name, s.tool_kwargs)
                     for s in llm.get_tool_calls_from_response(response)])
elif path == "predict_and_call":
    response = llm.predict_and_call([tool], user_msg=TOOL_PROMPT, tool_required=True)
    emit(tool_calls=[tool_call(s.tool_name, s.raw_input["kwargs"]) for s in response.sources],
         tool_outputs=[s.content for s in response.sources], executed=CALLS,
         output={"class": type(response.response).__name__})
else:
    raise SystemExit(f"unknown path {path}")
