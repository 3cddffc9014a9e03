"""SAE steering end to end, per request: the SAE registry, the steering math,
per-request profiles and the dial, the live values and the active profile,
refusals, per-request steering in one batch, reading passes (scoring,
embeddings) never steered, and steering following model switches.

Clusters and circuits, the checks on management writes, gRPC and persistence
are test_steering_management.py's; activation readout is
test_steering_readout.py's. These tests change steering state, so they run
against an engine and bridge of their own (conftest.py's `steer`, built by
steering_helpers.py, shared by the three files), never the session stack.
"""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
import torch

from millm.v1 import server_service_pb2_grpc
from tests import harness
from tests.conftest import MODEL
from tests.grpc_helpers import MaxRunningRows
from tests.http_helpers import SseStream
from tests.steering_helpers import (
    L0,
    L1,
    MESSAGES,
    SteerStack,
    chat,
    error,
    feature_that_changes_the_text,
    profile,
)

# -- SAEs ------------------------------------------------------------------------------------------


def test_sae_registry_lists_attaches_and_refuses_what_does_not_fit(clean):
    listed = clean.ok("GET", "/api/saes")
    by_id = {s["id"]: s for s in listed["saes"]}
    assert by_id[L1] | {"attached": True} == {
        "id": L1, "d_in": 64, "d_sae": 256, "architecture": "standard",
        "hook_name": "blocks.1.hook_resid_post", "layer": 1, "model_name": "millm-tiny",
        "attached": True, "layout": "saelens", "transcoder": False}
    assert by_id[L0]["architecture"] == "jumprelu" and by_id[L0]["layer"] == 0
    assert [b["id"] for b in listed["broken"]] == ["sae_broken"]
    assert "d_sae" in listed["broken"][0]["problem"]

    reply = clean.api("POST", "/api/saes/sae_wrong-width/attach")
    assert reply.status_code == 400 and error(reply)["code"] == "sae_mismatch"
    assert "d_in=32" in error(reply)["message"]
    reply = clean.api("POST", "/api/saes/sae_past-last-layer/attach")
    assert reply.status_code == 400 and "layers 0-1" in error(reply)["message"]
    reply = clean.api("POST", "/api/saes/sae_nothing/attach")
    assert reply.status_code == 404 and error(reply)["code"] == "sae_not_found"
    reply = clean.api("POST", "/api/saes/sae_broken/attach")
    assert reply.status_code == 400 and error(reply)["code"] == "invalid_sae"

    # An SAE that would break the default steering is refused: live values
    # written for layer 0 (no SAE there yet) name feature 200, past L0's 128.
    clean.ok("PUT", "/api/steering", {"values": [{"layer": 0, "feature": 200, "strength": 4}]})
    reply = clean.api("POST", f"/api/saes/{L0}/attach")
    assert reply.status_code == 400 and error(reply)["code"] == "sae_mismatch"
    assert "default steering" in error(reply)["message"]
    assert chat(clean)[0]  # plain requests still answer
    clean.ok("DELETE", "/api/steering")

    # Several layers at once.
    attached = clean.ok("POST", f"/api/saes/{L0}/attach")
    assert attached["sae"]["attached"] is True
    state = clean.ok("GET", "/api/steering")["steering"]
    assert state["attached_sae_ids"] == [L0, L1]


# -- steering math ---------------------------------------------------------------------------------


