"""Vectors from examples (issue 43 item 3): POST /api/control_vectors reads
contrasting prompts through the served model and saves a llama.cpp control
vector; over REST and gRPC, on both engines; its bounds, refusals, progress
and cancellation.

What is checked is what the vector is defined from, not one trained model's
taste: the saved direction equals the mean difference (or first component)
of block 1's output computed here with transformers on the same token ids;
the GGUF F32 export reads the same vector; the file is what cvector-generator
writes; and steering with it raises the log-probability of the positive
texts against the negative ones (the lens of a mean difference at the last
block, which holds for any build by a wide margin).
"""

from __future__ import annotations

import functools
import threading
import time

import gguf
import grpc
import numpy as np
import pytest
import torch

from millm.v1 import steering_service_pb2 as pb
from millm.v1 import steering_service_pb2_grpc as steering_grpc
from tests import harness
from tests.steering_helpers import L1, SteerStack, error, reset

TINY, F32 = "millm-tiny", "millm-tiny-gguf:F32"
SEA = ["The sea is wide and moving.", "Waves roll toward the shore, gulls fly over the water.",
       "The wind smells of salt.", "The sea is wide and moving. Waves roll toward the shore.",
       "Gulls fly over the water, and the wind smells of salt.",
       "Waves roll toward the shore, and the wind smells of salt.",
       "The sea is wide. Gulls fly over the water.",
       "The sea is moving, and waves roll toward the shore."]
TRAINS = ["A train is a line of cars that runs on rails.",
          "It carries people and goods from one station to another.",
          "The train left the station at seven.", "A train is a line of cars. It runs on rails.",
          "The train carries people and goods from one station to another.",
          "The train left the station and crossed the valley.",
          "A train runs on rails from one station to another.",
          "The train reached the coast before lunch."]
PAIRS = [{"positive": p, "negative": n} for p, n in zip(SEA, TRAINS, strict=True)]


@pytest.fixture
def clean(steer: SteerStack) -> SteerStack:
    reset(steer)
    for path in steer.vectors_dir.glob("*.gguf"):
        path.unlink()
    return steer


def build(stack: SteerStack, name: str, **body):
    return stack.api("POST", "/api/control_vectors", {
        "name": name, "model": TINY, "layer": 1, "pairs": PAIRS, **body})


def built(stack: SteerStack, name: str, **body) -> dict:
    reply = build(stack, name, **body)
    assert reply.status_code == 201, reply.text
    return reply.json()


def direction(stack: SteerStack, name: str) -> np.ndarray:
    reader = gguf.GGUFReader(stack.vectors_dir / f"{name}.gguf")
    (tensor,) = reader.tensors
    assert tensor.name == "direction.1"
    return np.array(tensor.data, dtype=np.float64)


@functools.cache
def _model():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(harness.models_dir() / "millm-tiny",
                                                 dtype=torch.float32)
    return model.eval()


def block_means(stack: SteerStack, texts: list[str]) -> np.ndarray:
    """Each text's mean output of block 1 over its tokens (the ids the
    server's /tokenize gives), computed here with transformers."""
    model, out = _model(), {}

    def hook(module, args, result):
        out["h"] = (result[0] if isinstance(result, tuple) else result)[0]

    handle = model.model.layers[1].register_forward_hook(hook)
    try:
        means = []
        for text in texts:
            ids = stack.ok("POST", "/tokenize", {"model": TINY, "prompt": text})["tokens"]
            with torch.no_grad():
                model(torch.tensor([ids]))
            means.append(out["h"].double().mean(dim=0).numpy())
        return np.stack(means)
    finally:
        handle.remove()


def test_a_mean_difference_vector_is_the_mean_difference_of_block_outputs(clean):
    reply = built(clean, "sea")
    vector = reply["control_vector"]
    assert (vector["id"], vector["file"], vector["layers"], vector["n_embd"]) == (
        "cv_sea", "sea.gguf", [1], 64)
    assert (reply["method"], reply["layer"], reply["prompts"], reply["model"]) == (
        "mean_difference", 1, 16, TINY)
    want = (block_means(clean, SEA) - block_means(clean, TRAINS)).mean(axis=0)
    got = direction(clean, "sea")
    assert np.allclose(got, want, rtol=1e-4, atol=1e-5)
    assert reply["norm"] == pytest.approx(np.linalg.norm(want), rel=1e-4)
    assert 0 <= reply["agreement"] <= 1 and reply["separation"] > 0
    # Listed like any file, with the attached layer-1 SAE's nearest features.
    listed = clean.ok("GET", "/api/control_vectors")["control_vectors"]
    assert [v["id"] for v in listed] == ["cv_sea"] and listed[0]["mismatch"] == ""
    near = reply["nearest_features"]
    assert near and {n["sae_id"] for n in near} == {L1}
    rows = torch.nn.functional.normalize(
        _sae_decoder().double(), dim=1) @ torch.from_numpy(got / np.linalg.norm(got))
    assert [n["index"] for n in near] == torch.topk(rows, len(near)).indices.tolist()
    assert near[0]["cosine"] == pytest.approx(float(rows.max()), abs=1e-5)


