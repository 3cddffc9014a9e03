"""Steered and unsteered side by side (`steering_compare`, issue 43 item 4):
each text equals its separate request, streamed or not, on chat and text
completions, on both engines and over gRPC; the divergence is what the two
plans' teacher-forced log-probabilities say (checked against echo, which
reads a prompt under the same plans); the refusals.

Steering that must take effect uses a feature this build's greedy text
responds to (steering_helpers.feature_that_changes_the_text).
"""

from __future__ import annotations

import functools
import json

import grpc
import pytest

from millm.v1 import generation_pb2, generation_service_pb2, generation_service_pb2_grpc
from tests.http_helpers import call
from tests.steering_helpers import MESSAGES, SteerStack, error, feature_that_changes_the_text, reset

TINY, F32 = "millm-tiny", "millm-tiny-gguf:F32"
MODELS = [TINY, F32]
STRENGTH = 8.0


@pytest.fixture
def clean(steer: SteerStack) -> SteerStack:
    reset(steer)
    return steer


@functools.cache
def _feature(port: int) -> int:
    return feature_that_changes_the_text(port, STRENGTH)


def steering_profile(stack: SteerStack) -> str:
    stack.ok("POST", "/api/profiles", {"name": "cmp", "entries": [
        {"layer": 1, "feature": _feature(stack.http_port), "strength": STRENGTH}]})
    return "cmp"


def post(stack: SteerStack, path: str, body: dict) -> dict:
    reply = call(stack.http_port, "POST", path, body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def texts(choices: list[dict]) -> list[str]:
    return [c["message"]["content"] if "message" in c else c["text"] for c in choices]


def chat(model: str, **extra) -> dict:
    return {"model": model, "messages": MESSAGES, "max_tokens": 16, **extra}


@pytest.mark.parametrize("model", MODELS)
def test_each_side_equals_its_separate_request(clean, model):
    name = steering_profile(clean)
    for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 5, "n": 2}):
        both = post(clean, "/v1/chat/completions", chat(model, profile=name,
                                                         steering_compare=True, **sampling))
        steered = post(clean, "/v1/chat/completions", chat(model, profile=name, **sampling))
        plain = post(clean, "/v1/chat/completions", chat(model, profile=name,
                                                         steering_intensity="off", **sampling))
        assert texts(both["choices"]) == texts(steered["choices"])
        assert texts(both["millm"]["unsteered"]["choices"]) == texts(plain["choices"])
        assert [c["finish_reason"] for c in both["millm"]["unsteered"]["choices"]] == [
            c["finish_reason"] for c in plain["choices"]]
        # (What the prefix cache held differs from call to call.)
        assert [both["usage"][k] for k in ("prompt_tokens", "completion_tokens")] == [
            steered["usage"][k] for k in ("prompt_tokens", "completion_tokens")]
        assert both["millm"]["unsteered"]["usage"]["completion_tokens"] == plain["usage"][
            "completion_tokens"]
        # One entry per generated token of each steered choice.
        divergence = both["millm"]["divergence"]
        assert [d["index"] for d in divergence] == list(range(len(both["choices"])))
        assert sum(len(d["tokens"]) for d in divergence) == both["usage"]["completion_tokens"]
        for d in divergence:
            for t in d["tokens"]:
                assert t["kl"] >= 0
                assert t["logprob_diff"] == pytest.approx(t["logprob"] - t["unsteered_logprob"])
    # The feature changes the greedy text: the two sides differ, and somewhere
    # the two distributions do.
    greedy = post(clean, "/v1/chat/completions", chat(model, profile=name,
                                                       steering_compare=True, temperature=0))
    assert texts(greedy["choices"]) != texts(greedy["millm"]["unsteered"]["choices"])
    assert max(t["kl"] for t in greedy["millm"]["divergence"][0]["tokens"]) > 1e-3


@pytest.mark.parametrize("model", MODELS)
def test_without_steering_the_sides_are_one(clean, model):
    both = post(clean, "/v1/chat/completions", chat(model, temperature=0,
                                                     steering_compare=True))
    assert texts(both["choices"]) == texts(both["millm"]["unsteered"]["choices"])
    for t in both["millm"]["divergence"][0]["tokens"]:
        assert t["kl"] == pytest.approx(0, abs=1e-6) and t["logprob_diff"] == 0


def echo_logprobs(stack: SteerStack, model: str, ids: list[int]) -> list[float]:
    reply = post(stack, "/v1/completions", {"model": model, "prompt": ids, "echo": True,
                                             "logprobs": 0, "max_tokens": 0})
    return reply["choices"][0]["logprobs"]["token_logprobs"]


