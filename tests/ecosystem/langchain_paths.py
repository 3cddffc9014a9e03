"""LangChain's ChatOpenAI against miLLM, one path per run (.venv-eco).

Paths: bind_tools (a forced tool_choice), with_structured_output(Weather)
by each method: function_calling, json_schema (the default), json_mode; and
n_choices (ChatOpenAI(n=2): one generation per choice) and vllm_choice (a
vLLM client's extra_body structured_outputs choice).
Nothing is changed from LangChain's defaults but the base URL, the model, a
seed and max_tokens.

json_mode only asks for "a JSON object" (the schema is not sent), so a model
that has never seen Weather cannot be expected to fill it: that path reports
the raw document and whether LangChain could parse it (include_raw=True).
Its keys are free strings, in which the demo model may ramble past max_tokens,
so the path reports the raw text as it came: the test asserts the grammar's
guarantee (a whole object when it stopped, the start of one when cut short).
It has a seed of its own (JSON_MODE_SEED), on which the shipped model closes
its object.
"""

from __future__ import annotations

import openai
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from shared import (
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

# One whose object the demo model (build 5) closes within MAX_TOKENS on both
# engines: the test needs a finished document to parse.
JSON_MODE_SEED = 6

base_url, model, path = cli()
llm = ChatOpenAI(model=model, base_url=base_url, api_key="unused", max_retries=0,
                 seed=JSON_MODE_SEED if path == "json_mode" else SEED,
                 max_tokens=MAX_TOKENS, timeout=120)

if path == "bind_tools":
    reply = llm.bind_tools([tool(get_weather)], tool_choice="get_weather").invoke(TOOL_PROMPT)
    emit(tool_calls=[tool_call(c["name"], c["args"]) for c in reply.tool_calls],
         finish_reason=reply.response_metadata.get("finish_reason"))
elif path in ("function_calling", "json_schema"):
    emit(output=model_report(llm.with_structured_output(Weather, method=path).invoke(PROMPT)))
elif path == "json_mode":
    try:
        result = llm.with_structured_output(Weather, method="json_mode",
                                            include_raw=True).invoke(PROMPT)
    except openai.LengthFinishReasonError as exc:  # cut short: the SDK's parse refuses it
        emit(raw=exc.completion.choices[0].message.content, output=model_report(None),
             parsing_error=type(exc).__name__, finish_reason="length")
    else:
        emit(raw=result["raw"].content, output=model_report(result["parsed"]),
             parsing_error=type(result["parsing_error"]).__name__ if result["parsing_error"]
             else None, finish_reason=result["raw"].response_metadata.get("finish_reason"))
elif path == "n_choices":
    result = ChatOpenAI(model=model, base_url=base_url, api_key="unused", max_retries=0,
                        n=2, max_tokens=8, timeout=120).generate([[HumanMessage(PROMPT)]])
    emit(texts=[g.text for g in result.generations[0]])
elif path == "vllm_choice":
    choices = ["sunny", "rainy", "windy"]
    reply = llm.bind(extra_body={"structured_outputs": {"choice": choices}}).invoke(PROMPT)
    emit(text=reply.content, choices=choices)
else:
    raise SystemExit(f"unknown path {path}")