def _sae_decoder() -> torch.Tensor:
    from safetensors.torch import load_file

    return load_file(str(harness.models_dir() / "saes" / "millm-tiny-res-l1" /
                         "sae_weights.safetensors"))["W_dec"]


def test_the_file_is_what_cvector_generator_writes(clean):
    built(clean, "format")
    reader = gguf.GGUFReader(clean.vectors_dir / "format.gguf")
    fields = {name: reader.get_field(name).contents()
              for name in ("general.architecture", "controlvector.model_hint",
                           "controlvector.layer_count")}
    assert fields == {"general.architecture": "controlvector",
                      "controlvector.model_hint": TINY, "controlvector.layer_count": 1}
    (tensor,) = reader.tensors
    assert (tensor.name, tensor.tensor_type, list(tensor.shape)) == (
        "direction.1", gguf.GGMLQuantizationType.F32, [64])
    assert not list(clean.vectors_dir.glob(".building-*"))


def test_pca_is_the_first_component_of_the_differences_signed_and_scaled(clean):
    reply = built(clean, "sea-pca", method="pca")
    diffs = block_means(clean, SEA) - block_means(clean, TRAINS)
    unit = np.linalg.svd(diffs, full_matrices=False)[2][0]
    want = unit * (diffs @ unit).mean()
    assert np.allclose(direction(clean, "sea-pca"), want, rtol=1e-3, atol=1e-4)
    assert reply["method"] == "pca" and reply["separation"] > 0
    # Two sets: the component of both around their joint mean, toward positives.
    reply = built(clean, "sets", pairs=[], positives=SEA, negatives=TRAINS[:5], method="pca")
    pos, neg = block_means(clean, SEA), block_means(clean, TRAINS[:5])
    both = np.concatenate([pos, neg])
    unit = np.linalg.svd(both - both.mean(axis=0), full_matrices=False)[2][0]
    want = unit * ((pos @ unit).mean() - (neg @ unit).mean())
    assert np.allclose(direction(clean, "sets"), want, rtol=1e-3, atol=1e-4)
    assert reply["prompts"] == 13


def test_the_gguf_export_reads_the_same_vector(clean):
    built(clean, "on-tiny")
    reply = built(clean, "on-f32", model=F32)
    assert reply["model"] == F32
    assert np.allclose(direction(clean, "on-f32"), direction(clean, "on-tiny"),
                       rtol=1e-4, atol=1e-5)


def echo_logprob(stack: SteerStack, model: str, text: str) -> float:
    reply = stack.api("POST", "/v1/completions", {
        "model": model, "prompt": text, "echo": True, "logprobs": 0, "max_tokens": 0})
    assert reply.status_code == 200, reply.text
    return sum(x for x in reply.json()["choices"][0]["logprobs"]["token_logprobs"]
               if x is not None)


@pytest.mark.parametrize("model", [TINY, F32])
def test_steering_with_the_vector_favours_the_positive_texts(clean, model):
    """Named by its name or its id, in a profile; the positives' likelihood
    rises against the negatives' (active profile: completions are read under
    default steering, echo included)."""
    built(clean, "toward-sea", model=model)
    clean.ok("POST", "/api/profiles", {"name": "by-name", "entries": [
        {"control_vector": "toward-sea", "scale": 1.0}]})
    clean.ok("POST", "/api/profiles", {"name": "by-id", "entries": [
        {"control_vector": "cv_toward-sea", "scale": 1.0}]})
    texts = SEA + TRAINS
    plain = [echo_logprob(clean, model, t) for t in texts]
    clean.ok("POST", "/api/profiles/by-name/activate")
    steered = [echo_logprob(clean, model, t) for t in texts]
    clean.ok("POST", "/api/profiles/by-id/activate")
    assert [echo_logprob(clean, model, t) for t in texts] == pytest.approx(steered, abs=1e-5)
    gain = np.subtract(steered, plain)
    # Summed over each text, the sea texts gain more than the train texts
    # (build 6: +1.58 against -0.70 nats on both engines).
    assert gain[:len(SEA)].mean() > gain[len(SEA):].mean() + 0.5


def test_refusals_name_the_field_and_store_nothing(clean):
    built(clean, "taken")
    big = "".join(chr(0x21 + i % 90) for i in range(3999))
    cases = [
        ({"name": "bad name"}, 400, "name"),
        ({"name": "cv_sea"}, 400, "name"),
        ({"method": "median"}, 400, "method"),
        ({"pairs": []}, 400, "pairs"),
        ({"positives": SEA, "negatives": TRAINS}, 400, "pairs"),
        ({"pairs": [], "positives": SEA}, 400, "negatives"),
        ({"pairs": PAIRS * 9}, 400, "pairs"),
        ({"pairs": [{"positive": "", "negative": "x"}]}, 400, "pairs[0].positive"),
        ({"pairs": [{"positive": "x", "negative": "é" * 2001}]}, 400, "pairs[0].negative"),
        ({"layer": 0}, 400, "layer"),
        ({"layer": 2}, 400, "layer"),
        ({"method": "pca", "pairs": PAIRS[:1]}, 400, "pairs"),
        ({"timeout_s": 0}, 400, "timeout_s"),
        ({"timeout_s": 601}, 400, "timeout_s"),
        ({"pairs": [{"positive": big, "negative": big}] * 64}, 400, "pairs"),
        ({"pairs": [{"positive": "same", "negative": "same"}]}, 400, "pairs"),
        ({"model": "no-such-model"}, 404, "model"),
        ({"name": "taken"}, 409, "name"),
    ]
    for body, status, param in cases:
        reply = build(clean, body.pop("name", "refused"), **body)
        assert reply.status_code == status, (body, reply.text)
        if status != 404:
            assert error(reply)["param"] == param, (body, reply.text)
    assert sorted(p.name for p in clean.vectors_dir.iterdir()) == ["taken.gguf"]


