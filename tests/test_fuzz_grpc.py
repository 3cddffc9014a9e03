"""Generated requests for every gRPC method, sent with the real stubs: the
engine never answers INTERNAL, UNKNOWN or DATA_LOSS (what the bridge would turn
into a 5xx), never runs past the call's deadline, and keeps serving.

Each request is drawn field by field from its message descriptor
(tests/fuzz_support.py): any value of the field's type, long and odd strings,
unknown enum numbers, hundreds of repeated entries. Every service is in,
ResponseService too (saves with unknown enum numbers, odd ids and JSON
fields that do not parse; reads and deletes of any id). Generations are kept short
(max_tokens at most 8, n at most 4) so the run stays quick; LoadModel and
UnloadModel never name a model on disk (a fuzzer must not switch the model).
"""

from __future__ import annotations

import uuid

import grpc
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from millm.v1 import (
    batch_service_pb2,
    embedding_service_pb2,
    generation_service_pb2,
    model_pb2,
    model_service_pb2,
    model_service_pb2_grpc,
    monitoring_service_pb2,
    ranking_service_pb2,
    response_service_pb2,
    response_service_pb2_grpc,
    scoring_service_pb2,
    server_service_pb2,
    steering_service_pb2,
    tokenization_service_pb2,
)
from tests.conftest import MODEL
from tests.fuzz_support import build, fuzz, message_values
from tests.http_helpers import call as http_call

SERVER_FAULTS = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS,
                 grpc.StatusCode.DEADLINE_EXCEEDED}
MODULES = (generation_service_pb2, scoring_service_pb2, embedding_service_pb2,
           model_service_pb2, server_service_pb2, steering_service_pb2, monitoring_service_pb2,
           response_service_pb2, tokenization_service_pb2, ranking_service_pb2,
           batch_service_pb2)
METHODS = [(service, method) for module in MODULES
           for service in module.DESCRIPTOR.services_by_name.values()
           for method in service.methods]


@pytest.fixture(scope="module")
def fuzz_channel(fuzz_stack):
    with grpc.insecure_channel(fuzz_stack.grpc_target) as channel:
        yield channel


@pytest.fixture(scope="module")
def models_on_disk(fuzz_channel) -> set[str]:
    stub = model_service_pb2_grpc.ModelServiceStub(fuzz_channel)
    return {m.id for m in stub.ListModels(model_service_pb2.ListModelsRequest()).models}


def tame(request, models_on_disk: set[str]) -> None:
    """Keep a generated request quick and the stack on its model."""
    name = request.DESCRIPTOR.name
    if name == "GenerateManyRequest":  # each start is a GenerateRequest
        for start in request.starts:
            tame(start.request, models_on_disk)
            start.timeout_s = 0  # a deadline it asks for is no server fault
    if name in ("LoadModelRequest", "UnloadModelRequest") and (
            request.id in models_on_disk or not request.id):
        request.id = "not-a-model"
    if "model" in request.DESCRIPTOR.fields_by_name and request.model == "":
        request.model = MODEL
    if "sampling" in request.DESCRIPTOR.fields_by_name:
        sampling = request.sampling
        sampling.max_tokens = min(abs(sampling.max_tokens), 8)
        sampling.ClearField("max_completion_tokens")
        if sampling.HasField("n"):
            sampling.n = max(-1, min(sampling.n, 4))


# Streams that run until the caller leaves.
ENDLESS = frozenset({"WatchLoad"})


