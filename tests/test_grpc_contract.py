"""The engine's gRPC surface: reflection, health, models, generation, errors."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from millm.v1 import generation_pb2, model_pb2, model_service_pb2
from service.demo_model.build import CONTEXT_WINDOW
from tests.grpc_helpers import MODEL, chat_request, error_info, prompt_request, run

GRPCURL = shutil.which("grpcurl") or str(pathlib.Path(sys.executable).parent / "grpcurl")


def grpcurl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([GRPCURL, "-plaintext", *args], capture_output=True, text=True,
                          timeout=30)


def test_reflection_lists_the_services(stack):
    result = grpcurl(stack.grpc_target, "list")
    assert result.returncode == 0, result.stderr
    services = set(result.stdout.split())
    assert {"millm.v1.GenerationService", "millm.v1.ModelService", "millm.v1.ServerService",
            "grpc.health.v1.Health"} <= services


def test_grpcurl_generates_through_reflection(stack):
    # ignore_eos: the count is the test's, not wherever the demo model ends its text.
    body = {"model": MODEL, "prompt": {"prompts": [{"text": "The river"}]},
            "sampling": {"max_tokens": 5, "temperature": 0, "ignore_eos": True}}
    result = grpcurl("-d", json.dumps(body), stack.grpc_target,
                     "millm.v1.GenerationService/Generate")
    assert result.returncode == 0, result.stderr
    # grpcurl prints one JSON object per streamed message.
    decoder, text, objects, pos = json.JSONDecoder(), result.stdout.strip(), [], 0
    while pos < len(text):
        obj, pos = decoder.raw_decode(text, pos)
        objects.append(obj)
        while pos < len(text) and text[pos].isspace():
            pos += 1
    assert objects[0]["metadata"]["model"] == MODEL
    assert objects[-1]["usage"]["completionTokens"] == "5"


def test_health_is_serving_once_loaded(channel):
    stub = health_pb2_grpc.HealthStub(channel)
    for service in ("", "millm.v1.GenerationService", "millm.v1.ModelService"):
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, service


def test_list_and_get_models(model_stub):
    models = model_stub.ListModels(model_service_pb2.ListModelsRequest()).models
    tiny = next(m for m in models if m.id == MODEL)
    assert models[0].id == MODEL  # the loaded model comes first
    assert tiny.state == model_pb2.MODEL_STATE_LOADED
    assert tiny.context_window == CONTEXT_WINDOW
    assert tiny.system_fingerprint.startswith("millm:millm-tiny@")
    assert tiny.system_fingerprint.endswith(":float32/unquantized:transformers")
    got = model_stub.GetModel(model_service_pb2.GetModelRequest(id=MODEL)).model
    assert got == tiny


def test_get_unknown_model_is_not_found(model_stub):
    with pytest.raises(grpc.RpcError) as err:
        model_stub.GetModel(model_service_pb2.GetModelRequest(id="no-such-model"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    info = error_info(err.value)
    assert info.reason == "model_not_found"
    assert info.metadata["param"] == "model"


def test_stream_shape_metadata_deltas_usage(generation_stub):
    meta, texts, tokens, finish, usage, responses = run(
        generation_stub, chat_request(max_tokens=12, temperature=0)
    )
    assert responses[0].HasField("metadata") and not responses[0].choices
    assert responses[-1].HasField("usage")
    assert all(not r.HasField("metadata") for r in responses[1:])
    assert meta.model == MODEL and meta.id and meta.created > 0
    assert meta.prompt_tokens == usage.prompt_tokens > 0
    assert not meta.HasField("seed")
    assert meta.seed_scope == generation_pb2.SEED_SCOPE_UNSPECIFIED
    assert usage.completion_tokens == len(tokens[0]) <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert finish[0] in (generation_pb2.FINISH_REASON_STOP, generation_pb2.FINISH_REASON_LENGTH)


def test_coalesce_sends_the_whole_output_in_one_message(generation_stub):
    request = prompt_request("The river", "The market", n=2, max_tokens=24, seed=3,
                             ignore_eos=True)
    stepwise = run(generation_stub, request)
    request.coalesce = True
    whole = run(generation_stub, request)
    # Metadata, one message holding every choice's whole output, usage.
    assert len(stepwise[5]) > 3
    assert [bool(r.choices) for r in whole[5]] == [False, True, False]
    assert whole[5][0].HasField("metadata") and whole[5][2].HasField("usage")
    assert whole[1] == stepwise[1] and whole[2] == stepwise[2]  # texts and token ids
    assert whole[3] == stepwise[3] and whole[4].completion_tokens == 4 * 24
    # With stream set, coalesce has no effect: a message a step (steps that
    # piled up while the reader was busy may still share one).
    request.stream = True
    assert len(run(generation_stub, request)[5]) > 3


def test_deltas_are_the_decoded_tokens(generation_stub, stack):
    from transformers import AutoTokenizer

    from tests.harness import models_dir

    tokenizer = AutoTokenizer.from_pretrained(models_dir() / MODEL)
    # A hot temperature makes the model emit stray byte tokens, which must
    # reach the client as the same characters a whole decode gives.
    _, texts, tokens, finish, _, responses = run(
        generation_stub,
        prompt_request("日本語の🙂 émoji", max_tokens=80, temperature=2, seed=5, ignore_eos=True),
    )
    assert texts[0] == tokenizer.decode(tokens[0])


def test_n_choices_have_their_own_indices(generation_stub):
    _, texts, tokens, finish, usage, _ = run(
        generation_stub, chat_request(n=3, max_tokens=8, seed=11)
    )
    assert sorted(finish) == [0, 1, 2]
    assert usage.completion_tokens == sum(len(t) for t in tokens.values())


def test_several_prompts_number_choices_prompt_major(generation_stub):
    _, texts, tokens, finish, usage, _ = run(
        generation_stub, prompt_request("The river", "The market", n=2, max_tokens=4, seed=3)
    )
    assert sorted(finish) == [0, 1, 2, 3]
    # Each prompt is seeded on its own: prompt 1 alone gives what it gave in the list.
    _, alone, _, _, _, _ = run(generation_stub,
                               prompt_request("The market", n=2, max_tokens=4, seed=3))
    assert [alone[0], alone[1]] == [texts[2], texts[3]]


def test_token_id_prompt(generation_stub):
    _, texts, tokens, _, usage, _ = run(
        generation_stub, prompt_request([40, 41, 42], max_tokens=3, temperature=0)
    )
    assert usage.prompt_tokens == 3 and usage.completion_tokens == len(tokens[0])


def _strict(request):
    request.strict = True
    return request


@pytest.mark.parametrize(
    ("request_factory", "param", "reason"),
    [
        (lambda: chat_request(temperature=2.5), "temperature", "invalid_parameter"),
        (lambda: chat_request(top_p=0.0), "top_p", "invalid_parameter"),
        (lambda: chat_request(n=0), "n", "invalid_parameter"),
        (lambda: chat_request(seed=-1), "seed", "invalid_parameter"),
        (lambda: chat_request(seed=2**32), "seed", "invalid_parameter"),
        (lambda: chat_request(max_tokens=0), "max_tokens", "invalid_parameter"),
        (lambda: chat_request(max_tokens=5, max_completion_tokens=6), "max_tokens",
         "invalid_parameter"),
        (lambda: chat_request(frequency_penalty=3), "frequency_penalty", "invalid_parameter"),
        (lambda: chat_request(stop=["a", "b", "c", "d", "e"]), "stop", "invalid_parameter"),
        (lambda: chat_request(stop=[""]), "stop[0]", "invalid_parameter"),
        # max_tokens past the window's room: capped, refused only when strict.
        (lambda: _strict(chat_request(max_tokens=CONTEXT_WINDOW)), "messages",
         "context_length_exceeded"),
        (lambda: chat_request("mill " * (CONTEXT_WINDOW + 100), max_tokens=1), "messages",
         "context_length_exceeded"),
        (lambda: prompt_request("x " * (CONTEXT_WINDOW + 100), max_tokens=1), "prompt",
         "context_length_exceeded"),
        (lambda: prompt_request([1, 99999]), "prompt", "invalid_parameter"),
        (lambda: prompt_request(""), "prompt", "invalid_parameter"),
        (lambda: chat_request(model=""), "model", "invalid_parameter"),
    ],
)
def test_invalid_requests_name_the_field(generation_stub, request_factory, param, reason):
    with pytest.raises(grpc.RpcError) as err:
        list(generation_stub.Generate(request_factory(), timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(err.value)
    assert (info.reason, info.metadata["param"]) == (reason, param)
    assert info.metadata["type"] == "invalid_request_error"
    assert err.value.details()


def test_unknown_role_is_named(generation_stub):
    request = chat_request()
    request.chat.messages.add(role=generation_pb2.ROLE_UNSPECIFIED, content="x")
    with pytest.raises(grpc.RpcError) as err:
        list(generation_stub.Generate(request, timeout=30))
    assert error_info(err.value).metadata["param"] == "messages[1].role"


def test_unknown_model_is_not_found(generation_stub):
    with pytest.raises(grpc.RpcError) as err:
        list(generation_stub.Generate(chat_request(model="gpt-4o"), timeout=30))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(err.value).reason == "model_not_found"


def test_context_length_message_gives_the_figures(generation_stub):
    with pytest.raises(grpc.RpcError) as err:  # (strict: otherwise max_tokens is capped)
        list(generation_stub.Generate(_strict(chat_request(max_tokens=CONTEXT_WINDOW)),
                                      timeout=30))
    assert f"maximum context length is {CONTEXT_WINDOW} tokens" in err.value.details()
    assert f"{CONTEXT_WINDOW} in the completion" in err.value.details()
