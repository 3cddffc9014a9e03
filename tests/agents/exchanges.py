"""Reading an agent session back from the recorded exchanges (recorder.py).

A tool round trip is judged from the wire, not from the agent's own report:
the bridge answered with a tool call carrying an id, a later request from the
agent carried a result for that same id, and the bridge answered that request.
The three APIs spell this differently, so each has a small reader here:

- Anthropic Messages: a `tool_use` block (`id`) answered by a user `tool_result`
  block (`tool_use_id`);
- OpenAI Responses: a `function_call` / `custom_tool_call` item (`call_id`)
  answered by a `function_call_output` / `custom_tool_call_output` input item;
- OpenAI Chat Completions: `tool_calls[].id` answered by a `role: tool`
  message (`tool_call_id`).

Answers may be streamed (SSE text) or plain JSON; both are read.
"""

from __future__ import annotations

import json

INFERENCE_PATHS = ("/v1/messages", "/v1/responses", "/v1/chat/completions")


def api_of(path: str) -> str | None:
    bare = path.split("?", 1)[0].rstrip("/")
    for known in INFERENCE_PATHS:
        if bare == known:
            return known.rsplit("/", 1)[-1] if known != "/v1/chat/completions" else "chat"
    return None


def sse_events(body) -> list[dict]:
    """The JSON payloads of an SSE body's data lines; a JSON body is one event."""
    if isinstance(body, dict):
        return [body]
    if not isinstance(body, str):
        return []
    events = []
    for line in body.splitlines():
        if line.startswith("data:"):
            payload = line[5:].strip()
            if payload and payload != "[DONE]":
                try:
                    events.append(json.loads(payload))
                except ValueError:
                    pass
    return events


# --- what the bridge answered ---------------------------------------------------

def answer_of(api: str, body) -> dict:
    """{'text': str, 'calls': [(id, name)], 'error': any} of one answer."""
    text, calls, error = [], [], None
    for event in sse_events(body):
        if "error" in event and event.get("type") in (None, "error"):
            error = event["error"]
        if api == "messages":
            if event.get("type") == "message":  # not streamed
                for block in event.get("content") or []:
                    if block.get("type") == "text":
                        text.append(block.get("text", ""))
                    elif block.get("type") in ("tool_use", "server_tool_use"):
                        calls.append((block.get("id"), block.get("name")))
            block = event.get("content_block") or {}
            if event.get("type") == "content_block_start" and block.get("type") == "tool_use":
                calls.append((block.get("id"), block.get("name")))
            delta = event.get("delta") or {}
            if event.get("type") == "content_block_delta" and delta.get("type") == "text_delta":
                text.append(delta.get("text", ""))
        elif api == "responses":
            if event.get("type") == "response.output_text.delta":
                text.append(event.get("delta", ""))
            item = event.get("item") or {}
            if event.get("type") == "response.output_item.done" and item.get("type") in (
                    "function_call", "custom_tool_call"):
                calls.append((item.get("call_id"), _qualified(item)))
            if event.get("object") == "response" and "output" in event:  # not streamed
                for item in event["output"]:
                    if item.get("type") in ("function_call", "custom_tool_call"):
                        calls.append((item.get("call_id"), _qualified(item)))
                    for part in item.get("content") or []:
                        if part.get("type") == "output_text":
                            text.append(part.get("text", ""))
            if event.get("type") in ("response.failed", "error"):
                error = (event.get("response") or {}).get("error") or event.get("error") \
                    or event.get("message")
        else:
            for choice in event.get("choices") or []:
                part = choice.get("delta") or choice.get("message") or {}
                if part.get("content"):
                    text.append(part["content"])
                for call in part.get("tool_calls") or []:
                    if call.get("id"):
                        calls.append((call["id"], (call.get("function") or {}).get("name")))
    return {"text": "".join(text), "calls": calls, "error": error}


def _qualified(item: dict) -> str:
    return f"{item['namespace']}.{item.get('name')}" if item.get("namespace") else item.get("name")


# --- what the agent sent back ---------------------------------------------------

def results_in(api: str, request) -> set[str]:
    """Ids of the tool results a request carries."""
    if not isinstance(request, dict):
        return set()
    ids = set()
    if api == "messages":
        for message in request.get("messages") or []:
            content = message.get("content")
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    ids.add(block.get("tool_use_id"))
    elif api == "responses":
        items = request.get("input")
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict) and item.get("type") in (
                    "function_call_output", "custom_tool_call_output"):
                ids.add(item.get("call_id"))
    else:
        for message in request.get("messages") or []:
            if isinstance(message, dict) and message.get("role") == "tool":
                ids.add(message.get("tool_call_id"))
    return ids


# --- the session as a whole -------------------------------------------------------

def summarize(exchanges: list[dict]) -> dict:
    """Statuses, the first failure, tool calls and round trips, the last answer."""
    failures = [x for x in exchanges if not 200 <= x.get("status", 0) < 300]
    first_failure = None
    if failures:
        x = failures[0]
        first_failure = {"seq": x["seq"], "method": x["method"], "path": x["path"],
                         "status": x.get("status"), "relay_error": x.get("relay_error"),
                         "body": _short(x.get("response"))}
    calls: dict[str, dict] = {}  # call id -> {name, seq}
    round_trips, last_answer, inference = [], None, 0
    for x in exchanges:
        api = api_of(x["path"])
        if api is None or x["method"] != "POST":
            continue
        inference += 1
        answered = 200 <= x.get("status", 0) < 300
        for call_id in results_in(api, x.get("request")):
            call = calls.get(call_id)
            if call and not call.get("returned"):
                call["returned"] = True
                answer = answer_of(api, x.get("response")) if answered else {}
                round_trips.append({"tool": call["name"], "called_in": call["seq"],
                                    "result_sent_in": x["seq"], "answered": answered,
                                    "then": ("a tool call" if answer.get("calls")
                                             else "text" if answer.get("text") else "nothing")})
        if answered:
            answer = answer_of(api, x.get("response"))
            for call_id, name in answer["calls"]:
                calls.setdefault(call_id or f"?{x['seq']}", {"name": name, "seq": x["seq"]})
            last_answer = {"seq": x["seq"], "text": answer["text"],
                           "calls": [name for _, name in answer["calls"]],
                           "error": answer["error"]}
    ignored = sorted({field.strip().strip('"') for x in exchanges for key, value in
                      (x.get("response_headers") or {}).items()
                      if key.lower() == "x-millm-ignored-fields" for field in value.split(",")})
    return {
        "requests": len(exchanges),
        "ignored_fields": ignored,  # what the bridge reported as not honoured
        "inference_requests": inference,
        "statuses": sorted({x.get("status", 0) for x in exchanges}),
        "all_2xx": bool(exchanges) and not failures,
        "first_failure": first_failure,
        "tool_calls": [{"seq": c["seq"], "tool": c["name"], "result_sent_back":
                        bool(c.get("returned"))} for c in calls.values()],
        "round_trips": round_trips,
        "tool_round_trip": any(r["answered"] for r in round_trips),
        "last_answer": last_answer,
    }


def _short(body, limit: int = 2000):
    text = body if isinstance(body, str) else json.dumps(body)
    return text if len(text) <= limit else text[:limit] + "…"