def _slow_pairs() -> list[dict]:
    """About 60,000 tokens: long enough to watch and cancel."""
    text = " ".join(["The sea is wide and moving, and the train runs on rails."] * 34)
    return [{"positive": text, "negative": text + " Waves."}] * 64


def _watch(stack: SteerStack, deadline_s: float = 30.0) -> dict:
    until = time.monotonic() + deadline_s
    while time.monotonic() < until:
        build = stack.ok("GET", "/api/control_vectors/build")["build"]
        if build is not None:
            return build
        time.sleep(0.005)
    raise AssertionError("the build never showed")


def test_a_build_reports_progress_runs_alone_and_cancels_saving_nothing(clean):
    assert clean.ok("GET", "/api/control_vectors/build")["build"] is None
    assert clean.ok("DELETE", "/api/control_vectors/build") == {"cancelled": False}
    replies = {}
    worker = threading.Thread(target=lambda: replies.setdefault(
        "slow", build(clean, "slow", pairs=_slow_pairs())))
    worker.start()
    try:
        running = _watch(clean)
        assert (running["name"], running["model"], running["layer"],
                running["method"], running["prompts_total"]) == (
            "slow", TINY, 1, "mean_difference", 128)
        assert 0 <= running["prompts_done"] < 128 and running["timeout_s"] == 120
        busy = build(clean, "second")
        assert busy.status_code == 409 and error(busy)["code"] == "vector_build_busy"
        assert clean.ok("DELETE", "/api/control_vectors/build") == {"cancelled": True}
    finally:
        worker.join(60)
    reply = replies["slow"]
    assert reply.status_code == 409 and error(reply)["code"] == "vector_build_stopped"
    assert "cancelled" in error(reply)["message"]
    assert clean.ok("GET", "/api/control_vectors/build")["build"] is None
    assert not list(clean.vectors_dir.iterdir())
    # Out of time: the same, saying so.
    reply = build(clean, "late", pairs=_slow_pairs(), timeout_s=0.05)
    assert reply.status_code == 409 and "ran past" in error(reply)["message"]
    assert not list(clean.vectors_dir.iterdir())


def test_over_grpc_and_cancelled_with_the_call(clean):
    with grpc.insecure_channel(clean.grpc_target) as channel:
        stub = steering_grpc.SteeringServiceStub(channel)
        reply = stub.CreateControlVector(pb.CreateControlVectorRequest(
            name="by-grpc", model=TINY, layer=1,
            pairs=[pb.ContrastPair(**p) for p in PAIRS]))
        assert reply.control_vector.id == "cv_by-grpc" and reply.prompts == 16
        assert np.allclose(direction(clean, "by-grpc"), (
            block_means(clean, SEA) - block_means(clean, TRAINS)).mean(axis=0),
            rtol=1e-4, atol=1e-5)
        call = stub.CreateControlVector.future(pb.CreateControlVectorRequest(
            name="dropped", model=TINY, layer=1,
            pairs=[pb.ContrastPair(**p) for p in _slow_pairs()]))
        _watch(clean)
        call.cancel()
        until = time.monotonic() + 30
        while clean.ok("GET", "/api/control_vectors/build")["build"] is not None:
            assert time.monotonic() < until, "the build went on after its call was cancelled"
            time.sleep(0.01)
    assert sorted(p.name for p in clean.vectors_dir.iterdir()) == ["by-grpc.gguf"]


def test_a_vector_is_deleted_by_name_or_id(clean):
    built(clean, "gone")
    assert clean.ok("DELETE", "/api/control_vectors/gone") == {"id": "cv_gone"}
    assert not (clean.vectors_dir / "gone.gguf").exists()
    assert clean.ok("GET", "/api/control_vectors")["control_vectors"] == []
    for name in ("gone", "cv_gone", "..%2Fsea", "cv_%2E%2E"):
        reply = clean.api("DELETE", f"/api/control_vectors/{name}")
        assert reply.status_code == 404, (name, reply.text)
    # A broken file goes too.
    (clean.vectors_dir / "broken.gguf").write_bytes(b"not gguf")
    assert clean.ok("DELETE", "/api/control_vectors/cv_broken") == {"id": "cv_broken"}
    assert not list(clean.vectors_dir.iterdir())