def call(channel, service, method, request):
    path = f"/{service.full_name}/{method.name}"
    serialize = type(request).SerializeToString
    if method.client_streaming:  # GenerateMany: one message, then the caller's side closes
        stub = channel.stream_stream(
            path, request_serializer=serialize,
            response_deserializer=generation_service_pb2.GenerateManyResponse.FromString)
        frames = list(stub(iter([request]), timeout=60))
        # Its calls end in band: a server fault there is one too, and every
        # call started ends unless the same message cancelled it (a cancelled
        # call gets no end; one refused as a duplicate id ends again).
        ends = [e for f in frames for e in f.events if e.WhichOneof("kind") == "end"]
        faults = {code.value[0] for code in SERVER_FAULTS}
        assert not [e for e in ends if e.end.code in faults], (ends, str(request)[:2000])
        started = {s.id for s in request.starts}
        assert started - set(request.cancels) <= {e.id for e in ends} <= started, (ends, request)
        return frames
    if method.server_streaming:
        stub = channel.unary_stream(path, request_serializer=serialize,
                                    response_deserializer=lambda b: b)
        if method.name in ENDLESS:  # a report stream never ends by itself: read one
            replies = stub(request, timeout=60)
            first = next(replies)
            replies.cancel()
            return [first]
        return list(stub(request, timeout=60))
    stub = channel.unary_unary(path, request_serializer=serialize,
                               response_deserializer=lambda b: b)
    return stub(request, timeout=60)


@fuzz(max_examples=300)
@given(data=st.data(), which=st.sampled_from(METHODS))
def test_no_server_fault_from_any_request(fuzz_channel, models_on_disk, data, which):
    service, method = which
    values = data.draw(message_values(method.input_type), label=method.name)
    request = build(method.input_type, values)
    tame(request, models_on_disk)
    try:
        call(fuzz_channel, service, method, request)
        event(f"{method.name} OK")
    except grpc.RpcError as exc:
        event(f"{method.name} {exc.code().name}")
        assert exc.code() not in SERVER_FAULTS, (method.name, exc.code(), exc.details(),
                                                 str(request)[:2000])


SAVED_ITEMS = st.lists(message_values(response_service_pb2.ResponseItem.DESCRIPTOR), max_size=3)


@fuzz(max_examples=100)
@given(response=message_values(response_service_pb2.StoredResponse.DESCRIPTOR),
       items=SAVED_ITEMS, valid_ids=st.booleans())
def test_a_saved_response_reads_back_on_every_path(fuzz_stack, fuzz_channel, response, items,
                                                   valid_ids):
    """Whatever SaveResponse accepts, every reader renders: GetResponse,
    ListInputItems, and the bridge's GET and input_items never fail on it."""
    request = response_service_pb2.SaveResponseRequest(
        response=build(response_service_pb2.StoredResponse.DESCRIPTOR, response),
        input_items=[build(response_service_pb2.ResponseItem.DESCRIPTOR, i) for i in items])
    request.response.id = f"resp_{uuid.uuid4().hex}"
    if valid_ids:  # mostly past the id rules, to reach what is stored
        request.response.previous_response_id = ""
        for i, item in enumerate([*request.response.output, *request.input_items]):
            item.id = f"item_{i}"
    stub = response_service_pb2_grpc.ResponseServiceStub(fuzz_channel)
    try:
        stub.SaveResponse(request, timeout=60)
    except grpc.RpcError as exc:
        event(f"SaveResponse {exc.code().name}")
        assert exc.code() not in SERVER_FAULTS, (exc.code(), exc.details(), str(request)[:2000])
        return
    event("SaveResponse OK")
    response_id = request.response.id
    stub.GetResponse(response_service_pb2.GetResponseRequest(id=response_id,
                                                             include_input_items=True),
                     timeout=60)
    stub.ListInputItems(response_service_pb2.ListInputItemsRequest(response_id=response_id),
                        timeout=60)
    for path in (f"/v1/responses/{response_id}", f"/v1/responses/{response_id}/input_items"):
        reply = http_call(fuzz_stack.http_port, "GET", path)
        assert reply.status_code == 200, (path, reply.text[:500], str(request)[:2000])
        reply.json()


def test_still_serving_after_the_fuzzing(fuzz_channel):
    stub = model_service_pb2_grpc.ModelServiceStub(fuzz_channel)
    loaded = [m.id for m in stub.ListModels(model_service_pb2.ListModelsRequest()).models
              if m.state == model_pb2.MODEL_STATE_LOADED]
    assert loaded == [MODEL]
