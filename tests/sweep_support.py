"""The systematic sweep, and what every fuzzer checks of an answer.

The sweep sends every route × every field that route knows × one value of
each JSON type, on an otherwise valid body, and lists every answer that is
a 5xx, a reset connection, a missing status, or a stream that ended in a
server fault. A field's list is the union of what the route's schema
declares and what the engine's field table (service/requests/fields.py)
rules on; the management routes use their protobuf request's fields (and
the documents' keys, and the query parameters of those that read one). A
second sweep replaces every value at any depth of a set of full valid bodies
(FULL_BODIES) the same way, and odd strings where a string is. Random
fuzzers find what one value per type misses; this finds what random drawing
can miss for a long time (one field, one type).

Everything here takes a stack (tests/harness.py OwnStack, or any object
with `http_port`), so the same sweep can run against another stack (a
PostgreSQL one, say).
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from millm.v1 import monitoring_service_pb2, steering_service_pb2
from rest_bridge.protocol.chat import ChatCompletionRequest
from rest_bridge.protocol.completions import CompletionRequest
from rest_bridge.protocol.embeddings import EmbeddingRequest
from rest_bridge.protocol.messages import CountTokensRequest, MessagesRequest
from rest_bridge.protocol.responses import ResponsesRequest
from rest_bridge.serving import monitoring_api
from rest_bridge.serving.steering_api import ROUTES as STEERING_ROUTES
from service.errors import ERROR_CODES
from service.requests.fields import RULES
from tests import claude_code_body
from tests.conftest import MODEL

# One value of each JSON type: a string, the empty string, integers small,
# negative and past int64, a float, a bool, null, empty and non-empty lists,
# an object.
VALUES = ("x", "", 1, -1, 2**64, 0.5, True, None, [], ["x", 1], {"a": 1})

# The codes of a fault of the server, never of the request: the engine's
# 5xx codes and those the bridge makes of a failed call.
SERVER_CODES = frozenset({code for code, row in ERROR_CODES.items() if row.http_status >= 500}
                         | {"internal_error", "engine_unavailable", "engine_timeout"})

BASES = {
    "/v1/chat/completions": {"model": MODEL, "max_tokens": 1,
                             "messages": [{"role": "user", "content": "Hi"}]},
    "/v1/completions": {"model": MODEL, "max_tokens": 1, "prompt": "Hi"},
    "/v1/embeddings": {"model": MODEL, "input": "Hi"},
    "/v1/responses": {"model": MODEL, "max_output_tokens": 1, "input": "Hi", "store": False},
    "/v1/messages": {"model": MODEL, "max_tokens": 1,
                     "messages": [{"role": "user", "content": "Hi"}]},
    "/v1/messages/count_tokens": {"model": MODEL,
                                  "messages": [{"role": "user", "content": "Hi"}]},
}
STREAMED = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
SCHEMAS = {"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest,
           "/v1/embeddings": EmbeddingRequest, "/v1/responses": ResponsesRequest,
           "/v1/messages": MessagesRequest, "/v1/messages/count_tokens": CountTokensRequest}
# Anthropic's Messages API answers in Anthropic's envelope and events.
ANTHROPIC = ("/v1/messages", "/v1/messages/count_tokens")
# A swept length limit falls back on the other one, so that a null there
# never asks for a whole default-length generation.
_FALLBACK_LIMIT = {"max_tokens": ("max_completion_tokens", 1),
                   "max_completion_tokens": ("max_tokens", 1)}


def route_fields(path: str) -> list[str]:
    schema = SCHEMAS[path]
    names = {field.alias or name for name, field in schema.model_fields.items()}
    return sorted(names | set(RULES))


def generation_cases() -> list[tuple[str, str, dict]]:
    """(method, path, body) for every /v1 route × field × value."""
    cases = []
    for path, base in BASES.items():
        for name in route_fields(path):
            for value in VALUES:
                body = {k: v for k, v in base.items() if k != name}
                if name in _FALLBACK_LIMIT and path in ("/v1/chat/completions",
                                                        "/v1/completions"):
                    body.pop("max_tokens", None)
                    other, limit = _FALLBACK_LIMIT[name]
                    body[other] = limit
                body[name] = value
                cases.append(("POST", path, body))
                if path in STREAMED and name != "stream":
                    # Streamed too: a refusal after the 200 is an event, read to the end.
                    cases.append(("POST", path, {**body, "stream": True}))
    return cases


def _message_fields(route) -> list[str]:
    module = (monitoring_service_pb2 if route.service == "monitoring"
              else steering_service_pb2)
    method = module.DESCRIPTOR.services_by_name[
        "MonitoringService" if route.service == "monitoring" else "SteeringService"
    ].methods_by_name[route.rpc]
    return sorted({f.json_name for f in method.input_type.fields}
                  | {f.name for f in method.input_type.fields})


# The feature workbench's routes (steering/search.py, cards, explanations).
WORKBENCH = ("SearchSaeFeatures", "SetFeatureExplanation", "ImportFeatureExplanations")
# The documents' own keys (cluster and circuit formats), for the import routes.
DOCUMENT_FIELDS = ("format", "name", "description", "members", "edges", "rung",
                   "intensity_range", "intensity", "mode", "fallback_cluster", "entries")


def management_cases() -> list[tuple[str, str, dict]]:
    """(method, path, body) for every /api route with a body × field × value;
    named routes name something that is not there."""
    cases = []
    for route in (*STEERING_ROUTES, *monitoring_api.ROUTES):
        if route.method not in ("POST", "PUT", "PATCH"):
            continue
        paths = [route.path.format(sae_id="sae_none", name="sweep-none", index=3)]
        if route.rpc in WORKBENCH:
            # An unknown SAE is refused before any field is read: on a real one too.
            paths.append(route.path.format(sae_id="sae_millm-tiny-res-l1", index=3))
        fields = (DOCUMENT_FIELDS if route.rpc.startswith("Import")
                  else _message_fields(route))
        for path in paths:
            for name in fields:
                for value in VALUES:
                    cases.append((route.method, path, {name: value}))
    # The query parameters of the routes that read one, as query text.
    for path, names in (("/api/saes/sae_millm-tiny-res-l1/features", ("query", "limit",
                                                                       "offset")),
                        ("/api/monitoring", ("model",))):
        for name in names:
            for text in _query_texts():
                cases.append(("GET", f"{path}?{name}={text}", None))
    return cases


def _query_texts() -> list[str]:
    """VALUES as a query parameter's text (JSON for all but strings), quoted."""
    return [urllib.parse.quote(v if isinstance(v, str) else json.dumps(v), safe="")
            for v in VALUES]


