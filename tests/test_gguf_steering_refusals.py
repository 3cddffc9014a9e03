"""A GGUF model whose residual stream llama.cpp never hands over is served
unsteered: it loads and generates, says `steering: false` over REST and gRPC,
and refuses every steering field and SAE attach with steering_unavailable
naming the field, never ignoring it.

The model is a tiny PLaMo-2 export (tests/plamo2_gguf.py): llama.cpp names
its blocks' residual sums `attn_residual`/`ffn_residual`, not `l_out-<il>`,
so the engine's load-time check (engines/gguf/engine.py `_reachable`) finds
no layer to steer. Its first block is a Mamba block, so it also covers the
GGUF engine serving a model with recurrent state: such a state cannot be cut
back to a shared prefix, and a second chat sharing the template's opening
tokens must still be answered (engines/gguf/slots.py `whole_only`).
"""

from __future__ import annotations

import grpc
import pytest

from millm.v1 import (
    generation_service_pb2_grpc,
    server_service_pb2,
    server_service_pb2_grpc,
    steering_pb2,
    steering_service_pb2,
    steering_service_pb2_grpc,
)
from service.engines.gguf.slots import Slot, Slots
from tests import harness, plamo2_gguf
from tests.grpc_helpers import chat_request, error_info, prompt_request, run
from tests.http_helpers import call

MODEL = plamo2_gguf.MODEL_ID
L1 = "sae_millm-tiny-res-l1"  # d_in 64 at layer 1: it would fit this model's shape
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


@pytest.fixture(scope="module")
def plamo(tmp_path_factory):
    demo = harness.models_dir()
    models = tmp_path_factory.mktemp("plamo2-models")
    plamo2_gguf.write(demo / "millm-tiny", models)
    stack = harness.OwnStack(tmp_path_factory.mktemp("plamo2"), MILLM_MODELS_DIR=str(models),
                             MILLM_MODEL=MODEL, MILLM_SAES_DIR=str(demo / "saes"))
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def channel(plamo):
    with grpc.insecure_channel(plamo.grpc_target) as channel:
        yield channel


def chat(stack, **extra):
    return call(stack.http_port, "POST", "/v1/chat/completions", {
        "model": MODEL, "messages": MESSAGES, "max_tokens": 6, "temperature": 0,
        "ignore_eos": True, **extra})


def test_the_second_architecture_loads_and_generates(plamo):
    first, again = chat(plamo), chat(plamo)
    assert first.status_code == again.status_code == 200, again.text
    text = first.json()["choices"][0]["message"]["content"]
    assert first.json()["usage"]["completion_tokens"] == 6 and text
    # Greedy, and not misled by the first answer's recurrent state.
    assert again.json()["choices"][0]["message"]["content"] == text
    assert first.json()["model"] == MODEL


def test_a_continued_recurrent_state_gives_the_fresh_answer(channel):
    """A prompt that continues a slot's tokens reuses its recurrent state; the
    greedy answer equals the one computed from nothing."""
    generate = generation_service_pb2_grpc.GenerationServiceStub(channel)
    server = server_service_pb2_grpc.ServerServiceStub(channel)
    clear = server_service_pb2.ClearPrefixCacheRequest()
    opening = [40, 41, 42, 43, 44, 45]
    server.ClearPrefixCache(clear, timeout=10)
    _, _, tokens, _, _, _ = run(generate, prompt_request(opening, model=MODEL, max_tokens=4,
                                                         temperature=0))
    follow = [*opening, *tokens[0], 46, 47]  # all the slot holds, then more
    _, reused, _, _, usage, _ = run(generate, prompt_request(follow, model=MODEL, max_tokens=6,
                                                             temperature=0))
    assert usage.cached_tokens >= len(opening) + 3  # the last token may not be evaluated yet
    server.ClearPrefixCache(clear, timeout=10)
    _, fresh, _, _, usage, _ = run(generate, prompt_request(follow, model=MODEL, max_tokens=6,
                                                            temperature=0))
    assert usage.cached_tokens == 0 and reused[0] == fresh[0] and fresh[0]