@pytest.mark.parametrize("model", MODELS)
def test_completions_compare_default_steering_and_the_logprobs_are_echos(clean, model):
    """Text completions take the active profile (default steering); the
    divergence's log-probabilities are what echo reads of the same ids under
    the same plan (active profile) and with none."""
    name = steering_profile(clean)
    prompt = "The sea is"
    clean.ok("POST", f"/api/profiles/{name}/activate")
    body = {"model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0}
    both = post(clean, "/v1/completions", {**body, "steering_compare": True})
    assert texts(both["choices"]) == texts(post(clean, "/v1/completions", body)["choices"])
    tokens = both["millm"]["divergence"][0]["tokens"]
    prompt_ids = clean.ok("POST", "/tokenize", {"model": model, "prompt": prompt})["tokens"]
    ids = prompt_ids + [t["token_id"] for t in tokens]
    steered = echo_logprobs(clean, model, ids)[len(prompt_ids):]
    clean.ok("DELETE", "/api/profiles/active")
    assert texts(both["millm"]["unsteered"]["choices"]) == texts(
        post(clean, "/v1/completions", body)["choices"])
    plain = echo_logprobs(clean, model, ids)[len(prompt_ids):]
    assert [t["logprob"] for t in tokens] == pytest.approx(steered, abs=2e-3)
    assert [t["unsteered_logprob"] for t in tokens] == pytest.approx(plain, abs=2e-3)


def sse(stack: SteerStack, body: dict) -> list[dict]:
    reply = call(stack.http_port, "POST", "/v1/chat/completions", {**body, "stream": True})
    assert reply.status_code == 200, reply.text
    return [json.loads(line[6:]) for line in reply.text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


@pytest.mark.parametrize("model", MODELS)
def test_streamed_the_unsteered_side_rides_under_millm(clean, model):
    name = steering_profile(clean)
    body = chat(model, profile=name, steering_compare=True, temperature=1.0, seed=3, n=2,
                stream_options={"include_usage": True})
    whole = post(clean, "/v1/chat/completions", {k: v for k, v in body.items()
                                                 if k != "stream_options"})
    chunks = sse(clean, body)
    steered, unsteered, finishes = {}, {}, {}
    divergence_at = usage_at = None
    for n, chunk in enumerate(chunks):
        for c in chunk["choices"]:
            steered[c["index"]] = steered.get(c["index"], "") + (c["delta"].get("content") or "")
        millm = chunk.get("millm") or {}
        for c in millm.get("unsteered", {}).get("choices", []):
            assert not chunk["choices"]
            unsteered[c["index"]] = unsteered.get(c["index"], "") + (
                c["delta"].get("content") or "")
            if c["finish_reason"]:
                finishes[c["index"]] = c["finish_reason"]
        if "divergence" in millm:
            divergence_at = n
            assert millm["divergence"] == whole["millm"]["divergence"]
            assert millm["unsteered"]["usage"] == whole["millm"]["unsteered"]["usage"]
        if chunk.get("usage"):
            usage_at = n
    assert [steered[i] for i in sorted(steered)] == texts(whole["choices"])
    assert [unsteered[i] for i in sorted(unsteered)] == texts(
        whole["millm"]["unsteered"]["choices"])
    assert finishes == {c["index"]: c["finish_reason"]
                        for c in whole["millm"]["unsteered"]["choices"]}
    assert divergence_at is not None and usage_at is not None and divergence_at < usage_at


def test_over_grpc(clean):
    name = steering_profile(clean)
    with grpc.insecure_channel(clean.grpc_target) as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        request = generation_service_pb2.GenerateRequest(
            model=TINY, chat=generation_pb2.ChatInput(messages=[generation_pb2.ChatMessage(
                role=generation_pb2.ROLE_USER, content=MESSAGES[0]["content"])]),
            sampling=generation_pb2.SamplingParams(temperature=0, max_tokens=12),
            profile=name, steering_compare=True)
        messages = list(stub.Generate(request))
    steered = "".join(d.text for m in messages for d in m.choices)
    unsteered = "".join(d.text for m in messages for d in m.unsteered_choices)
    (comparison,) = [m.comparison for m in messages if m.HasField("comparison")]
    assert steered != unsteered
    assert sum(len(c.tokens) for c in comparison.choices) == messages[-1].usage.completion_tokens
    assert comparison.unsteered_usage.completion_tokens > 0
    order = ["comparison" if m.HasField("comparison") else "usage" if m.HasField("usage")
             else "" for m in messages]
    assert order.index("comparison") < order.index("usage")


def test_refusals(clean):
    for path, body, param in (
            ("/v1/completions", {"model": TINY, "prompt": "x", "max_tokens": 4, "echo": True},
             "steering_compare"),
            ("/v1/completions", {"model": TINY, "prompt": "x", "max_tokens": 1, "logprobs": 1},
             "steering_compare"),
            ("/v1/responses", {"model": TINY, "input": "x"}, "steering_compare")):
        reply = call(clean.http_port, "POST", path, {**body, "steering_compare": True})
        assert reply.status_code == 400, reply.text
        assert error(reply)["param"] == param
    reply = call(clean.http_port, "POST", "/v1/messages", {
        "model": TINY, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
        "steering_compare": True})
    assert reply.status_code == 400 and "steering_compare" in reply.text
    # false is no change, anywhere.
    reply = call(clean.http_port, "POST", "/v1/chat/completions", chat(
        TINY, steering_compare=False, max_tokens=2))
    assert reply.status_code == 200 and "millm" not in reply.json()
