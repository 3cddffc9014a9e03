"""Conditional steering entries and abort_when end to end (issue 44 item 2),
on the real stack and both engines: an entry after a trigger text leaves the
answer identical up to it and different after it; feature and probe
conditions read the previous position (above -1 holds from the first
generated position, exactly as from_position does; a probe on one feature
fires where that feature's condition holds); abort_when ends a row where its
condition holds, reported as each API reports a filtered answer; a profile's
condition goes to its entries; a conditional plan never reuses an unsteered
GGUF prefix. The rules themselves (parsing, plan keys, the state machine) are
test_steering_modes.py's.
"""

from __future__ import annotations

import json

import pytest

from tests.steering_helpers import L1, MESSAGES, error
from tests.test_steering_modes import F32, TINY, _chat, _profile, _text, _values


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


def _watching(stack, model: str):
    """The unsteered reply, its readout by position, its prompt length, and
    the feature to condition on (the busiest from the last prompt position)."""
    plain, positions = _plain_reading(stack, model)
    prompt_len = plain["usage"]["prompt_tokens"]
    return plain, positions, prompt_len, _busiest(positions, prompt_len - 1)


@pytest.mark.parametrize("model", [TINY, F32])
def test_feature_and_probe_conditions_read_the_previous_position(clean, model):
    stack = clean
    plain, positions, prompt_len, watched = _watching(stack, model)
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
    plain, positions, prompt_len, watched = _watching(stack, model)
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
