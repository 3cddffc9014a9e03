"""Every error is the OpenAI envelope with the right status; FastAPI's 422
shape and bare 404 pages never reach a client."""

from __future__ import annotations

import json

import pytest

from tests.conftest import MODEL
from tests.http_helpers import post, request

HELLO = [{"role": "user", "content": "Hello!"}]


def envelope(content: bytes) -> dict:
    body = json.loads(content)
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return body["error"]


def test_bad_json(stack):
    reply, content = post(stack.http_port, "/v1/chat/completions", None, raw=b'{"model": ')
    assert reply.status == 400
    assert envelope(content)["code"] == "invalid_json"


def test_non_object_body(stack):
    reply, content = post(stack.http_port, "/v1/chat/completions", [1, 2])
    assert reply.status == 400 and envelope(content)["code"] == "invalid_json"


def test_nan_is_not_json(stack):
    raw = b'{"model": "millm-tiny", "messages": [], "temperature": NaN}'
    reply, content = post(stack.http_port, "/v1/chat/completions", None, raw=raw)
    assert reply.status == 400 and envelope(content)["code"] == "invalid_json"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "messages": HELLO, "temperature": "hot"}, "temperature"),
        ({"model": MODEL, "messages": HELLO, "max_tokens": "10"}, "max_tokens"),
        ({"model": MODEL, "messages": HELLO, "max_tokens": 1.5}, "max_tokens"),
        ({"model": MODEL, "messages": HELLO, "seed": True}, "seed"),
        ({"model": MODEL, "messages": HELLO, "stop": 3}, "stop"),
        ({"model": MODEL, "messages": HELLO, "stream": "yes"}, "stream"),
        ({"model": MODEL, "messages": "Hello"}, "messages"),
        ({"model": MODEL, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"model": MODEL, "messages": [{"content": "x"}]}, "messages[0].role"),
        ({"model": 3, "messages": HELLO}, "model"),
        ({"messages": HELLO}, "model"),
        ({"model": MODEL}, "messages"),
        ({"model": MODEL, "messages": HELLO, "stream_options": {"include_usage": 1}},
         "stream_options.include_usage"),
    ],
)
def test_wrong_types_name_the_field(stack, body, param):
    reply, content = post(stack.http_port, "/v1/chat/completions", body)
    assert reply.status == 400, content
    error = envelope(content)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert error["code"] in ("invalid_type", "missing_required_parameter")


def test_engine_rules_reach_http_unchanged(stack):
    reply, content = post(stack.http_port, "/v1/chat/completions",
                          {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]})
    assert reply.status == 400
    assert envelope(content)["param"] == "messages[0].role"


def test_int_past_the_wire_range(stack):
    reply, content = post(stack.http_port, "/v1/chat/completions",
                          {"model": MODEL, "messages": HELLO, "seed": 2**70})
    assert reply.status == 400 and envelope(content)["param"] == "seed"


def test_image_parts_are_refused_not_dropped(stack):
    body = {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}
    reply, content = post(stack.http_port, "/v1/chat/completions", body)
    assert reply.status == 400
    assert envelope(content)["param"] == "messages[0].content[1]"


def test_unknown_model(stack):
    reply, content = post(stack.http_port, "/v1/completions", {"model": "nope", "prompt": "x"})
    assert reply.status == 404
    error = envelope(content)
    assert (error["code"], error["param"]) == ("model_not_found", "model")


def test_body_too_large(stack):
    big = {"model": MODEL, "prompt": "x" * (5 * 1024 * 1024)}
    reply, content = post(stack.http_port, "/v1/completions", big)
    assert reply.status == 413 and envelope(content)["code"] == "request_too_large"


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/embeddings/x"), ("POST", "/v1/responses/resp_1/cancel"),
     ("POST", "/v1/responses/input_tokens"), ("GET", "/v1/uploads"),
     ("POST", "/v1/audio/speech"), ("POST", "/v1/images/generations"),
     ("DELETE", "/v1/models/millm-tiny"), ("POST", "/v1/threads/t1/runs")],
)
def test_unserved_openai_endpoints(stack, method, path):
    reply, content = request(stack.http_port, method, path)
    assert reply.status == 404
    error = envelope(content)
    assert error["code"] == "endpoint_not_served"
    assert path in error["message"]


def test_unknown_route(stack):
    reply, content = request(stack.http_port, "GET", "/v1/definitely-not-a-thing")
    assert reply.status == 404 and envelope(content)["code"] == "unknown_url"
    reply, content = request(stack.http_port, "GET", "/nothing-here")
    assert reply.status == 404 and envelope(content)["code"] == "unknown_url"


def test_only_a_typed_trailing_slash_redirects(stack):
    """`/api/clusters/` redirects to the list; `/api/clusters/%2F` names a
    cluster "/" and must not (it once got an empty-bodied 307 to the list)."""
    reply, _ = request(stack.http_port, "GET", "/api/clusters/?x=1")
    assert reply.status == 307
    assert reply.getheader("location").endswith("/api/clusters?x=1")
    for path in ("/api/clusters/%2F", "/api/profiles/%2f", "/v1/responses/%2F"):
        reply, content = request(stack.http_port, "GET", path)
        assert reply.status == 404, path
        assert envelope(content)["code"] == "unknown_url", content


def test_wrong_method(stack):
    reply, content = request(stack.http_port, "GET", "/v1/chat/completions")
    assert reply.status == 405 and envelope(content)["code"] == "method_not_allowed"
