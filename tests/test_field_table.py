"""Unit tests of the field table (service/requests/fields.py): what a loaded
model that cannot do what its engine kind can does with the fields that need
it, and the order refusals are named in."""

from __future__ import annotations

import dataclasses

import pytest

from service.engines.capabilities import KIND_CAPABILITIES
from service.errors import EngineError
from service.models.registry import GGUF, TRANSFORMERS
from service.requests import fields

KIND = KIND_CAPABILITIES[TRANSFORMERS]
# A transformers model whose layers the steering hooks cannot reach.
UNHOOKED = dataclasses.replace(KIND, steer=False)


@pytest.mark.parametrize(("name", "value", "route"), [
    ("profile", "calm", fields.CHAT),
    ("steering_intensity", 1.0, fields.CHAT),
    ("return_sae_activations", {"sae_id": "x"}, fields.COMPLETIONS),
])
def test_steering_fields_on_an_unhookable_model_are_steering_unavailable(name, value, route):
    assert fields.check({name: value}, route, KIND) == []  # the kind steers
    with pytest.raises(EngineError) as caught:
        fields.check({name: value}, route, KIND, UNHOOKED)
    assert (caught.value.code, caught.value.param) == ("steering_unavailable", name)
    # ... and the capability table says so, for the same cell.
    cells = {(f, r): c for f, r, c in fields.support_table(KIND, UNHOOKED)}
    assert cells[(name, route)].treatment is fields.Treatment.REFUSED
    assert cells[(name, route)].code == "steering_unavailable"


def test_steering_fields_on_gguf_are_honoured_like_on_transformers():
    for name, value, route in (("profile", "calm", fields.CHAT),
                               ("steering_intensity", 1.0, fields.CHAT),
                               ("return_sae_activations", {}, fields.COMPLETIONS)):
        assert fields.check({name: value}, route, KIND_CAPABILITIES[GGUF]) == []


def test_several_refused_fields_name_the_first_in_table_order():
    refused = {"best_of": 2, "functions": [{}], "suffix": "x", "dimensions": 8}
    for order in (list(refused), list(reversed(refused)), sorted(refused)):
        with pytest.raises(EngineError) as caught:
            fields.check({k: refused[k] for k in order}, fields.CHAT, KIND)
        assert caught.value.param == "dimensions"


def test_reported_and_unknown_fields_come_back_in_a_fixed_order():
    sent = {"zeta": 1, "seed": 3, "alpha": None, "n": 2}
    assert fields.check(sent, fields.EMBEDDINGS, KIND) == ["n", "seed", "alpha", "zeta"]


def test_a_field_the_route_honours_but_the_caller_could_not_map_is_refused():
    """/v1/responses has no `n`: sent there it arrives as an extra field, and
    the chat route's honoured `n` must not swallow it."""
    assert fields.check({"n": 2}, fields.CHAT, KIND) == []  # mapped: honoured
    with pytest.raises(EngineError) as caught:
        fields.check({"n": 2}, fields.CHAT, KIND, unmapped={"n"})
    assert (caught.value.code, caught.value.param) == ("field_not_honoured", "n")
    assert fields.check({"n": 1}, fields.CHAT, KIND, unmapped={"n"}) == []  # no change


@pytest.mark.parametrize(("name", "value"), [
    ("background", True), ("truncation", "auto"), ("conversation", "conv_1"),
    ("max_tool_calls", 3), ("include", ["message.output_text.logprobs"])])
def test_responses_fields_that_would_change_the_output_are_refused(name, value):
    with pytest.raises(EngineError) as caught:
        fields.check({name: value}, fields.CHAT, KIND)
    assert (caught.value.code, caught.value.param) == ("field_not_honoured", name)


def test_responses_fields_that_ask_for_nothing_pass():
    sent = {"background": False, "truncation": "disabled",
            "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "low"}}
    assert fields.check(sent, fields.CHAT, KIND) == ["reasoning"]
