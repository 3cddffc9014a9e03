"""Fields that go unused are reported (X-miLLM-Ignored-Fields, and
ResponseMetadata.ignored_fields over gRPC) or, in strict mode, refused;
"no change" values of unhonoured fields pass everywhere."""

from __future__ import annotations

import json

import pytest
from google.protobuf import struct_pb2

from rest_bridge.serving.ignored_fields import MAX_BYTES, header_value
from tests.conftest import MODEL
from tests.grpc_helpers import chat_request, error_info, prompt_request, run
from tests.http_helpers import post

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
HELLO = [{"role": "user", "content": "Hello!"}]
HEADER = "X-miLLM-Ignored-Fields"


def greedy_chat(**fields) -> dict:
    return {"model": MODEL, "messages": HELLO, "max_tokens": 8, "temperature": 0, **fields}


def answer(body: dict) -> dict:
    return {k: body[k] for k in ("choices", "usage", "model", "system_fingerprint")}


def test_unknown_field_is_reported_and_changes_nothing(stack):
    plain, plain_body = post(stack.http_port, CHAT, greedy_chat())
    extra, extra_body = post(stack.http_port, CHAT, greedy_chat(foo={"deep": [1]}))
    assert plain.status == extra.status == 200
    assert plain.getheader(HEADER) is None
    assert extra.getheader(HEADER) == '"foo"'
    assert answer(json.loads(extra_body)) == answer(json.loads(plain_body))


def test_the_same_request_in_strict_mode_is_refused(stack):
    for value in ("1", "true", "TRUE"):
        reply, content = post(stack.http_port, CHAT, greedy_chat(foo=1, bar=2),
                              headers={"X-miLLM-Strict": value})
        error = json.loads(content)["error"]
        assert reply.status == 400 and error["code"] == "unused_fields_refused"
        assert "foo" in error["message"] and "bar" in error["message"]
    for value in ("0", "false"):
        reply, _ = post(stack.http_port, CHAT, greedy_chat(foo=1),
                        headers={"X-miLLM-Strict": value})
        assert reply.status == 200 and reply.getheader(HEADER) == '"foo"'


def test_every_location_is_named(stack):
    body = greedy_chat(
        user="customer-7",
        stream_options={"include_usage": True},  # without stream: shapes nothing
        messages=[{"role": "system", "content": "Be brief.", "name": "ops"},
                  {"role": "user", "content": [{"type": "text", "text": "Hi", "lang": "en"}]}],
        store=True,
    )
    reply, _ = post(stack.http_port, CHAT, body)
    assert reply.status == 200
    assert reply.getheader(HEADER) == (
        '"store", "messages[1].content[0].lang", "stream_options", "user", '
        '"messages[0].name"')


def test_streaming_responses_carry_the_header(stack):
    reply, content = post(stack.http_port, COMPLETIONS,
                          {"model": MODEL, "prompt": "The", "max_tokens": 2, "stream": True,
                           "metadata": {"k": "v"}})
    assert reply.status == 200
    assert reply.getheader(HEADER) == '"metadata"'
    assert content.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize(
    "fields",
    [
        {"n": 1}, {"logprobs": False}, {"response_format": {"type": "text"}}, {"tools": []},
        {"logit_bias": {}}, {"tool_choice": "none"}, {"functions": []},
        {"tools": None, "logprobs": None, "response_format": None, "seed": None, "n": None,
         "logit_bias": None, "profile": None, "steering": None, "top_logprobs": None},
        {"modalities": ["text"]}, {"extra_messages": []},
    ],
)
def test_no_change_values_are_accepted(stack, fields):
    reply, content = post(stack.http_port, CHAT, greedy_chat(**fields),
                          headers={"X-miLLM-Strict": "1"})
    assert reply.status == 200, content
    assert reply.getheader(HEADER) is None


def test_completion_no_change_values(stack):
    body = {"model": MODEL, "prompt": "The", "max_tokens": 2, "echo": False, "best_of": 1,
            "suffix": None, "logprobs": None, "logit_bias": {}}
    reply, content = post(stack.http_port, COMPLETIONS, body, headers={"X-miLLM-Strict": "1"})
    assert reply.status == 200, content


def test_unused_fields_are_logged_by_location_never_by_value(stack, client):
    secret = "s3cret-value-4711"
    client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2,
                                   extra_body={"odd_field": secret}, user=secret)
    log = stack.engine.log()
    lines = [line for line in log.splitlines() if "request_fields_unused" in line]
    assert any("odd_field" in line and "user" in line for line in lines), log[-2000:]
    assert secret not in log


def test_grpc_callers_get_the_report_in_metadata(generation_stub):
    request = chat_request(max_tokens=2)
    request.user = "svc-a"
    request.extra_fields.update({"store": True, "tools": []})
    request.unused_fields.append("messages[0].colour")
    meta, *_ = run(generation_stub, request)
    assert list(meta.ignored_fields) == ["store", "messages[0].colour", "user"]


def test_grpc_strict_and_field_not_honoured(generation_stub):
    import grpc

    request = prompt_request("The", max_tokens=2)
    request.user = "svc-a"
    request.strict = True
    with pytest.raises(grpc.RpcError) as caught:
        list(generation_stub.Generate(request, timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "unused_fields_refused"

    # Honoured in SamplingParams.logit_bias; as an extra field it has no place.
    request = chat_request(max_tokens=2)
    request.extra_fields.update({"logit_bias": {"5": 3}})
    with pytest.raises(grpc.RpcError) as caught:
        list(generation_stub.Generate(request, timeout=30))
    info = error_info(caught.value)
    assert (info.reason, info.metadata["param"]) == ("field_not_honoured", "logit_bias")


def test_header_value_format():
    assert header_value([]) is None
    assert header_value(["a", 'say "hi"', "back\\slash"]) == (
        '"a", "say \\"hi\\"", "back\\\\slash"')
    # Outside printable ASCII (and % itself) is percent-encoded as UTF-8.
    assert header_value(["café", "tab\there", "100%"]) == '"caf%C3%A9", "tab%09here", "100%25"'


def test_header_value_is_capped_with_a_count_of_the_rest():
    locations = [f"field_{i:04d}" for i in range(200)]
    value = header_value(locations)
    assert len(value.encode()) <= MAX_BYTES
    entries = value.split(", ")
    kept = entries[:-1]
    assert kept == [f'"{loc}"' for loc in locations[:len(kept)]]
    assert entries[-1] == f'"+{200 - len(kept)} more"'
    assert len(kept) > 50  # the cap is used, not wasted


def test_struct_values_round_trip_for_the_engine():
    # The bridge forwards extra fields as a Struct; nested JSON must survive.
    struct = struct_pb2.Struct()
    struct.update({"a": [1, {"b": None}], "c": "x"})
    from google.protobuf import json_format

    assert json_format.MessageToDict(struct) == {"a": [1.0, {"b": None}], "c": "x"}


def test_grpc_extra_fields_must_be_json(generation_stub):
    import grpc

    request = chat_request(max_tokens=2)
    request.extra_fields.fields["x"].number_value = float("nan")
    with pytest.raises(grpc.RpcError) as caught:
        list(generation_stub.Generate(request, timeout=30))
    info = error_info(caught.value)
    assert (info.reason, info.metadata["param"]) == ("invalid_parameter", "extra_fields")
