"""The systematic sweep (tests/sweep_support.py): every route × every field it
knows × a value of each JSON type, on an otherwise valid body, answers
without a 5xx, a reset or a server fault inside a stream; so does every
value at any depth of a set of full valid bodies; the stored responses'
reads take odd ids and query values alike; and the stack still serves at
the end. The regressions it (and its review) found are pinned below it."""

from __future__ import annotations

import json

import grpc
import pytest

from millm.v1 import response_service_pb2 as rpb
from millm.v1 import response_service_pb2_grpc
from tests import sweep_support
from tests.conftest import MODEL
from tests.grpc_helpers import error_info
from tests.http_helpers import call


def _report(failures: list[str]) -> str:
    return f"{len(failures)} failures:\n" + "\n".join(failures[:40])


def test_every_generation_field_takes_every_json_type(fuzz_stack):
    failures = sweep_support.sweep(fuzz_stack, sweep_support.generation_cases())
    assert not failures, _report(failures)


@pytest.fixture(scope="module")
def sae_attached(fuzz_stack):
    """The full bodies read activations and probe a feature: the demo SAE is attached."""
    reply = call(fuzz_stack.http_port, "POST", "/api/saes/sae_millm-tiny-res-l1/attach")
    assert reply.status_code in (200, 409), reply.text
    return fuzz_stack


def test_the_full_bodies_are_valid(sae_attached):
    """So that each nested case differs from a valid body in one value."""
    for method, path, body in sweep_support.FULL_BODIES:
        reply = call(sae_attached.http_port, method, path, body)
        allowed = (200,) if path.startswith("/v1/") else (200, 409)  # 409: made already
        assert reply.status_code in allowed, (path, body, reply.text[:300])


def test_every_nested_value_takes_every_json_type(sae_attached):
    failures = sweep_support.sweep(sae_attached, sweep_support.nested_cases())
    assert not failures, _report(failures)


def test_every_management_field_takes_every_json_type(fuzz_stack):
    failures = sweep_support.sweep(fuzz_stack, sweep_support.management_cases())
    assert not failures, _report(failures)


def test_stored_response_reads_take_any_id_and_query(fuzz_stack):
    made = call(fuzz_stack.http_port, "POST", "/v1/responses", {
        "model": MODEL, "input": "Hi", "max_output_tokens": 1})
    assert made.status_code == 200, made.text
    failures = sweep_support.sweep(fuzz_stack,
                                   sweep_support.responses_read_cases(made.json()["id"]))
    assert not failures, _report(failures)


def test_still_serving_after_the_sweep(fuzz_stack):
    assert sweep_support.alive(fuzz_stack) is None


# -- what the sweep found ------------------------------------------------------------------


def test_a_stream_check_fails_on_a_server_fault():
    """The fuzzers' stream check can fail: a server fault inside a stream is
    caught even when the stream ends properly."""
    chat = (b'data: {"choices": []}\n\ndata: {"error": {"message": "m", "type": "server_error",'
            b' "param": null, "code": "internal_error"}}\n\ndata: [DONE]\n\n')
    assert "server fault" in sweep_support.stream_problem(chat)
    failed = {"type": "response.failed", "sequence_number": 3,
              "response": {"error": {"code": "engine_unavailable", "message": "m"}}}
    body = b"event: response.failed\ndata: " + json.dumps(failed).encode() + b"\n\n"
    assert "server fault" in sweep_support.stream_problem(body)
    failed["response"]["error"]["code"] = "context_length_exceeded"  # the request's fault
    body = b"event: response.failed\ndata: " + json.dumps(failed).encode() + b"\n\n"
    assert sweep_support.stream_problem(body) is None
    assert sweep_support.stream_problem(b'data: {"choices": []}\n\n') is not None
    failed["response"]["error"] = None  # failed, saying nothing of why
    body = b"event: response.failed\ndata: " + json.dumps(failed).encode() + b"\n\n"
    assert "says no error" in sweep_support.stream_problem(body)
    uncoded = b'data: {"error": {"message": "m", "type": "x"}}\n\ndata: [DONE]\n\n'
    assert "without a code" in sweep_support.stream_problem(uncoded)


