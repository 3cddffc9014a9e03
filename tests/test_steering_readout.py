"""SAE activation readout end to end (return_sae_activations): its shape and
positions, pre_steering vs post_steering, streaming, echo and scoring read
unsteered, and its refusals.

Per-request steering is test_steering.py's; clusters, circuits and the
management API are test_steering_management.py's. These tests change steering
state, so they run against the steering tests' own engine and bridge
(conftest.py's `steer`, built by steering_helpers.py), never the session stack.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import MODEL
from tests.steering_helpers import L0, L1, MESSAGES, error, profile

# -- activations -----------------------------------------------------------------------------------


def _read(stack, positions="completion", **extra):
    spec = {"positions": positions, "top_k": 4, **extra.pop("spec", {})}
    body = {"model": MODEL, "messages": MESSAGES, "temperature": 0, "max_tokens": 6,
            "return_sae_activations": spec, **extra}
    return stack.api("POST", "/v1/chat/completions", body)


def test_activation_readout_shape_and_positions(clean):
    reply = _read(clean)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    read = body["millm"]["sae_activations"]
    assert set(read) == {"sae_id", "layer", "read_point", "positions", "note"}
    assert (read["sae_id"], read["layer"], read["read_point"]) == (L1, 1, "post_steering")
    assert "not an unsteered counterfactual" in read["note"]
    prompt_tokens = body["usage"]["prompt_tokens"]
    completion = body["usage"]["completion_tokens"]
    # The final sampled token is never fed back, so it has no activation.
    assert [p["position"] for p in read["positions"]] == list(
        range(prompt_tokens, prompt_tokens + completion - 1))
    for p in read["positions"]:
        values = [f["value"] for f in p["features"]]
        assert len(values) <= 4 and values == sorted(values, reverse=True)
        assert all(v > 0 for v in values)

    prompt = _read(clean, "prompt").json()["millm"]["sae_activations"]["positions"]
    assert [p["position"] for p in prompt] == list(range(prompt_tokens))
    last = _read(clean, "last").json()["millm"]["sae_activations"]["positions"]
    assert [p["position"] for p in last] == [prompt_tokens + completion - 2]
    window = _read(clean, {"start": 2, "end": 5}).json()["millm"]["sae_activations"]
    assert [p["position"] for p in window["positions"]] == [2, 3, 4]
    assert [p["token_id"] for p in window["positions"]] == [p["token_id"] for p in prompt[2:5]]

    # Named features are reported even at zero, in the order of their values.
    named = _read(clean, "prompt", spec={"features": [3, 77], "top_k": 2}).json()
    for p in named["millm"]["sae_activations"]["positions"]:
        assert sorted(f["index"] for f in p["features"]) == [3, 77]
    # A response that did not ask has no millm key.
    plain = clean.api("POST", "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES,
                                                       "max_tokens": 3})
    assert "millm" not in plain.json()


def _strongest_on_the_prompt(stack) -> int:
    """The layer-1 feature that fires hardest on the test prompt, unsteered."""
    read = _read(stack, "prompt", spec={"top_k": 1, "read_point": "pre_steering"}).json()
    top = [p["features"][0] for p in read["millm"]["sae_activations"]["positions"]]
    return max(top, key=lambda f: f["value"])["index"]


def test_pre_steering_removes_only_this_layers_delta(clean):
    strength = 5.0
    # A feature active on the prompt, so that there are activations to compare.
    feature = _strongest_on_the_prompt(clean)
    profile(clean, "one", (1, feature, strength))
    spec = {"features": [feature], "top_k": 1}
    post = _read(clean, "all", profile="one", spec=spec).json()["millm"]["sae_activations"]
    pre = _read(clean, "all", profile="one",
                spec={**spec, "read_point": "pre_steering"}).json()["millm"]["sae_activations"]
    assert pre["read_point"] == "pre_steering"
    pairs = [(a["features"][0]["value"], b["features"][0]["value"])
             for a, b in zip(pre["positions"], post["positions"], strict=True)]
    # Tied unit-norm decoder and encoder: the delta raises the feature's
    # pre-activation by exactly the strength (where it was active at all).
    assert any(before > 0 for before, _ in pairs), pairs
    for before, after in pairs:
        if before > 0:
            assert after - before == pytest.approx(strength, abs=1e-3)
        else:
            assert after >= 0


def test_activations_stream_in_a_last_chunk_of_their_own(clean):
    body = {"model": MODEL, "messages": MESSAGES, "temperature": 0, "max_tokens": 5,
            "stream": True, "stream_options": {"include_usage": True},
            "return_sae_activations": {"positions": "last"}}
    reply = clean.api("POST", "/v1/chat/completions", body)
    events = [line[len("data: "):] for line in reply.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    final = json.loads(events[-2])
    assert final["choices"] == [] and set(final["millm"]) == {"sae_activations"}
    assert json.loads(events[-3])["usage"]["completion_tokens"] == 5
    assert all("millm" not in json.loads(e) for e in events[:-2])


def test_echo_is_read_under_the_completions_steering_and_scoring_is_not(clean):
    echo = {"model": MODEL, "prompt": "The sea is calm", "max_tokens": 0, "echo": True,
            "logprobs": 2}
    scoring = {"model": MODEL, "prompt": "The sea is calm", "max_tokens": 1, "logprobs": 2}
    plain_echo = clean.api("POST", "/v1/completions", echo).json()["choices"][0]["logprobs"]
    plain_score = clean.api("POST", "/v1/completions", scoring).json()["choices"][0]["logprobs"]
    clean.ok("PUT", "/api/steering", {"values": [{"layer": 1, "feature": 3, "strength": 30}]})
    steered_echo = clean.api("POST", "/v1/completions", echo).json()["choices"][0]["logprobs"]
    assert steered_echo["tokens"] == plain_echo["tokens"]
    assert steered_echo["token_logprobs"] != plain_echo["token_logprobs"]
    assert clean.api("POST", "/v1/completions", scoring).json()["choices"][0][
        "logprobs"] == plain_score


def test_activations_in_scoring_mode_are_unsteered(clean):
    spec = {"positions": "prompt", "features": [3], "top_k": 1}

    def prompt_values(max_tokens: int, **extra):
        reply = clean.api("POST", "/v1/completions", {
            "model": MODEL, "prompt": "The sea is", "max_tokens": max_tokens,
            "temperature": 0, "return_sae_activations": spec, **extra})
        assert reply.status_code == 200, reply.text
        read = reply.json()["millm"]["sae_activations"]
        return read, [p["features"][0]["value"] for p in read["positions"]], reply.headers

    # Nothing steering: the generation's prompt positions are the reference.
    _, unsteered, _ = prompt_values(2)
    profile(clean, "strong", (1, 3, 30.0))
    clean.ok("POST", "/api/profiles/strong/activate")
    _, steered, _ = prompt_values(2)  # the active profile steers a completion...
    read, scored, headers = prompt_values(1, logprobs=2)  # ...but never scoring
    assert headers["x-millm-steering"] == "none"
    assert read["read_point"] == "unsteered"
    assert scored == pytest.approx(unsteered, abs=1e-5)
    # Steering adds 30 to feature 3's pre-activation (tied unit-norm dictionary);
    # where the unsteered value was clipped at 0 the gap is a little less.
    for s_value, u_value in zip(steered, unsteered, strict=True):
        assert s_value - u_value == pytest.approx(30.0, abs=1e-3) if u_value > 0 else (
            25 < s_value - u_value <= 30.0)


@pytest.mark.parametrize(("extra", "param", "code", "words"), [
    ({"n": 2}, "n", "invalid_parameter", "'n' must be 1"),
    ({"extra_messages": [[{"role": "user", "content": "hi"}]]}, "extra_messages",
     "invalid_parameter", "one conversation"),
    ({"spec": {"sae_id": "sae_nothing"}}, "return_sae_activations.sae_id",
     "invalid_parameter", f"attached: {L0}, {L1}"),
    ({"spec": {}}, "return_sae_activations.sae_id", "invalid_parameter",
     f"name one in 'sae_id': {L0}, {L1}"),
    ({"spec": {"sae_id": L1, "features": [256]}}, "return_sae_activations.features[0]",
     "invalid_feature_index", "past the width"),
    ({"spec": {"sae_id": L1, "top_k": 65}}, "return_sae_activations.top_k",
     "invalid_parameter", "from 1 to 64"),
    ({"spec": {"sae_id": L1, "top_k": 64}, "positions": {"start": 0, "end": 1025}},
     "return_sae_activations", "invalid_parameter", "most is 65536"),
    ({"spec": {"sae_id": L1, "top_k": 64}, "max_tokens": 1000, "positions": "all"},
     None, None, None),
    ({"spec": {"sae_id": L1, "read_point": "middle"}}, "return_sae_activations.read_point",
     "invalid_parameter", "post_steering"),
])
def test_activation_refusals(clean, extra, param, code, words):
    clean.ok("POST", f"/api/saes/{L0}/attach")
    spec = extra.pop("spec", {"sae_id": L1})
    positions = extra.pop("positions", "completion")
    reply = _read(clean, positions, spec=spec, **extra)
    if code is None:  # the worst case just inside the limit: (14 + 1000) x 64
        assert reply.status_code == 200, reply.text
        return
    assert reply.status_code == 400, reply.text
    assert error(reply)["param"] == param and error(reply)["code"] == code
    assert words in error(reply)["message"]


def test_activation_refusals_for_several_prompts_and_no_sae(clean):
    reply = clean.api("POST", "/v1/completions", {
        "model": MODEL, "prompt": ["a", "b"], "max_tokens": 2,
        "return_sae_activations": {"positions": "last"}})
    assert reply.status_code == 400 and error(reply)["param"] == "prompt"
    clean.ok("POST", f"/api/saes/{L1}/detach")
    reply = _read(clean)
    assert reply.status_code == 400 and "No SAE is attached" in error(reply)["message"]
