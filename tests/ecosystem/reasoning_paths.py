"""Reading a reasoning model's reasoning_content as client libraries do, one
path per run (.venv-eco), against a model with a reasoning format (a DeepSeek
R1-style template: tests/format_models.py).

Paths: langchain_deepseek (LangChain's ChatDeepSeek puts reasoning_content in
additional_kwargs; its ChatOpenAI drops it by design), langchain_stream (the
same, streamed), litellm and litellm_stream (message.reasoning_content and
delta.reasoning_content through LiteLLM's OpenAI-compatible provider). The
thinking budget travels in extra_body; nothing else is changed from each
library's defaults but the base URL, the model and max_tokens.
"""

from __future__ import annotations

import os

from shared import cli, emit

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download at import

QUESTION = "Is it sunny in Paris?"
BUDGET = {"thinking_token_budget": 8}
MAX_TOKENS = 40

base_url, model, path = cli()

if path.startswith("langchain"):
    from langchain_deepseek import ChatDeepSeek

    llm = ChatDeepSeek(model=model, api_base=base_url, api_key="unused", max_retries=0,
                       max_tokens=MAX_TOKENS, temperature=0, extra_body=BUDGET, timeout=120)
    if path == "langchain_deepseek":
        reply = llm.invoke(QUESTION)
        emit(reasoning=reply.additional_kwargs.get("reasoning_content"),
             content=reply.content)
    elif path == "langchain_stream":
        reasoning, content = [], []
        for chunk in llm.stream(QUESTION):
            reasoning.append(chunk.additional_kwargs.get("reasoning_content") or "")
            content.append(chunk.content or "")
        emit(reasoning="".join(reasoning), content="".join(content))
    else:
        raise SystemExit(f"unknown path {path}")
elif path.startswith("litellm"):
    import litellm

    kwargs = dict(model=f"openai/{model}", api_base=base_url, api_key="unused",
                  messages=[{"role": "user", "content": QUESTION}], max_tokens=MAX_TOKENS,
                  temperature=0, extra_body=BUDGET)
    if path == "litellm":
        reply = litellm.completion(**kwargs)
        message = reply.choices[0].message
        emit(reasoning=getattr(message, "reasoning_content", None), content=message.content,
             reasoning_tokens=reply.usage.completion_tokens_details.reasoning_tokens)
    elif path == "litellm_stream":
        reasoning, content = [], []
        for chunk in litellm.completion(stream=True, **kwargs):
            for choice in chunk.choices:
                reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
                content.append(choice.delta.content or "")
        emit(reasoning="".join(reasoning), content="".join(content))
    else:
        raise SystemExit(f"unknown path {path}")
else:
    raise SystemExit(f"unknown path {path}")
