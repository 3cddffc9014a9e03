"""Anthropic's Python SDK and LangChain's ChatAnthropic against miLLM's
Messages API, one path per run (.venv-eco).

Paths of the SDK: create (a message and its count_tokens), stream (a seeded
request whole and through messages.stream), tools (a forced get_weather, then
the turn that carries its tool_result), errors (each refusal the SDK raises
as its own class), thinking (a reasoning model's thinking block, whole and
streamed). LangChain: bind_tools (a forced tool) and
with_structured_output(Weather) (its default method, a forced tool).
Nothing is changed from the libraries' defaults but the base URL, the model,
max_tokens, and miLLM's `seed` as an extra body field.
"""

from __future__ import annotations

import anthropic
from shared import MAX_TOKENS, PROMPT, SEED, TOOL_DESCRIPTION, TOOL_PROMPT, Weather, cli, emit

base_url, model, path = cli()
# The SDK appends /v1/messages itself: its base URL is the server's root.
root = base_url.removesuffix("/v1")
client = anthropic.Anthropic(base_url=root, api_key="unused", max_retries=0, timeout=120)
GET_WEATHER = {"name": "get_weather", "description": TOOL_DESCRIPTION, "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
    "required": ["city"]}}
HELLO = [{"role": "user", "content": "Say hello to the river."}]


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def usage_of(message) -> dict:
    u = message.usage
    return {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
            "cache_read_input_tokens": u.cache_read_input_tokens}


if path == "create":
    message = client.messages.create(model=model, max_tokens=64, messages=HELLO,
                                     system="You are brief.")
    count = client.messages.count_tokens(model=model, messages=HELLO, system="You are brief.")
    emit(cls=type(message).__name__, id=message.id, role=message.role,
         stop_reason=message.stop_reason, text=text_of(message), usage=usage_of(message),
         count=count.input_tokens, request_id=message._request_id)
elif path == "stream":
    # SDK 2.x has no sampling arguments (newer Claude models fix them); the
    # server still reads temperature, sent here as an extra field like the seed.
    seeded = {"model": model, "max_tokens": 48, "messages": HELLO,
              "extra_body": {"seed": SEED, "temperature": 0.9}}
    whole = client.messages.create(**seeded)
    with client.messages.stream(**seeded) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    emit(whole=text_of(whole), streamed="".join(pieces), final=text_of(final),
         final_stop=final.stop_reason, whole_stop=whole.stop_reason,
         final_usage=usage_of(final), whole_usage=usage_of(whole))
elif path == "tools":
    ask = [{"role": "user", "content": TOOL_PROMPT}]
    first = client.messages.create(model=model, max_tokens=MAX_TOKENS, messages=ask,
                                   tools=[GET_WEATHER],
                                   tool_choice={"type": "tool", "name": "get_weather"},
                                   extra_body={"seed": 1})
    use = next(b for b in first.content if b.type == "tool_use")
    follow = [*ask, {"role": "assistant", "content": first.content},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                            "content": f"Sunny in {use.input.get('city')}."}]}]
    # Seeded, as the first: unseeded, a sampled call could be followed by an
    # answer that ends at once (an empty message is a valid answer, not the
    # one this path checks).
    second = client.messages.create(model=model, max_tokens=48, messages=follow,
                                    tools=[GET_WEATHER], extra_body={"seed": 1})
    emit(stop_reason=first.stop_reason, blocks=[b.type for b in first.content],
         tool={"id": use.id, "name": use.name, "input": use.input},
         answer_stop=second.stop_reason, answer_blocks=[b.type for b in second.content])
elif path == "thinking":
    # A reasoning model (tests/format_models.py's tiny-r1): its reasoning is
    # a thinking block, capped by the budget.
    ask = {"model": model, "max_tokens": 48, "messages": HELLO,
           "thinking": {"type": "enabled", "budget_tokens": 8},
           "extra_body": {"seed": SEED, "temperature": 0.9}}
    whole = client.messages.create(**ask)
    with client.messages.stream(**ask) as stream:
        thought = "".join(e.thinking for e in stream if e.type == "thinking")
        final = stream.get_final_message()
    emit(blocks=[type(b).__name__ for b in whole.content],
         kinds=[b.type for b in whole.content], final_kinds=[b.type for b in final.content],
         thinking=next((b.thinking for b in whole.content if b.type == "thinking"), None),
         streamed_thinking=thought,
         text=text_of(whole), final_text=text_of(final))
elif path == "errors":
    raised = {}
    attempts = {
        "no_max_tokens": dict(model=model, messages=HELLO, max_tokens=anthropic.omit),
        "unknown_model": dict(model="no-such-model", messages=HELLO, max_tokens=8),
        "thinking": dict(model=model, messages=HELLO, max_tokens=512,
                         thinking={"type": "enabled", "budget_tokens": 1024}),
        "bad_role": dict(model=model, max_tokens=8,
                         messages=[{"role": "tool", "content": "x"}]),
    }
    for name, kwargs in attempts.items():
        try:
            client.messages.create(**kwargs)
            raised[name] = None
        except anthropic.APIStatusError as exc:
            raised[name] = {"class": type(exc).__name__, "status": exc.status_code,
                            "type": exc.body["error"]["type"],
                            "message": exc.body["error"]["message"]}
    emit(**raised)
elif path in ("langchain_bind_tools", "langchain_structured"):
    from langchain_anthropic import ChatAnthropic
    from langchain_core.tools import tool
    from shared import get_weather, model_report, tool_call

    llm = ChatAnthropic(model=model, base_url=root, api_key="unused", max_retries=0,
                        max_tokens=MAX_TOKENS, timeout=120, model_kwargs={
                            "extra_body": {"seed": SEED}})
    if path == "langchain_bind_tools":
        reply = llm.bind_tools([tool(get_weather)], tool_choice="get_weather").invoke(
            TOOL_PROMPT)
        emit(tool_calls=[tool_call(c["name"], c["args"]) for c in reply.tool_calls],
             stop_reason=reply.response_metadata.get("stop_reason"))
    else:
        emit(output=model_report(llm.with_structured_output(Weather).invoke(PROMPT)))
else:
    raise SystemExit(f"unknown path {path}")