def responses_read_cases(response_id: str) -> list[tuple[str, str, None]]:
    """GET, DELETE and input_items of a stored response and of odd ids, and
    each query parameter × a value of each type (as query text)."""
    cases = []
    ids = [response_id, "resp_none", "", "x", "resp_%00", "%00", "resp_" + "a" * 300,
           "resp_%F0%9F%98%80", "chatcmpl-1", "resp_a%2Fb"]
    for rid in ids:
        for method, suffix in (("GET", ""), ("GET", "/input_items")):
            cases.append((method, f"/v1/responses/{rid}{suffix}", None))
    for name in ("limit", "order", "after", "before"):
        for text in _query_texts():
            cases.append(("GET", f"/v1/responses/{response_id}/input_items?{name}={text}",
                          None))
    for text in _query_texts():
        cases.append(("GET", f"/v1/responses/{response_id}?stream={text}", None))
    cases += [("DELETE", f"/v1/responses/{rid}", None) for rid in ids[1:]]
    return cases


# Full valid bodies: every value inside them, at any depth, is swept too.
_TOOL_HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Hi"}], "name": "u"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
_PARAMETERS = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 4}}}
FULL_BODIES = (
    ("POST", "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 1, "messages": _TOOL_HISTORY,
        "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                    "parameters": _PARAMETERS,
                                                    "strict": True}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}}}),
    ("POST", "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 1, "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "Hi"}], "seed": 1,
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "s", "schema": _PARAMETERS, "strict": True}}}),
    ("POST", "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}],
        "return_sae_activations": {"sae_id": "sae_millm-tiny-res-l1", "features": [1, 2],
                                   "top_k": 2, "positions": {"start": 0, "end": 1},
                                   "read_point": "pre_steering"}}),
    ("POST", "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}],
        "stop": ["a", "b"], "extra_messages": [[{"role": "user", "content": "Yo"}]]}),
    ("POST", "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 1, "logprobs": True, "top_logprobs": 2,
        "allowed_token_ids": [1, 2], "messages": [{"role": "user", "content": "Hi"}]}),
    ("POST", "/v1/completions", {
        "model": MODEL, "max_tokens": 1, "prompt": ["Hi", "Yo"], "logprobs": 1, "echo": True,
        "stop": ["a"]}),
    ("POST", "/v1/completions", {
        "model": MODEL, "max_tokens": 1, "prompt": "Hi",
        "return_sae_activations": {"positions": "prompt", "top_k": 1}}),
    ("POST", "/v1/completions", {"model": MODEL, "max_tokens": 1, "prompt": [[1, 2], [3]]}),
    ("POST", "/v1/embeddings", {"model": MODEL, "input": ["Hi", "Yo"],
                                "encoding_format": "float"}),
    ("POST", "/v1/embeddings", {"model": MODEL, "input": [[1, 2], [3]]}),
    ("POST", "/v1/responses", {
        "model": MODEL, "max_output_tokens": 1, "store": False, "instructions": "Be brief.",
        "input": [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "Hi"}]},
                  {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "ok"}],
        "tools": [{"type": "function", "name": "f", "description": "d",
                   "parameters": _PARAMETERS, "strict": True}],
        "tool_choice": {"type": "function", "name": "f"}, "metadata": {"k": "v"}}),
    ("POST", "/v1/responses", {
        "model": MODEL, "max_output_tokens": 1, "stream": True, "input": "Hi",
        "text": {"format": {"type": "json_schema", "name": "s", "schema": _PARAMETERS,
                            "strict": True}}, "include": [], "reasoning": {"effort": None}}),
    # As Codex CLI sends it: a namespace, a custom tool with a grammar, a hosted tool.
    ("POST", "/v1/responses", {
        "model": MODEL, "max_output_tokens": 1, "store": False, "stream": True,
        "input": [{"type": "message", "role": "developer",
                   "content": [{"type": "input_text", "text": "Be brief."}]},
                  {"type": "custom_tool_call", "call_id": "c2", "name": "patch", "input": "a"},
                  {"type": "custom_tool_call_output", "call_id": "c2", "output": "ok"},
                  {"type": "function_call", "call_id": "c3", "name": "g", "namespace": "ns",
                   "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c3", "output": "ok"}],
        "tools": [{"type": "namespace", "name": "ns", "description": "d", "tools": [
                      {"type": "function", "name": "g", "parameters": _PARAMETERS}]},
                  {"type": "custom", "name": "patch", "description": "d",
                   "format": {"type": "grammar", "syntax": "lark",
                              "definition": 'start: "a"+'}},
                  {"type": "web_search", "external_web_access": False}],
        "tool_choice": "auto", "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "k", "client_metadata": {"originator": "codex_exec"}}),
    ("POST", "/v1/messages", {
        "model": MODEL, "max_tokens": 1, "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "t", "signature": "s"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": "x"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": False,
                 "content": [{"type": "text", "text": "ok"}]},
                {"type": "text", "text": "And now?"}]}],
        "tools": [{"name": "f", "description": "d", "input_schema": _PARAMETERS}],
        "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": True},
        "metadata": {"user_id": "u"}, "temperature": 0.5,
        "top_p": 0.9, "top_k": 5, "thinking": {"type": "disabled"}}),
    ("POST", "/v1/messages", {
        "model": MODEL, "max_tokens": 1, "stream": True, "seed": 1, "system": "Be brief.",
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any"}}),
    ("POST", "/v1/messages", {
        "model": MODEL, "max_tokens": 1, "stop_sequences": ["a", "b"],
        "messages": [{"role": "user", "content": "Hi"}]}),
    # As coding agents send it (tests/claude_code_body.py).
    ("POST", "/v1/messages", claude_code_body.compact_request(MODEL, _PARAMETERS)),
    ("POST", "/v1/messages/count_tokens", {
        "model": MODEL, "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "tools": [{"name": "f", "input_schema": _PARAMETERS}],
        "tool_choice": {"type": "auto"}}),
    ("POST", "/api/profiles", {"name": "sweep-profile", "description": "d", "entries": [
        {"layer": 1, "feature": 3, "strength": 2.0, "sae_id": "sae_millm-tiny-res-l1"}]}),
    ("POST", "/api/clusters", {"format": "millm.cluster.v1", "name": "sweep-cluster",
                               "intensity_range": [0.5, 1.5], "intensity": 1.0,
                               "members": [{"layer": 1, "feature": 3, "strength": 8.0}]}),
    ("POST", "/api/circuits", {"format": "millm.circuit.v1", "name": "sweep-circuit", "rung": 1,
                               "members": [{"layer": 1, "feature": 3, "strength": 6.0}]}),
    ("PUT", "/api/steering", {"enabled": False, "values": [
        {"layer": 1, "feature": 3, "strength": 1.0}]}),
    ("POST", "/api/probes", {"name": "sweep-probe", "sae_id": "sae_millm-tiny-res-l1",
                             "layer": 1, "features": [{"index": 3, "weight": 1.0}],
                             "threshold": 1.0}),
    ("PUT", "/api/monitoring", {"model": MODEL, "enabled": False}),
)


def _paths(value, here: tuple = ()):
    """Every place below the top of a body: keys of objects, items of lists."""
    items = (value.items() if isinstance(value, dict)
             else enumerate(value) if isinstance(value, list) else ())
    for key, child in items:
        yield (*here, key)
        yield from _paths(child, (*here, key))


def _replaced(body, path: tuple, value):
    if not path:
        return value
    out = dict(body) if isinstance(body, dict) else list(body)
    out[path[0]] = _replaced(body[path[0]], path[1:], value)
    return out


# Strings that broke parsers before, for the places that hold a string: NUL,
# the model's own markers, JSON text nested far too deep or with NaN (call
# arguments and schemas are JSON inside a string), and 100,000 characters.
ODD_STRINGS = ("\x00", "<|im_start|>", "[" * 5_000, '{"a": NaN}', "\u202e" * 100_000)


def _at(body, path: tuple):
    for key in path:
        body = body[key]
    return body


def nested_cases() -> list[tuple[str, str, dict]]:
    """(method, path, body) for every value at any depth of FULL_BODIES × VALUES
    (the top level is the field sweep's), and ODD_STRINGS where a string is:
    the nested shapes get the same bar."""
    return [(method, route, _replaced(body, where, value))
            for method, route, body in FULL_BODIES
            for where in _paths(body) if len(where) > 1
            for value in (*VALUES, *(ODD_STRINGS if isinstance(_at(body, where), str)
                                     else ()))]


def send(port: int, method: str, path: str, body,
         conn: http.client.HTTPConnection | None = None) -> tuple[int | None, bytes, str | None]:
    """(status, content, problem): problem says why there is no proper answer.
    With `conn`, on that kept-alive connection, as the SDKs' pools send: a
    server that drops a connection it did not say it would close fails the
    next request on it (http.client reopens one that said so)."""
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        return reply.status, reply.read(), None
    except (ConnectionError, http.client.HTTPException, OSError) as exc:
        conn.close()
        return None, b"", f"no answer: {type(exc).__name__}: {exc}"
    finally:
        if own:
            conn.close()


def stream_problem(content: bytes) -> str | None:
    """What is wrong with a streamed body read to its end: an error event for
    a fault of the server (chat and completions), a response.failed or an
    error event caused by the server (responses), or no proper end."""
    payloads = [line[len(b"data: "):] for line in content.split(b"\n")
                if line.startswith(b"data: ")]
    if not payloads:
        return "a stream with no events"
    responses = b"[DONE]" not in payloads
    for payload in payloads:
        if payload == b"[DONE]":
            continue
        event = json.loads(payload)
        error = event.get("error") if isinstance(event, dict) else None
        if event.get("type") == "response.failed":
            error = event["response"].get("error")
            if not isinstance(error, dict):
                return f"a response.failed that says no error: {payload[:300]!r}"
        if error is not None and (not isinstance(error, dict) or not error.get("code")):
            return f"an error event without a code: {payload[:300]!r}"
        if error and (error.get("code") in SERVER_CODES or error.get("type") == "server_error"):
            return f"a server fault inside the stream: {json.dumps(error)[:300]}"
    if responses:
        last = json.loads(payloads[-1]).get("type")
        if last not in ("response.completed", "response.incomplete", "response.failed"):
            return f"a responses stream that ends with {last!r}"
    elif payloads[-1] != b"[DONE]":
        return "a stream that does not end with [DONE]"
    return None


def anthropic_stream_problem(content: bytes) -> str | None:
    """A Messages stream read to its end: it ends with message_stop, or with
    an error event for a fault of the request, never of the server."""
    payloads = [json.loads(line[len(b"data: "):]) for line in content.split(b"\n")
                if line.startswith(b"data: ")]
    if not payloads or payloads[0].get("type") != "message_start":
        return f"a Messages stream that does not start with message_start: {content[:300]!r}"
    last = payloads[-1]
    if last.get("type") == "error":
        error = last.get("error")
        if not isinstance(error, dict) or error.get("type") in (None, "api_error",
                                                               "overloaded_error"):
            return f"a server fault inside the stream: {json.dumps(last)[:300]}"
    elif last.get("type") != "message_stop":
        return f"a Messages stream that ends with {last.get('type')!r}"
    return None


def problem(method: str, path: str, body, status: int | None, content: bytes,
            no_answer: str | None) -> str | None:
    """Why this answer fails the fuzzers' bar, or None."""
    if no_answer is not None:
        return no_answer
    if status >= 500:
        return f"{status}: {content[:300]!r}"
    if status >= 400 and path.split("?")[0] in ANTHROPIC:
        try:
            envelope = json.loads(content)
            assert envelope["type"] == "error"
            assert set(envelope["error"]) == {"type", "message"}
        except (ValueError, KeyError, TypeError, AssertionError):
            return f"{status} without Anthropic's envelope: {content[:300]!r}"
        return None
    if status >= 400:
        try:
            error = json.loads(content)["error"]
            assert set(error) == {"message", "type", "param", "code"}
        except (ValueError, KeyError, TypeError, AssertionError):
            return f"{status} without the OpenAI envelope: {content[:300]!r}"
        return None
    if isinstance(body, dict) and body.get("stream") is True and method == "POST":
        return (anthropic_stream_problem(content) if path in ANTHROPIC
                else stream_problem(content))
    return None


def sweep(stack, cases, workers: int = 4) -> list[str]:
    """Send every case (a few at once, each worker on one kept-alive
    connection) and return the failures, described."""
    local = threading.local()

    def one(case) -> str | None:
        method, path, body = case
        if not hasattr(local, "conn"):
            local.conn = http.client.HTTPConnection("127.0.0.1", stack.http_port, timeout=120)
        status, content, no_answer = send(stack.http_port, method, path, body, local.conn)
        found = problem(method, path, body, status, content, no_answer)
        if found is None:
            return None
        shown = json.dumps(body)[:300] if body is not None else ""
        return f"{method} {path[:200]} {shown} -> {found}"

    with ThreadPoolExecutor(workers) as pool:
        return [f for f in pool.map(one, cases) if f is not None]


def alive(stack) -> str | None:
    """None when the bridge is ready and the engine still generates."""
    status, content, no_answer = send(stack.http_port, "GET", "/readyz", None)
    if no_answer or status != 200:
        return f"/readyz: {status} {no_answer or content[:200]!r}"
    status, content, no_answer = send(stack.http_port, "POST", "/v1/chat/completions",
                                      BASES["/v1/chat/completions"])
    if no_answer or status != 200:
        return f"a plain chat completion: {status} {no_answer or content[:200]!r}"
    return None
