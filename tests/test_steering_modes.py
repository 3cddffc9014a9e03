"""Steering modes and conditions (issue 44 items 1, 2 and 4).

First what holds for any weights, on tiny random SAEs and plans: a clamp's
edit lands the SAE's reading of the feature exactly on its value (and
changes nothing where it already reads it), an ablate's leaves it at zero,
for each SAE family; a control vector's clamp and ablate set the stream's
component along its direction; conditions fire where their definition says;
plan keys differ by mode and condition; bad entries are refused naming the
field.

Then on the real stack, both engines (the transformers checkpoint and its
F32 export): a clamp at a feature's current value (zero everywhere the
answer goes) leaves the greedy text alone, a clamp at a high value reads
back that value at every position, an ablate drives the feature's readout to
zero, and an entry conditioned on text leaves the answer identical up to
that text and different after it, while one whose trigger never appears
changes nothing at all.
"""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from service.errors import EngineError
from service.steering import conditions, documents
from service.steering.conditions import Condition, Replayed, RowConditions
from service.steering.plan import Edit, LayerSteering, SteeringPlan
from service.steering.sae import SaeWeights, read_info
from tests.steering_helpers import L1, MESSAGES, error

D_IN, D_SAE = 8, 16
TINY, F32 = "millm-tiny", "millm-tiny-gguf:F32"


def apply(edit: Edit, x: torch.Tensor) -> torch.Tensor:
    """plan.Edit as both engines compute it."""
    read, move = torch.from_numpy(edit.read).double(), torch.from_numpy(edit.move).double()
    reading = x @ read + edit.bias
    shift = torch.where(reading > edit.above, edit.target - reading, torch.zeros_like(reading))
    return x + shift[:, None] * move


def make_sae(tmp_path: pathlib.Path, architecture: str, seed: int = 3) -> SaeWeights:
    g = torch.Generator().manual_seed(seed)
    w_dec = torch.randn(D_SAE, D_IN, generator=g)
    tensors = {"W_enc": w_dec.T.clone() + 0.3 * torch.randn(D_IN, D_SAE, generator=g),
               "b_enc": torch.randn(D_SAE, generator=g) * 0.1,
               "W_dec": w_dec, "b_dec": torch.randn(D_IN, generator=g) * 0.1}
    cfg = {"architecture": architecture, "d_in": D_IN, "d_sae": D_SAE,
           "hook_name": "blocks.1.hook_resid_post", "apply_b_dec_to_input": True}
    if architecture == "jumprelu":
        tensors["threshold"] = torch.full((D_SAE,), 0.2)
    if architecture == "topk":
        cfg["k"] = 4
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in tensors.items()},
              str(tmp_path / "sae_weights.safetensors"))
    return SaeWeights(read_info(tmp_path), torch.device("cpu"), torch.float64)