def _direct_logprobs(prompt_ids: list[int], delta: torch.Tensor | None, layer: int):
    """Next-token log-probabilities of millm-tiny with `delta` added to the
    output of decoder layer `layer` at every position, computed here with
    torch, masking what the engine never emits (special tokens but EOS)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = harness.models_dir() / MODEL
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    handle = None
    if delta is not None:
        handle = model.model.layers[layer].register_forward_hook(
            lambda module, args, output: output + delta)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids])).logits[0, -1].float()
    if handle is not None:
        handle.remove()
    eos = model.generation_config.eos_token_id
    eos = set(eos) if isinstance(eos, list) else {eos}
    banned = [i for i in tokenizer.all_special_ids if i not in eos]
    banned += list(range(len(tokenizer), logits.shape[0]))
    logits[banned] = float("-inf")
    return torch.log_softmax(logits, dim=-1), tokenizer


def test_steering_adds_strength_times_decoder_row_at_the_hooked_layer(clean):
    from safetensors.torch import load_file

    strength, feature = 6.0, 3
    profile(clean, "math", (1, feature, strength))
    w_dec = load_file(str(clean.saes_dir / "millm-tiny-res-l1" / "sae_weights.safetensors"))[
        "W_dec"]
    client = clean.client()

    def first_token(**extra):
        reply = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, temperature=0, max_tokens=2, logprobs=True,
            top_logprobs=5, extra_body=extra)
        first = reply.choices[0].logprobs.content[0]
        return first, reply

    steered, _ = first_token(profile="math")
    plain, _ = first_token()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(harness.models_dir() / MODEL)
    prompt_ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True,
                                               tokenize=True, return_dict=False)
    expected, _ = _direct_logprobs(prompt_ids, strength * w_dec[feature], layer=1)
    unsteered, _ = _direct_logprobs(prompt_ids, None, layer=1)

    for got, want in ((steered, expected), (plain, unsteered)):
        top = torch.topk(want, 5)
        assert [t.logprob for t in got.top_logprobs] == pytest.approx(
            top.values.tolist(), abs=1e-4)
        assert [tokenizer.decode([i]) for i in top.indices.tolist()] == [
            t.token for t in got.top_logprobs]
    # The delta moved the distribution measurably.
    finite = torch.isfinite(unsteered)
    assert float((expected - unsteered)[finite].abs().max()) > 0.05


# -- the Bar ---------------------------------------------------------------------------------------


def test_profile_request_differs_leaves_global_state_and_embeddings_unsteered(clean):
    profile(clean, "sea", (1, 3, 8.0), (1, 40, -5.0))
    before = clean.ok("GET", "/api/steering")
    plain, plain_headers = chat(clean)
    steered, headers = chat(clean, profile="sea")
    assert steered != plain
    assert clean.ok("GET", "/api/steering") == before
    assert "x-millm-steering-intensity" not in headers  # no dial sent: nothing to echo

    off, off_headers = chat(clean, profile="sea", steering_intensity="off")
    assert off == plain
    assert off_headers["x-millm-steering-intensity"] == "0.0"  # the dial turned it off
    zero, _ = chat(clean, profile="sea", steering_intensity=0)
    assert zero == plain
    # Off is not validated: even a profile that does not exist turns steering off.
    text, headers = chat(clean, profile="no-such-profile", steering_intensity="off")
    assert text == plain and "x-millm-steering-intensity" not in headers

    scoring = {"model": MODEL, "prompt": "The sea is", "max_tokens": 1, "logprobs": 5}

    async def concurrently():
        client = clean.async_client()
        long = {"model": MODEL, "messages": MESSAGES, "max_tokens": 400, "temperature": 0,
                "extra_body": {"profile": "sea", "ignore_eos": True}}
        steered_alone = (await client.chat.completions.create(**long)).choices[0]
        embed_alone = (await client.embeddings.create(model=MODEL, input="the sea")).data[0]
        score_alone = await client.completions.create(**scoring)
        generation = asyncio.create_task(client.chat.completions.create(**long))
        await asyncio.sleep(0.05)
        embeds, scores = [], []
        for _ in range(5):
            embeds.append((await client.embeddings.create(model=MODEL, input="the sea")).data[0])
            scores.append(await client.completions.create(**scoring))
        running = generation.done()
        steered_together = (await generation).choices[0]
        return (steered_alone, steered_together, running, embed_alone, embeds, score_alone,
                scores)

    (steered_alone, steered_together, finished_early, embed_alone, embeds, score_alone,
     scores) = asyncio.run(concurrently())
    assert not finished_early  # the reads really ran while it generated
    # The generation stayed steered while reading passes ran beside it...
    assert steered_together.message.content == steered_alone.message.content
    # ...and the reading passes were exactly unsteered.
    for embedding in embeds:
        assert embedding.embedding == embed_alone.embedding
    for score in scores:
        assert score.choices[0].logprobs == score_alone.choices[0].logprobs
    plain_score = clean.api("POST", "/v1/completions", scoring)
    clean.ok("POST", f"/api/saes/{L1}/detach")
    assert clean.api("POST", "/v1/completions", scoring).json()["choices"][0]["logprobs"] == (
        plain_score.json()["choices"][0]["logprobs"])


def test_live_values_and_the_active_profile_are_the_default_base(clean):
    plain, _ = chat(clean)
    written = clean.ok("PUT", "/api/steering", {"values": [
        {"layer": 1, "feature": 3, "strength": 8.0}, {"layer": 1, "feature": 40,
                                                       "strength": -5.0}]})
    assert written["liveness"] == {"live": True, "reason": "", "replicas": 1,
                                   "replicas_applied": 1}  # a lone engine
    live_text, _ = chat(clean)
    assert live_text != plain
    profile(clean, "sea", (1, 3, 8.0), (1, 40, -5.0))
    assert chat(clean, profile="sea")[0] == live_text  # the same values, named

    # Disabled: neither live values nor the active profile apply; a named one still does.
    assert clean.ok("PUT", "/api/steering", {"enabled": False})["liveness"]["live"] is False
    assert chat(clean)[0] == plain
    assert chat(clean, steering_intensity=1.0)[1].get("x-millm-steering-intensity") is None
    assert chat(clean, profile="sea")[0] == live_text
    clean.ok("PUT", "/api/steering", {"enabled": True})

    profile(clean, "other", (1, 7, 9.0))
    activated = clean.ok("POST", "/api/profiles/other/activate")
    assert activated["steering"]["active_profile"] == "other"
    assert activated["liveness"]["live"] is True
    other_text, _ = chat(clean)
    assert other_text == chat(clean, profile="other")[0] != live_text
    # Writing live values while a profile is active is stored but not live.
    written = clean.ok("PUT", "/api/steering", {"values": [
        {"layer": 1, "feature": 5, "strength": 1.0}]})
    assert written["liveness"]["live"] is False
    assert "profile 'other' is active" in written["liveness"]["reason"]


def test_no_sae_attached_runs_unsteered(clean):
    plain, _ = chat(clean)
    profile(clean, "sea", (1, 3, 8.0))
    clean.ok("POST", f"/api/saes/{L1}/detach")
    text, headers = chat(clean, profile="sea", steering_intensity=1.5)
    assert text == plain
    assert "x-millm-steering-intensity" not in headers
    reply = clean.api("POST", "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES,
                                                       "profile": "missing"})
    assert reply.status_code == 404 and error(reply)["code"] == "profile_not_found"


# -- refusals --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("extra", "status", "code", "param"), [
    ({"profile": "missing"}, 404, "profile_not_found", "profile"),
    ({"steering_intensity": 2.5}, 400, "invalid_parameter", "steering_intensity"),
    ({"steering_intensity": -0.1}, 400, "invalid_parameter", "steering_intensity"),
    ({"steering_intensity": "medium"}, 400, "invalid_parameter", "steering_intensity"),
    ({"steering_intensity": True}, 400, "invalid_type", "steering_intensity"),
    ({"profile": "wide"}, 400, "invalid_feature_index", "profile"),
    ({"profile": "sea", "max_tokens": 1, "logprobs": True}, 400, "invalid_scoring_request",
     "profile"),
])
def test_chat_steering_refusals(clean, extra, status, code, param):
    profile(clean, "sea", (1, 3, 8.0))
    # Valid when written on layer 0 (no SAE there), then the layer-0 SAE is attached:
    # feature 200 is past its 128 features.
    profile(clean, "wide", (0, 200, 1.0))
    clean.ok("POST", f"/api/saes/{L0}/attach")
    reply = clean.api("POST", "/v1/chat/completions",
                      {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, **extra})
    assert reply.status_code == status, reply.text
    assert error(reply)["code"] == code and error(reply)["param"] == param


def test_steering_fields_on_completions_are_not_honoured(clean):
    profile(clean, "sea", (1, 3, 8.0))
    for extra in ({"profile": "sea"}, {"steering_intensity": 1.0}):
        reply = clean.api("POST", "/v1/completions", {"model": MODEL, "prompt": "The sea",
                                                      "max_tokens": 4, **extra})
        assert reply.status_code == 400
        assert error(reply)["code"] == "field_not_honoured"
        assert error(reply)["param"] == next(iter(extra))



# -- batch safety ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", [
    # Greedy and unseeded: these rows share the batch's lane and its forward passes.
    {"temperature": 0},
    # Seeded, as a user comparing runs would send them (seeded groups get lanes of their own).
    {"temperature": 1.0, "seed": 11},
], ids=["greedy-shared-lane", "seeded"])
def test_concurrent_requests_with_different_profiles_each_get_their_own(clean, sampling):
    # Three different texts, so that a row steered by another's profile shows
    # (the features are asked of the model: which ones change its text is a
    # property of the build).
    a = feature_that_changes_the_text(clean.http_port, 8.0)
    profile(clean, "a", (1, a, 8.0))
    profile(clean, "b", (1, feature_that_changes_the_text(clean.http_port, 8.0, unlike=(a,)), 8.0))

    async def one(client, name):
        extra = {"profile": name} if name else {}
        reply = await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=40, extra_body=extra, **sampling)
        return reply.choices[0].message.content

    async def run():
        client = clean.async_client()
        alone = {name: await one(client, name) for name in ("a", "b", None)}
        together = await asyncio.gather(*(one(client, name) for name in ("a", "b", None) * 3))
        return alone, together

    with grpc.insecure_channel(f"127.0.0.1:{clean.grpc_port}") as channel:
        with MaxRunningRows(server_service_pb2_grpc.ServerServiceStub(channel)) as rows:
            alone, together = asyncio.run(run())
    assert rows.value >= 3, "the requests did not share the batch"
    assert len(set(alone.values())) == 3
    assert together == [alone[name] for name in ("a", "b", None) * 3]


def test_an_operator_change_during_a_request_is_never_undone(clean):
    profile(clean, "a", (1, 3, 8.0))
    body = {"model": MODEL, "messages": MESSAGES, "temperature": 0, "max_tokens": 300,
            "ignore_eos": True, "stream": True, "profile": "a"}
    operator_values = [{"layer": 1, "feature": 12, "strength": 3.5, "sae_id": ""}]
    texts = []
    seen_text = False
    with SseStream(clean.base_url, "/v1/chat/completions", body) as stream:
        for line in stream.lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: "):])
            texts.extend(c["delta"].get("content", "") for c in chunk["choices"])
            if not seen_text and "".join(texts):
                seen_text = True
                # Mid-stream, the operator changes the live values.
                written = clean.ok("PUT", "/api/steering", {"values": operator_values})
                assert written["liveness"]["live"] is True
    assert seen_text
    assert clean.ok("GET", "/api/steering")["steering"]["values"] == operator_values
    # And the request's own steering was not disturbed by the change.
    alone = clean.client().chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=300,
        extra_body={"ignore_eos": True, "profile": "a"}).choices[0].message.content
    assert "".join(texts) == alone


# -- never steered: scoring and embeddings ---------------------------------------------------------


def test_scoring_is_unsteered_while_a_profile_is_active(clean):
    body = {"model": MODEL, "prompt": "The sea is", "max_tokens": 1, "logprobs": 5}
    before = clean.api("POST", "/v1/completions", body)
    profile(clean, "strong", (1, 3, 30.0))
    clean.ok("POST", "/api/profiles/strong/activate")
    assert chat(clean)[0] != chat(clean, steering_intensity="off")[0]
    after = clean.api("POST", "/v1/completions", body)
    assert after.headers["x-millm-steering"] == "none"
    assert after.json()["choices"][0]["logprobs"] == before.json()["choices"][0]["logprobs"]
    chat_scoring = {"model": MODEL, "messages": MESSAGES, "max_tokens": 1, "logprobs": True,
                    "top_logprobs": 3}
    scored = clean.api("POST", "/v1/chat/completions", chat_scoring)
    clean.ok("DELETE", "/api/profiles/active")
    assert scored.json()["choices"][0]["logprobs"] == clean.api(
        "POST", "/v1/chat/completions", chat_scoring).json()["choices"][0]["logprobs"]


# -- model switches --------------------------------------------------------------------------------


def test_steering_follows_model_switches_onto_the_gguf_export(tmp_path):
    own = SteerStack(tmp_path, harness.models_dir() / "saes")
    try:
        own.ok("POST", f"/api/saes/{L1}/attach")
        profile(own, "sea", (1, 3, 8.0))
        before, _ = chat(own, profile="sea")

        # The GGUF export steers too (engines/gguf/steering.py): the SAE
        # attached before the switch is attached to it, and the same profile
        # gives the same greedy text on its F32 file.
        gguf = "millm-tiny-gguf:F32"
        reply = own.api("POST", "/v1/chat/completions", {
            "model": gguf, "messages": MESSAGES, "max_tokens": 24, "temperature": 0,
            "seed": 7, "profile": "sea"})
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == before
        assert own.ok("GET", "/api/steering")["steering"]["attached_sae_ids"] == [L1]

        # Naming millm-tiny switches back, and the SAE stays attached.
        after, _ = chat(own, profile="sea")
        assert after == before
        assert own.ok("GET", "/api/steering")["steering"]["attached_sae_ids"] == [L1]
    finally:
        own.stop()