def test_capabilities_say_it_cannot_steer(plamo, channel):
    caps = call(plamo.http_port, "GET", "/api/capabilities").json()
    assert (caps["engine"], caps["model"]) == ("gguf", MODEL)
    assert caps["features"]["steering"] is False
    rows = {(r["field"], r["route"]): r for r in caps["fields"]}
    for field, route in (("profile", "chat"), ("steering_intensity", "chat"),
                         ("return_sae_activations", "chat"),
                         ("return_sae_activations", "completions")):
        assert rows[(field, route)]["honoured"] is False
        assert rows[(field, route)]["refusal_code"] == "steering_unavailable"

    stub = server_service_pb2_grpc.ServerServiceStub(channel)
    reply = stub.GetCapabilities(server_service_pb2.GetCapabilitiesRequest(), timeout=10)
    assert (reply.engine, reply.model) == ("gguf", MODEL)
    assert reply.features.steering is False and list(reply.features.attached_saes) == []
    table = {(s.field, s.route): s for s in reply.fields}
    assert not table[("profile", "chat")].honoured
    assert table[("profile", "chat")].refusal_code == "steering_unavailable"


@pytest.mark.parametrize(("route", "field", "value"), [
    ("chat", "profile", "sea"),
    ("chat", "steering_intensity", 0.5),
    ("chat", "steering_intensity", "max"),
    ("chat", "return_sae_activations", {"top_k": 2}),
    ("completions", "return_sae_activations", {"top_k": 2}),
])
def test_steering_fields_are_refused_naming_the_field(plamo, route, field, value):
    if route == "chat":
        reply = chat(plamo, **{field: value})
    else:
        reply = call(plamo.http_port, "POST", "/v1/completions", {
            "model": MODEL, "prompt": "The sea", "max_tokens": 4, field: value})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == ("steering_unavailable", field)
    assert "cannot be reached" in error["message"]


def test_grpc_refuses_steering_fields_alike(channel):
    stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
    asks = {
        "profile": lambda r: setattr(r, "profile", "sea"),
        "steering_intensity": lambda r: setattr(r.steering_intensity, "level", 0.5),
        "return_sae_activations": lambda r: r.return_sae_activations.CopyFrom(
            steering_pb2.SaeActivationsRequest(top_k=2)),
    }
    for field, ask in asks.items():
        request = chat_request("Tell me about the sea.", model=MODEL, max_tokens=4)
        ask(request)
        with pytest.raises(grpc.RpcError) as caught:
            run(stub, request)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        info = error_info(caught.value)
        assert (info.reason, info.metadata["param"]) == ("steering_unavailable", field)
    # Without them, the same request is served.
    _, texts, *_ = run(stub, chat_request("Tell me about the sea.", model=MODEL, max_tokens=4))
    assert texts[0]


def test_attaching_an_sae_is_refused(plamo, channel):
    reply = call(plamo.http_port, "POST", f"/api/saes/{L1}/attach")
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "steering_unavailable"
    stub = steering_service_pb2_grpc.SteeringServiceStub(channel)
    with pytest.raises(grpc.RpcError) as caught:
        stub.AttachSae(steering_service_pb2.AttachSaeRequest(sae_id=L1), timeout=10)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(caught.value).reason == "steering_unavailable"
    steering = call(plamo.http_port, "GET", "/api/steering").json()["steering"]
    assert steering["attached_sae_ids"] == []


def test_a_recurrent_slot_is_reused_only_when_the_prompt_continues_it():
    slots = Slots(2, 64, whole_only=True)
    slots.slots[0] = Slot(0, tokens=[1, 2, 3, 4])
    # A shared opening (1, 2) cannot be cut out of a recurrent state: start afresh.
    assert slots.pick((1, 2, 9, 9))[1] == 0
    # A prompt that continues everything the slot holds keeps it all.
    assert slots.pick((1, 2, 3, 4, 5)) == (slots.slots[0], 4)
    # An attention-only model keeps the shared opening.
    attention = Slots(1, 64)
    attention.slots[0] = Slot(0, tokens=[1, 2, 3, 4])
    assert attention.pick((1, 2, 9, 9)) == (attention.slots[0], 2)
