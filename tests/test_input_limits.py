"""Huge inputs are ordinary 4xx, never a 5xx: errors that quote what the
client sent (a model name, a profile, every unused field) are bounded so the
status fits gRPC's trailer, and a deeply nested management body is refused
before it reaches a parser's recursion limit."""

from __future__ import annotations

import json

import grpc
import pytest

from tests.conftest import MODEL
from tests.grpc_helpers import chat_request, error_info
from tests.http_helpers import call, post

CHAT = "/v1/chat/completions"


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            **fields}


@pytest.mark.parametrize(("body", "headers", "status", "code"), [
    (chat(model="m" * 20_000), {}, 404, "model_not_found"),
    (chat(profile="p" * 30_000), {}, 404, "profile_not_found"),
    (chat(**{f"unknown_{i}": i for i in range(3_000)}), {"X-miLLM-Strict": "1"}, 400,
     "unused_fields_refused"),
    # Four UTF-8 bytes each, percent-encoded in the trailer: bounded in bytes.
    (chat(model="\U0001f600" * 5_000), {}, 404, "model_not_found"),
    (chat(profile="\u202e" * 8_000), {}, 404, "profile_not_found"),
    # Not Unicode text: refused by the bridge, naming the field.
    (chat(messages=[{"role": "user", "content": "a\ud800"}]), {}, 400, "invalid_parameter"),
], ids=["model-name", "profile", "unused-fields", "emoji-model-name", "rtl-profile",
        "unpaired-surrogate"])
def test_huge_inputs_are_4xx_with_a_bounded_message(stack, body, headers, status, code):
    reply, content = post(stack.http_port, CHAT, body, headers=headers)
    error = json.loads(content)["error"]
    assert (reply.status, error["code"]) == (status, code)
    assert len(error["message"].encode()) <= 1024 and len(error["param"] or "") <= 256


def test_a_huge_model_name_over_grpc_is_not_found(generation_stub):
    with pytest.raises(grpc.RpcError) as caught:
        list(generation_stub.Generate(chat_request(model="m" * 20_000), timeout=30))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(caught.value).reason == "model_not_found"


def test_a_surrogate_is_named_by_its_location(stack):
    reply, content = post(stack.http_port, CHAT, chat(messages=[
        {"role": "user", "content": "fine"}, {"role": "user", "content": "\udfff"}]))
    assert reply.status == 400
    assert json.loads(content)["error"]["param"] == "messages[1].content"


def test_huge_emoji_names_in_management_paths_are_404(stack):
    # 2,000 emoji: 8,000 bytes of name, within the bridge's 32 KiB URL limit.
    reply = call(stack.http_port, "GET", "/api/profiles/" + "%F0%9F%98%80" * 2_000)
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "profile_not_found"


def test_a_deeply_nested_management_body_is_400(stack):
    raw = '{"name": "deep", "entries": ' + "[" * 5_000 + "]" * 5_000 + "}"
    reply = call(stack.http_port, "POST", "/api/profiles", raw=raw.encode())
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_json"


@pytest.mark.parametrize(("fields", "param"), [
    ({"extra_messages": [[{"role": "user", "content": "Hi"}]] * 2048}, "extra_messages"),
    ({"n": 128, "extra_messages": [[{"role": "user", "content": "Hi"}]] * 16}, "n"),
], ids=["conversations", "choices"])
def test_requests_asking_for_too_many_rows_are_400_naming_the_field(stack, fields, param):
    reply, content = post(stack.http_port, CHAT, chat(**fields))
    error = json.loads(content)["error"]
    assert (reply.status, error["code"], error["param"]) == (400, "invalid_parameter", param)