@pytest.mark.parametrize("value", ["x", 7, True, [], ["x"], 2**64, {"sae_id": 7}])
def test_responses_type_checks_return_sae_activations_as_chat_does(stack, value):
    body = {"model": MODEL, "input": "Hi", "max_output_tokens": 1, "store": False,
            "return_sae_activations": value}
    for path, route_body in (("/v1/responses", body), ("/v1/chat/completions", {
            "model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}],
            "return_sae_activations": value})):
        reply = call(stack.http_port, "POST", path, route_body)
        assert reply.status_code == 400, (path, reply.text)
        error = reply.json()["error"]
        assert error["code"] in ("invalid_type", "invalid_parameter"), error
        assert error["param"].startswith("return_sae_activations"), error


def test_responses_refuses_well_formed_activations_by_name(stack):
    """A well-formed spec has no place in a response: refused, never dropped."""
    reply = call(stack.http_port, "POST", "/v1/responses", {
        "model": MODEL, "input": "Hi", "max_output_tokens": 1, "store": False,
        "return_sae_activations": {"top_k": 3}})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == ("field_not_honoured", "return_sae_activations")
    reply = call(stack.http_port, "POST", "/v1/responses", {
        "model": MODEL, "input": "Hi", "max_output_tokens": 1, "store": False,
        "return_sae_activations": None})
    assert reply.status_code == 200, reply.text


@pytest.fixture(scope="module")
def responses_stub(stack):
    with grpc.insecure_channel(stack.grpc_target) as channel:
        yield response_service_pb2_grpc.ResponseServiceStub(channel)


def _saved(response_id: str, **fields) -> rpb.StoredResponse:
    return rpb.StoredResponse(id=response_id, model=MODEL, **fields)


@pytest.mark.parametrize(("response", "items", "param"), [
    (_saved("resp_s97", status=97), [], "response.status"),
    (_saved("resp_i97", output=[rpb.ResponseItem(id="msg_1", status=97, message=rpb.MessageItem(
        content=[rpb.ContentPart(type=1, text="x")]))]), [], "response.output[0].status"),
    (_saved("resp_c97"), [rpb.ResponseItem(id="msg_1", message=rpb.MessageItem(
        role=42, content=[rpb.ContentPart(type=1, text="x")]))], "input_items[0].message.role"),
    (_saved("resp_tj", settings=rpb.ResponseSettings(tools=[{"name": "f",
                                                             "parameters_json": "{nope"}])),
     [], "response.settings.tools[0].parameters_json"),
    (_saved("resp_nan", settings=rpb.ResponseSettings(tools=[{"name": "f",
                                                              "parameters_json": "NaN"}])),
     [], "response.settings.tools[0].parameters_json"),
    (_saved("resp_deep", settings=rpb.ResponseSettings(tools=[{
        "name": "f", "parameters_json": "[" * 500 + "]" * 500}])),
     [], "response.settings.tools[0].parameters_json"),
    (_saved("resp_inf", settings=rpb.ResponseSettings(sampling={"temperature": float("inf")})),
     [], "response.settings.sampling.temperature"),
    (_saved("resp_mode", settings=rpb.ResponseSettings(tool_choice={"mode": 33})), [],
     "response.settings.tool_choice.mode"),
    (_saved("resp_prev", previous_response_id="resp_\x00"), [],
     "response.previous_response_id"),
])
def test_save_refuses_what_no_reader_could_render(stack, responses_stub, response, items,
                                                   param):
    with pytest.raises(grpc.RpcError) as caught:
        responses_stub.SaveResponse(rpb.SaveResponseRequest(response=response,
                                                            input_items=items))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).metadata["param"] == param
    # Nothing was stored: its GET is a 404, never a 500.
    reply = call(stack.http_port, "GET", f"/v1/responses/{response.id}")
    assert reply.status_code == 404, reply.text


@pytest.mark.parametrize("bad", ["resp_\x00", "\x00", "resp_" + "a" * 201, "chatcmpl-1", ""])
def test_ids_are_checked_before_any_query_on_every_path(responses_stub, bad):
    for rpc, request, param in (
            (responses_stub.GetResponse, rpb.GetResponseRequest(id=bad), "id"),
            (responses_stub.DeleteResponse, rpb.DeleteResponseRequest(id=bad), "id"),
            (responses_stub.ListInputItems, rpb.ListInputItemsRequest(response_id=bad),
             "response_id")):
        with pytest.raises(grpc.RpcError) as caught:
            rpc(request)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (rpc, bad)
        assert error_info(caught.value).metadata["param"] == param


