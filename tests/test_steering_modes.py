"""Steering modes and the rules of conditions (issue 44 items 1, 2 and 4).

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
zero, and a control vector's clamp and ablate land where its direction says.
Conditions end to end are test_steering_conditions.py's.
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
