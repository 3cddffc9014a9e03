"""Generated requests for every gRPC method, sent with the real stubs: the
engine never answers INTERNAL, UNKNOWN or DATA_LOSS (what the bridge would turn
into a 5xx), never runs past the call's deadline, and keeps serving.

Each request is drawn field by field from its message descriptor
(tests/fuzz_support.py): any value of the field's type, long and odd strings,
unknown enum numbers, hundreds of repeated entries. Generations are kept short
(max_tokens at most 8, n at most 4) so the run stays quick; LoadModel and
UnloadModel never name a model on disk (a fuzzer must not switch the model).
"""

from __future__ import annotations

import grpc
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from millm.v1 import (
    embedding_service_pb2,
    generation_service_pb2,
    model_pb2,
    model_service_pb2,
    model_service_pb2_grpc,
    monitoring_service_pb2,
    scoring_service_pb2,
    server_service_pb2,
    steering_service_pb2,
)
from tests.conftest import MODEL
from tests.fuzz_support import build, fuzz, message_values

SERVER_FAULTS = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS,
                 grpc.StatusCode.DEADLINE_EXCEEDED}
MODULES = (generation_service_pb2, scoring_service_pb2, embedding_service_pb2,
           model_service_pb2, server_service_pb2, steering_service_pb2, monitoring_service_pb2)
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


def test_still_serving_after_the_fuzzing(fuzz_channel):
    stub = model_service_pb2_grpc.ModelServiceStub(fuzz_channel)
    loaded = [m.id for m in stub.ListModels(model_service_pb2.ListModelsRequest()).models
              if m.state == model_pb2.MODEL_STATE_LOADED]
    assert loaded == [MODEL]