def test_a_nul_byte_in_an_id_is_a_400_on_every_route(stack):
    for method, path in (("GET", "/v1/responses/resp_%00"),
                         ("DELETE", "/v1/responses/resp_%00"),
                         ("GET", "/v1/responses/resp_%00/input_items")):
        reply = call(stack.http_port, method, path)
        assert reply.status_code == 400, (method, path, reply.text)
        assert reply.json()["error"]["code"] == "invalid_parameter"
    reply = call(stack.http_port, "POST", "/v1/responses", {
        "model": MODEL, "input": "Hi", "max_output_tokens": 1,
        "previous_response_id": "resp_\x00"})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "previous_response_id"
    assert error["message"].startswith("'previous_response_id' must be a response id"), error


def test_a_stored_response_the_bridge_cannot_name_still_renders():
    """A response from an engine of a newer contract (or stored before the
    save checks) renders as the nearest thing, never a 500."""
    from rest_bridge.serving.responses_json import response_json

    odd = rpb.StoredResponse(
        id="resp_odd", status=97, output=[rpb.ResponseItem(id="m", status=9, message={})],
        settings=rpb.ResponseSettings(
            tools=[{"name": "f", "parameters_json": "NaN"}, {"name": "g",
                                                            "parameters_json": "[" * 2000}],
            tool_choice={"mode": 33}, sampling={"temperature": float("nan")},
            text_format={"json_schema": {"name": "s", "schema_json": "{"}}))
    shown = json.loads(json.dumps(response_json(odd, store=True), allow_nan=False))
    assert shown["status"] == "incomplete" and shown["output"][0]["status"] == "completed"
    assert [t["parameters"] for t in shown["tools"]] == [None, None]
    assert shown["tool_choice"] == "auto" and shown["temperature"] == 1.0
    assert shown["text"]["format"]["schema"] == {}


# JSON inside a string (a call's arguments, a steering document) was parsed
# without the body's limits: deep nesting raised RecursionError (a 500) and
# NaN was accepted by one route and refused by the next (service/json_text.py).
DEEP_ARGUMENTS = ("[" * 100_000, '{"a": ' + "[" * 5_000 + "]" * 5_000 + "}", '{"a": NaN}')


@pytest.mark.parametrize("arguments", DEEP_ARGUMENTS)
def test_call_arguments_that_are_not_plain_json_are_a_400(stack, arguments):
    chat = {"model": MODEL, "max_tokens": 1, "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}
    responses = {"model": MODEL, "max_output_tokens": 1, "store": False, "input": [
        {"role": "user", "content": "Hi"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": arguments},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"}]}
    for path, body, param in (
            ("/v1/chat/completions", chat, "messages[1].tool_calls[0].function.arguments"),
            ("/v1/responses", responses, "input[1].arguments")):
        reply = call(stack.http_port, "POST", path, body)
        assert reply.status_code == 400, (path, reply.text[:300])
        assert reply.json()["error"]["param"] == param, reply.text[:300]


def test_a_steering_document_nested_too_deep_is_a_400(stack):
    from millm.v1 import steering_service_pb2, steering_service_pb2_grpc

    with grpc.insecure_channel(stack.grpc_target) as channel:
        stub = steering_service_pb2_grpc.SteeringServiceStub(channel)
        for document in ("[" * 100_000, '{"format": "millm.cluster.v1", "name": NaN}'):
            with pytest.raises(grpc.RpcError) as caught:
                stub.ImportCluster(steering_service_pb2.ImportClusterRequest(
                    document_json=document))
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
            assert error_info(caught.value).reason == "invalid_document"


@pytest.mark.parametrize("schema", [
    {"type": {"a": 1}}, {"type": ["string", ["x"]]},
    {"type": "object", "properties": {"a": {"type": {"b": 2}}}},
    {"$defs": 5, "$ref": "#/$defs/a"}, {"$defs": ["a"], "$ref": "#/$defs/a"},
])
def test_a_schema_with_an_odd_keyword_value_is_a_400(stack, schema):
    """A type that is an object, or $defs that is not one, was a TypeError (a 500)."""
    for path, body in (
            ("/v1/chat/completions", {"model": MODEL, "max_tokens": 1, "messages": [
                {"role": "user", "content": "Hi"}], "response_format": {
                    "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}),
            ("/v1/responses", {"model": MODEL, "max_output_tokens": 1, "store": False,
                               "input": "Hi", "tools": [{"type": "function", "name": "f",
                                                         "parameters": schema}]})):
        reply = call(stack.http_port, "POST", path, body)
        assert reply.status_code == 400, (path, reply.text[:300])
        assert reply.json()["error"]["code"] == "response_format_unsupported", reply.text[:300]