@pytest.mark.parametrize("architecture", ["standard", "jumprelu", "topk"])
def test_clamp_reads_back_its_value_and_ablate_reads_zero(tmp_path, architecture):
    sae = make_sae(tmp_path / architecture, architecture)
    x = torch.randn(32, D_IN, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    acts = sae.encode(x)
    for feature in range(D_SAE):
        clamped = sae.encode(apply(sae.edit(feature, 40.0, False, 1.0, "e"), x))[:, feature]
        assert clamped.tolist() == pytest.approx([40.0] * len(x), rel=1e-6)  # past any top k
        ablated = sae.encode(apply(sae.edit(feature, 0.0, True, 1.0, "e"), x))[:, feature]
        assert ablated.abs().max() < 1e-6  # float32 edits
        # Clamping to what it reads now changes nothing, where it fires.
        for row in torch.nonzero(acts[:, feature] > 0).flatten().tolist():
            same = apply(sae.edit(feature, float(acts[row, feature]), False, 1.0, "e"),
                         x[row:row + 1])
            assert torch.allclose(same, x[row:row + 1], atol=1e-6)
        # Where it does not fire, ablating changes nothing either.
        quiet = torch.nonzero(acts[:, feature] == 0).flatten()
        if architecture != "topk" and len(quiet):
            edit = sae.edit(feature, 0.0, True, 1.0, "e")
            assert torch.equal(apply(edit, x[quiet]), x[quiet])
        # The dial moves part of the way.
        half = sae.edit(feature, 9.0, False, 0.5, "e")
        pre = (x - sae.b_dec) @ sae.W_enc[:, feature] + sae.b_enc[feature]
        moved = (apply(half, x) - sae.b_dec) @ sae.W_enc[:, feature] + sae.b_enc[feature]
        assert moved.tolist() == pytest.approx(((pre + 9.0) / 2).tolist(), rel=1e-6)


def test_a_feature_its_decoder_cannot_raise_is_refused(tmp_path):
    sae = make_sae(tmp_path, "standard")
    sae.W_dec[2] = -sae.W_enc[:, 2]
    with pytest.raises(EngineError) as info:
        sae.edit(2, 1.0, False, 1.0, "members[0]")
    assert info.value.code == "invalid_steering_mode" and info.value.param == "members[0]"


def test_conditions_fire_where_defined():
    state = RowConditions((Condition("after_text", text="blue sea"),
                           Condition("from_position", position=6)))
    assert state.runs(0, 10) == [(0, 6, (False, False)), (6, 4, (False, True))]
    for piece in ("The", " blue", " s"):
        state.generated(piece)
        assert state.active(3) == (False, False)
    state.generated("ea is")  # the trigger ends inside this token
    assert state.active(3) == (True, False) and state.active(7) == (True, True)
    state.generated(" gone")
    assert state.active(3) == (True, False)  # once fired, it stays fired
    replay = Replayed((Condition("after_text", text="ab"),), [b"x", b"a", b"b", b"c", b"d"], 1)
    assert replay.runs(0, 5) == [(0, 2, (False,)), (2, 3, (True,))]


def test_plan_keys_differ_by_mode_and_condition():
    vector = np.ones(4, dtype=np.float32)
    add = LayerSteering(1, "s", (0,), (1.0,), vector)
    clamp = LayerSteering(1, "s", (), (), None, (Edit(vector, 0.0, 1.0, -math.inf, vector),))
    ablate = LayerSteering(1, "s", (), (), None, (Edit(vector, 0.0, 0.0, 0.0, vector),))
    plans = [SteeringPlan((add,)), SteeringPlan((clamp,)), SteeringPlan((ablate,)),
             SteeringPlan((), ((Condition("after_text", text="a"), (add,)),)),
             SteeringPlan((), ((Condition("after_text", text="b"), (add,)),)),
             SteeringPlan((), ((Condition("from_position", position=3), (add,)),))]
    keys = [p.key for p in plans]
    assert len(set(keys)) == len(keys)
    assert SteeringPlan((add,)).key == SteeringPlan((LayerSteering(
        1, "s", (0,), (1.0,), vector.copy()),)).key
    conditional = plans[3]
    assert conditional.ops((False,)) == {} and 1 in conditional.ops((True,))


@pytest.mark.parametrize("entry, param", [
    ({"layer": 1, "feature": 2, "mode": "clamp"}, "m[0].value"),
    ({"layer": 1, "feature": 2, "mode": "clamp", "value": -1}, "m[0].value"),
    ({"layer": 1, "feature": 2, "mode": "clamp", "value": 1, "strength": 2}, "m[0].strength"),
    ({"layer": 1, "feature": 2, "mode": "ablate", "value": 1}, "m[0].value"),
    ({"layer": 1, "feature": 2, "mode": "scale", "strength": 1}, "m[0].mode"),
    ({"layer": 1, "feature": 2, "strength": 1, "value": 3}, "m[0].value"),
    ({"layer": 1, "feature": 2, "strength": 1, "when": {"after_text": ""}},
     "m[0].when.after_text"),
    ({"layer": 1, "feature": 2, "strength": 1, "when": {"from_position": -1}},
     "m[0].when.from_position"),
    ({"layer": 1, "feature": 2, "strength": 1, "when": {"someday": 1}}, "m[0].when.someday"),
    ({"layer": 1, "feature": 2, "strength": 1, "when": {"feature": 3}}, "m[0].when.above"),
    ({"layer": 1, "feature": 2, "strength": 1, "when": {"probe": "p", "above": 1}},
     "m[0].when.above"),
    ({"control_vector": "cv_a", "scale": 1, "when": {"feature": 3, "above": 1}},
     "m[0].when.layer"),
    ({"abort_when": {"from_position": 3}}, "m[0].abort_when"),
    ({"layer": 1, "feature": 2, "strength": 1, "when": {}}, "m[0].when"),
    ({"control_vector": "cv_a", "mode": "clamp", "value": math.inf}, "m[0].value"),
])
def test_bad_entries_are_refused_naming_the_field(entry, param):
    with pytest.raises(EngineError) as info:
        documents.parse_entries([entry], "m")
    assert info.value.param == param, info.value.message


def test_entries_round_trip_through_their_json():
    raw = [{"layer": 1, "feature": 2, "mode": "clamp", "value": 3.5,
            "when": {"after_text": "sea"}},
           {"layer": 1, "feature": 5, "strength": 1.0, "when": {"probe": "p"}},
           {"layer": 2, "feature": 6, "strength": 1.0,
            "when": {"feature": 7, "above": 0.5, "layer": 2}},
           {"abort_when": {"feature": 8, "above": 1.0, "layer": 1}},
           {"layer": 1, "feature": 3, "mode": "ablate", "when": {"from_position": 9}},
           {"layer": 1, "feature": 4, "strength": 2.0},
           {"control_vector": "cv_a", "mode": "clamp", "value": -1.0}]
    entries = documents.parse_entries(raw, "m")
    assert [e.to_json() for e in entries] == raw
    assert documents.parse_entries([e.to_json() for e in entries], "m") == entries
    assert len(raw) < conditions.MAX_CONDITIONS


# -- on the real stack, both engines ------------------------------------------------


def _chat(stack, model: str, max_tokens: int = 16, **extra) -> dict:
    reply = stack.api("POST", "/v1/chat/completions", {
        "model": model, "messages": MESSAGES, "temperature": 0, "max_tokens": max_tokens,
        **extra})
    assert reply.status_code == 200, reply.text
    return reply.json()


def _text(body: dict) -> str:
    return body["choices"][0]["message"]["content"]


def _readout(stack, model: str, features: list[int], **extra) -> list[dict]:
    body = _chat(stack, model, return_sae_activations={
        "sae_id": L1, "positions": "all", "features": features}, **extra)
    return body["millm"]["sae_activations"]["positions"]


def _values(positions: list[dict], feature: int) -> list[float]:
    return [next((f["value"] for f in p["features"] if f["index"] == feature), 0.0)
            for p in positions]


def _profile(stack, name: str, *entries: dict) -> None:
    stack.api("DELETE", f"/api/profiles/{name}")
    stack.ok("POST", "/api/profiles", {"name": name, "entries": list(entries)})


@pytest.mark.parametrize("model", [TINY, F32])
def test_clamp_and_ablate_on_the_real_model(clean, model):
    stack = clean
    plain = _readout(stack, model, list(range(256)))
    # Zero at every position of this answer, and firing at some.
    silent = [f for f in range(256) if max(_values(plain, f)) == 0.0]
    firing = sorted(range(256), key=lambda f: -sum(_values(plain, f)))
    assert silent and _values(plain, firing[0])
    # Clamped at what it reads (zero everywhere): the same greedy text.
    _profile(stack, "keep", {"layer": 1, "feature": silent[0], "mode": "clamp", "value": 0})
    assert _text(_chat(stack, model, profile="keep")) == _text(_chat(stack, model))
    # Clamped high: the readout reads that value back at every steered position.
    _profile(stack, "high", {"layer": 1, "feature": silent[0], "mode": "clamp", "value": 6})
    high = _values(_readout(stack, model, [silent[0]], profile="high"), silent[0])
    assert len(high) > 20 and high == pytest.approx([6.0] * len(high), rel=1e-3)
    # Ablated: its readout is zero wherever it fired.
    _profile(stack, "gone", {"layer": 1, "feature": firing[0], "mode": "ablate"})
    gone = _values(_readout(stack, model, [firing[0]], profile="gone"), firing[0])
    assert max(gone) < 1e-3
    # The dial scales the move: half way to the value.
    half = _values(_readout(stack, model, [silent[0]], profile="high",
                            steering_intensity=0.5), silent[0])
    assert min(half) < 6.0 * 0.75


@pytest.mark.parametrize("model", [TINY, F32])
def test_an_entry_after_a_trigger_text(clean, model):
    stack = clean
    plain = _text(_chat(stack, model, max_tokens=32))
    words = plain.split()
    assert len(words) >= 6, plain
    trigger = " ".join(words[2:4])
    cut = plain.index(trigger) + len(trigger)
    changed = None
    for feature in range(0, 256, 5):
        _profile(stack, "after", {"layer": 1, "feature": feature, "strength": 12.0,
                                  "when": {"after_text": trigger}})
        text = _text(_chat(stack, model, max_tokens=32, profile="after"))
        # Identical through the token that completes the trigger, always.
        assert text[:cut] == plain[:cut], (feature, text)
        if text != plain:
            changed = feature
            break
    assert changed is not None, "no feature changes the text after the trigger"
    # A trigger that never appears: nothing at all changes, log-probabilities included.
    _profile(stack, "never", {"layer": 1, "feature": changed, "strength": 12.0,
                              "when": {"after_text": "zebra crossing"}})
    logprobs = {} if model == F32 else {"logprobs": True, "top_logprobs": 2}
    unsteered = _chat(stack, model, max_tokens=32, **logprobs)
    never = _chat(stack, model, max_tokens=32, profile="never", **logprobs)
    assert never["choices"] == unsteered["choices"]


def test_bad_steering_entries_are_400_naming_the_field(clean):
    reply = clean.api("POST", "/api/profiles", {"name": "bad", "entries": [
        {"layer": 1, "feature": 3, "mode": "clamp", "value": -2}]})
    assert reply.status_code == 400 and error(reply)["param"] == "entries[0].value"
    reply = clean.api("POST", "/api/profiles", {"name": "bad", "entries": [
        {"layer": 1, "feature": 3, "strength": 1, "when": {"feature": 999, "above": 1}}]})
    assert reply.status_code == 400 and error(reply)["param"] == "entries[0].when.feature"
    reply = clean.api("PUT", "/api/steering", {"values": [
        {"layer": 1, "feature": 3, "mode": "fade", "strength": 1}]})
    assert reply.status_code == 400 and error(reply)["param"] == "values[0].mode"
    # Written and read back in the same shape.
    entry = {"layer": 1, "feature": 3, "mode": "clamp", "value": 2.5,
             "when": {"after_text": "sea"}}
    clean.ok("PUT", "/api/steering", {"values": [entry]})
    assert clean.ok("GET", "/api/steering")["steering"]["values"] == [{**entry, "sae_id": ""}]


def _plain_reading(stack, model: str) -> tuple[dict, list[dict]]:
    body = _chat(stack, model, max_tokens=24, return_sae_activations={
        "sae_id": L1, "positions": "all", "top_k": 64})
    return body, body["millm"]["sae_activations"]["positions"]


def _busiest(positions: list[dict], first: int) -> int:
    """The feature active at the most positions from `first` on, but not all."""
    counts: dict[int, int] = {}
    for p in positions[first:]:
        for f in p["features"]:
            counts[f["index"]] = counts.get(f["index"], 0) + 1
    some = [f for f, n in counts.items() if n < len(positions) - first] or list(counts)
    return max(some, key=lambda f: counts[f])


@pytest.mark.parametrize("model", [TINY, F32])
def test_feature_and_probe_conditions_read_the_previous_position(clean, model):
    stack = clean
    plain, positions = _plain_reading(stack, model)
    prompt_len = plain["usage"]["prompt_tokens"]
    watched = _busiest(positions, prompt_len - 1)
    values = sorted(_values(positions[prompt_len - 1:], watched))
    middle = values[len(values) // 2]  # it is above this at some generated positions only
    after_prompt = {"from_position": prompt_len}
    steer = {"layer": 1, "feature": feature_changing(stack, model, after_prompt),
             "strength": 12.0}

    def text(*entries) -> str:
        _profile(stack, "cond", *entries)
        return _text(_chat(stack, model, max_tokens=24, profile="cond"))

    # Above -1 always holds, from the first generated position: as from_position does.
    always = text({**steer, "when": after_prompt})
    assert always != _text(plain)
    assert text({**steer, "when": {"feature": watched, "above": -1}}) == always
    # Never above: exactly unsteered.
    assert text({**steer, "when": {"feature": watched, "above": 9999}}) == _text(plain)
    # A probe on that feature alone fires where the feature condition holds.
    stack.api("DELETE", "/api/probes/watch")
    stack.ok("POST", "/api/probes", {"name": "watch", "sae_id": L1, "feature": watched,
                                     "threshold": middle + 1e-4})
    try:
        by_probe = text({**steer, "when": {"probe": "watch"}})
        assert by_probe == text({**steer, "when": {"feature": watched, "above": middle + 1e-4,
                                                   "layer": 1}})
    finally:
        stack.ok("DELETE", "/api/probes/watch")
    # A probe that does not exist is refused when written.
    reply = stack.api("POST", "/api/profiles", {"name": "ghost", "entries": [
        {**steer, "when": {"probe": "ghost"}}]})
    assert reply.status_code == 400 and error(reply)["code"] == "invalid_steering_condition"


def feature_changing(stack, model: str, when: dict) -> int:
    """A layer-1 feature whose direction at strength 12 under `when` changes
    the greedy text."""
    plain = _text(_chat(stack, model, max_tokens=24))
    for feature in range(0, 256, 5):
        _profile(stack, "probe-change", {"layer": 1, "feature": feature, "strength": 12.0,
                                         "when": when})
        if _text(_chat(stack, model, max_tokens=24, profile="probe-change")) != plain:
            return feature
    raise AssertionError("no feature changes the text")


@pytest.mark.parametrize("model", [TINY, F32])
def test_abort_when_ends_the_row_where_the_feature_fires(clean, model):
    stack = clean
    plain, positions = _plain_reading(stack, model)
    prompt_len = plain["usage"]["prompt_tokens"]
    watched = _busiest(positions, prompt_len - 1)
    # The first position the answer is sampled from at which it fires.
    fires = next(p for p in range(prompt_len - 1, len(positions))
                 if _values(positions[p:p + 1], watched)[0] > 0)
    _profile(stack, "abort", {"abort_when": {"feature": watched, "above": 0, "layer": 1}})
    body = _chat(stack, model, max_tokens=24, profile="abort")
    choice = body["choices"][0]
    assert choice["finish_reason"] == "content_filter"
    # Everything sampled before that position is kept, nothing after.
    kept = fires - (prompt_len - 1)
    assert body["usage"]["completion_tokens"] == kept + 1  # the one it ended before counts
    assert _text(plain).startswith(choice["message"]["content"])
    assert stack.ok("GET", "/api/profiles/abort")["profile"]["entries"] == [
        {"abort_when": {"feature": watched, "above": 0.0, "layer": 1}}]
    # Only a stream condition ends a row.
    reply = stack.api("POST", "/api/profiles", {"name": "bad", "entries": [
        {"abort_when": {"after_text": "sea"}}]})
    assert reply.status_code == 400 and error(reply)["param"] == "entries[0].abort_when"


def test_a_profile_wide_condition_goes_to_each_entry_without_one(clean):
    clean.ok("POST", "/api/profiles", {"name": "wide", "when": {"after_text": "sea"}, "entries": [
        {"layer": 1, "feature": 3, "strength": 2.0},
        {"layer": 1, "feature": 4, "strength": 1.0, "when": {"from_position": 9}},
        {"abort_when": {"feature": 5, "above": 4.0, "layer": 1}}]})
    entries = clean.ok("GET", "/api/profiles/wide")["profile"]["entries"]
    assert [e.get("when") for e in entries] == [{"after_text": "sea"}, {"from_position": 9},
                                                None]
    reply = clean.api("POST", "/api/profiles", {"name": "bad", "when": {"after_text": ""},
                                                "entries": [{"layer": 1, "feature": 3,
                                                             "strength": 2.0}]})
    assert reply.status_code == 400 and error(reply)["param"] == "when.after_text"
    clean.ok("PATCH", "/api/profiles/wide", {"replace_entries": True, "when": {
        "from_position": 2}, "entries": [{"layer": 1, "feature": 6, "strength": 1.0}]})
    assert clean.ok("GET", "/api/profiles/wide")["profile"]["entries"][0]["when"] == {
        "from_position": 2}


def test_modes_conditions_and_abort_over_grpc(clean):
    import grpc

    from millm.v1 import (
        generation_pb2,
        generation_service_pb2,
        generation_service_pb2_grpc,
        steering_pb2,
        steering_service_pb2,
        steering_service_pb2_grpc,
    )

    with grpc.insecure_channel(clean.grpc_target) as channel:
        steering = steering_service_pb2_grpc.SteeringServiceStub(channel)
        generation = generation_service_pb2_grpc.GenerationServiceStub(channel)
        entries = [
            steering_pb2.SteeringEntry(layer=1, feature=3, mode="clamp", value=2.5,
                                       when=steering_pb2.SteeringCondition(after_text="sea")),
            steering_pb2.SteeringEntry(abort_when=steering_pb2.SteeringCondition(
                feature=4, above=-1, layer=1))]
        steering.CreateProfile(steering_service_pb2.CreateProfileRequest(
            name="grpc-modes", entries=entries))
        stored = steering.GetProfile(steering_service_pb2.GetProfileRequest(name="grpc-modes"))
        assert list(stored.profile.entries) == entries[:1] + [steering_pb2.SteeringEntry(
            abort_when=steering_pb2.SteeringCondition(feature=4, above=-1.0, layer=1))]

        def generate(profile: str, **extra):
            return list(generation.Generate(generation_service_pb2.GenerateRequest(
                model=TINY, chat=generation_pb2.ChatInput(messages=[generation_pb2.ChatMessage(
                    role=generation_pb2.ROLE_USER, content=MESSAGES[0]["content"])]),
                sampling=generation_pb2.SamplingParams(temperature=0, max_tokens=12),
                profile=profile, **extra)))

        # Above -1 always holds: the row ends before its first token.
        messages = generate("grpc-modes")
        finishes = [d.finish_reason for m in messages for d in m.choices if d.finish_reason]
        assert finishes == [generation_pb2.FINISH_REASON_CONTENT_FILTER]
        assert "".join(d.text for m in messages for d in m.choices) == ""
        assert messages[-1].usage.completion_tokens == 1
        # steering_compare replays a text condition, and cannot replay a scored one.
        _profile(clean, "after", {"layer": 1, "feature": 3, "strength": 12.0,
                                  "when": {"after_text": "the"}})
        compared = generate("after", steering_compare=True)
        assert any(m.HasField("comparison") for m in compared)
        with pytest.raises(grpc.RpcError) as caught:
            generate("grpc-modes", steering_compare=True)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_an_abort_reads_as_each_api_says_a_filtered_answer(clean):
    _profile(clean, "stop-now", {"abort_when": {"feature": 4, "above": -1, "layer": 1}})
    chat = clean.ok("POST", "/v1/chat/completions", {
        "model": TINY, "messages": MESSAGES, "max_tokens": 8, "profile": "stop-now"})
    assert chat["choices"][0]["finish_reason"] == "content_filter"
    stream = clean.api("POST", "/v1/chat/completions", {
        "model": TINY, "messages": MESSAGES, "max_tokens": 8, "profile": "stop-now",
        "stream": True})
    finishes = [json.loads(line[6:])["choices"][0]["finish_reason"]
                for line in stream.text.splitlines()
                if line.startswith("data: {") and json.loads(line[6:])["choices"]]
    assert finishes[-1] == "content_filter"
    messages = clean.ok("POST", "/v1/messages", {
        "model": TINY, "messages": MESSAGES, "max_tokens": 8, "profile": "stop-now"})
    assert messages["stop_reason"] == "refusal"
    response = clean.ok("POST", "/v1/responses", {
        "model": TINY, "input": MESSAGES[0]["content"], "max_output_tokens": 16,
        "profile": "stop-now"})
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "content_filter"}


@pytest.mark.parametrize("model", [TINY, F32])
def test_a_control_vectors_clamp_and_ablate_set_the_streams_component(clean, model):
    """A vector along feature f's encoder column: projecting it out leaves f's
    pre-activation at its bias, and clamping the component to v puts it at
    v·|e_f| + bias, at every position (what the layer-1 readout shows)."""
    from safetensors.numpy import load_file

    from tests.harness import models_dir
    from tests.test_control_vectors import write_control_vector

    weights = load_file(str(models_dir() / "saes" / "millm-tiny-res-l1" /
                            "sae_weights.safetensors"))
    plain = _readout(clean, model, list(range(256)))
    feature = max(range(256), key=lambda f: sum(_values(plain, f)))
    column = weights["W_enc"][:, feature].astype(np.float64)
    bias = float(weights["b_enc"][feature]) - float(weights["b_dec"] @ column)
    write_control_vector(clean.vectors_dir / "enc.gguf", {1: column.astype(np.float32)})
    try:
        for mode, value, want in (("ablate", None, max(bias, 0.0)),
                                  ("clamp", 0.5, max(0.5 * np.linalg.norm(column) + bias, 0))):
            entry = {"control_vector": "enc", "mode": mode}
            if value is not None:
                entry["value"] = value
            _profile(clean, "enc", entry)
            got = _values(_readout(clean, model, [feature], profile="enc"), feature)
            assert got == pytest.approx([want] * len(got), rel=1e-3, abs=1e-4), mode
    finally:
        (clean.vectors_dir / "enc.gguf").unlink()


def test_a_conditional_plan_never_reuses_an_unsteered_prefix_on_gguf(clean):
    """Slots are keyed by plan: an unsteered prompt's cells serve the next
    unsteered request, never one under a conditional entry (whose own cells
    then serve the next request under the same plan)."""
    def cached(**extra) -> int:
        body = _chat(clean, F32, max_tokens=4, **extra)
        return body["usage"]["prompt_tokens_details"]["cached_tokens"]

    _profile(clean, "later", {"layer": 1, "feature": 3, "strength": 9.0,
                              "when": {"after_text": "zebra crossing"}})
    cached()
    assert cached() > 0
    assert cached(profile="later") == 0
    assert cached(profile="later") > 0
