"""SAE steering end to end: SAEs, profiles, the dial, per-request steering in
one batch, unsteered reading passes, headers and the management API.

These tests change steering state, so they run against an engine and bridge
of their own (a fresh data dir and SAE dir), never the shared session stack.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import shutil

import grpc
import openai
import pytest
import torch

from millm.v1 import (
    generation_service_pb2_grpc,
    server_service_pb2_grpc,
    steering_pb2,
    steering_service_pb2,
)
from millm.v1 import steering_service_pb2_grpc as steering_grpc
from tests import harness
from tests.conftest import MODEL
from tests.grpc_helpers import chat_request, error_info
from tests.http_helpers import Reply, SseStream, call
from tests.test_batching import MaxRunningRows

L1 = "sae_millm-tiny-res-l1"  # standard, layer 1, 256 features
L0 = "sae_millm-tiny-res-l0"  # jumprelu, layer 0, 128 features
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


class SteerStack(harness.OwnStack):
    """An engine and bridge of the steering tests' own, on an SAE dir of theirs."""

    def __init__(self, tmp: pathlib.Path, saes_dir: pathlib.Path):
        super().__init__(tmp, MILLM_SAES_DIR=str(saes_dir))
        self.saes_dir = saes_dir

    def api(self, method: str, path: str, body=None, raw: bytes | None = None) -> Reply:
        return call(self.http_port, method, path, body, raw)

    def ok(self, method: str, path: str, body=None) -> dict:
        reply = self.api(method, path, body)
        assert reply.status_code == 200, reply.text
        return reply.json()

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0,
                             timeout=60)

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key="unused",
                                  max_retries=0, timeout=60)


def _write_sae(directory: pathlib.Path, d_in: int, layer: int, d_sae: int = 16) -> None:
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    (directory / "cfg.json").write_text(json.dumps({
        "architecture": "standard", "d_in": d_in, "d_sae": d_sae,
        "hook_name": f"blocks.{layer}.hook_resid_post"}))
    save_file({"W_enc": torch.zeros(d_in, d_sae), "W_dec": torch.zeros(d_sae, d_in),
               "b_enc": torch.zeros(d_sae), "b_dec": torch.zeros(d_in)},
              str(directory / "sae_weights.safetensors"))


def _start(tmp: pathlib.Path, saes_dir: pathlib.Path) -> tuple[harness.Process, int]:
    engine, port = harness.start_engine(tmp, MILLM_SAES_DIR=str(saes_dir))
    harness.wait_serving(engine, port)
    return engine, port


@pytest.fixture(scope="module")
def steer(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("steer")
    saes_dir = tmp / "saes"
    shutil.copytree(harness.models_dir() / "saes", saes_dir)
    _write_sae(saes_dir / "wrong-width", d_in=32, layer=1)
    _write_sae(saes_dir / "past-last-layer", d_in=64, layer=5)
    (saes_dir / "broken").mkdir()
    (saes_dir / "broken" / "cfg.json").write_text('{"d_in": 64}')
    stack = SteerStack(tmp, saes_dir)
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def clean(steer):
    """Each test starts from no steering at all, with the layer-1 SAE attached."""
    def reset():
        steer.ok("DELETE", "/api/steering")
        steer.ok("PUT", "/api/steering", {"enabled": True})
        steer.ok("DELETE", "/api/profiles/active")
        for circuit in steer.ok("GET", "/api/circuits")["circuits"]:
            steer.ok("DELETE", f"/api/circuits/{circuit['name']}")
        for cluster in steer.ok("GET", "/api/clusters")["clusters"]:
            steer.ok("DELETE", f"/api/clusters/{cluster['name']}")
        for profile in steer.ok("GET", "/api/profiles")["profiles"]:
            steer.ok("DELETE", f"/api/profiles/{profile['name']}")
        for sae in steer.ok("GET", "/api/saes")["saes"]:
            if sae["attached"] and sae["id"] != L1:
                steer.ok("POST", f"/api/saes/{sae['id']}/detach")
        steer.ok("POST", f"/api/saes/{L1}/attach")

    reset()
    yield steer
    reset()


def chat(stack: SteerStack, **extra):
    """A greedy chat completion; returns (text, headers)."""
    body = {"temperature": 0, "max_tokens": 24, "seed": 7, **extra}
    raw = stack.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, **{k: body.pop(k) for k in ("temperature", "max_tokens",
                                                                   "seed")}, extra_body=body)
    return raw.parse().choices[0].message.content, raw.headers


def profile(stack: SteerStack, name: str, *entries: tuple[int, int, float]) -> None:
    stack.ok("POST", "/api/profiles", {"name": name, "entries": [
        {"layer": layer, "feature": feature, "strength": strength}
        for layer, feature, strength in entries]})


def error(reply: Reply) -> dict:
    return reply.json()["error"]


# -- SAEs ------------------------------------------------------------------------------------------


def test_sae_registry_lists_attaches_and_refuses_what_does_not_fit(clean):
    listed = clean.ok("GET", "/api/saes")
    by_id = {s["id"]: s for s in listed["saes"]}
    assert by_id[L1] | {"attached": True} == {
        "id": L1, "d_in": 64, "d_sae": 256, "architecture": "standard",
        "hook_name": "blocks.1.hook_resid_post", "layer": 1, "model_name": "millm-tiny",
        "attached": True}
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


def test_management_writes_are_checked(clean):
    reply = clean.api("POST", "/api/profiles", {"name": "x", "entries": [
        {"layer": 1, "feature": 999, "strength": 1.0}]})
    assert reply.status_code == 400 and error(reply)["code"] == "invalid_feature_index"
    reply = clean.api("POST", "/api/profiles", {"name": "x", "entries": [
        {"layer": 1, "feature": 1, "strength": 250.0}]})
    assert reply.status_code == 400 and error(reply)["param"] == "entries[0].strength"
    reply = clean.api("POST", "/api/profiles", {"name": "bad name!", "entries": []})
    assert reply.status_code == 400 and error(reply)["param"] == "name"
    profile(clean, "twice")
    reply = clean.api("POST", "/api/profiles", {"name": "twice", "entries": []})
    assert reply.status_code == 409 and error(reply)["code"] == "already_exists"
    reply = clean.api("PUT", "/api/steering", {"values": [{"layer": 1, "feature": 2}]})
    assert reply.status_code == 400 and error(reply)["param"] == "values[0].strength"
    reply = clean.api("GET", "/api/profiles/nothing")
    assert reply.status_code == 404 and error(reply)["code"] == "profile_not_found"
    reply = clean.api("POST", "/api/clusters", raw=b"[1, 2]")
    assert reply.status_code == 400
    reply = clean.api("POST", "/api/clusters", {"name": "c", "members": [], "colour": "red"})
    assert reply.status_code == 400 and error(reply)["param"] == "colour"
    updated = clean.ok("PATCH", "/api/profiles/twice", {"entries": [
        {"layer": 1, "feature": 4, "strength": 2.0}], "description": "now with a feature"})
    assert updated["profile"]["entries"] == [{"layer": 1, "feature": 4, "strength": 2.0,
                                              "sae_id": ""}]
    assert updated["liveness"] == {"live": False, "reason": "profile 'twice' is not active",
                                   "replicas": 1, "replicas_applied": 1}


# -- batch safety ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", [
    # Greedy and unseeded: these rows share the batch's lane and its forward passes.
    {"temperature": 0},
    # Seeded, as a user comparing runs would send them (seeded groups get lanes of their own).
    {"temperature": 1.0, "seed": 11},
], ids=["greedy-shared-lane", "seeded"])
def test_concurrent_requests_with_different_profiles_each_get_their_own(clean, sampling):
    profile(clean, "a", (1, 3, 8.0))
    profile(clean, "b", (1, 40, 8.0), (1, 9, -6.0))

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


# -- clusters, circuits and headers ----------------------------------------------------------------


def test_cluster_dial_scales_stored_strengths(clean):
    cluster = {"format": "millm.cluster.v1", "name": "calm", "intensity_range": [0.5, 1.5],
               "intensity": 1.0, "members": [{"layer": 1, "feature": 3, "strength": 8.0}]}
    imported = clean.ok("POST", "/api/clusters", cluster)
    assert imported["cluster"]["intensity"] == 1.0
    assert imported["liveness"]["live"] is False
    assert clean.ok("GET", "/api/profiles/calm")["profile"]["kind"] == "cluster"
    profile(clean, "half", (1, 3, 4.0))
    half, _ = chat(clean, profile="half")

    text, headers = chat(clean, profile="calm", steering_intensity=0.5)
    assert text == half and headers["x-millm-steering-intensity"] == "0.5"
    # Dialing below the declared floor is honoured; above the ceiling is capped.
    assert chat(clean, profile="calm", steering_intensity=0.25)[1][
        "x-millm-steering-intensity"] == "0.25"
    assert chat(clean, profile="calm", steering_intensity=2)[1][
        "x-millm-steering-intensity"] == "1.5"
    assert chat(clean, profile="calm", steering_intensity="min")[1][
        "x-millm-steering-intensity"] == "0.5"

    # The persistent dial applies without a request dial.
    reply = clean.api("PUT", "/api/clusters/calm/intensity", {"intensity": 1.6})
    assert reply.status_code == 400 and error(reply)["param"] == "intensity"
    set_dial = clean.ok("PUT", "/api/clusters/calm/intensity", {"intensity": 0.5})
    assert set_dial["cluster"]["intensity"] == 0.5
    assert chat(clean, profile="calm")[0] == half
    clean.ok("POST", "/api/profiles/calm/activate")
    assert clean.ok("PUT", "/api/clusters/calm/intensity", {"intensity": 0.5})["liveness"][
        "live"] is True
    assert chat(clean)[0] == half


def _circuit(name: str, rung: int, **extra) -> dict:
    return {"format": "millm.circuit.v1", "name": name, "rung": rung, "members": [
        {"layer": 0, "feature": 5, "strength": 6.0}, {"layer": 1, "feature": 3, "strength": 8.0}],
        **extra}


def test_circuit_rung_header_only_while_a_circuit_genuinely_steers(clean):
    clean.ok("POST", f"/api/saes/{L0}/attach")
    clean.ok("POST", "/api/circuits", _circuit("edge", 2, intensity_range=[0.5, 1.5]))
    none = clean.ok("GET", "/api/circuits/active")
    assert none["circuit"] is None and none["steering"]["steering"] is False

    plain, headers = chat(clean)
    assert "x-millm-circuit-rung" not in headers
    clean.ok("POST", "/api/circuits/edge/activate")
    active = clean.ok("GET", "/api/circuits/active")
    assert active["circuit"]["name"] == "edge"
    assert active["steering"] == {"steering": True, "rung": 2,
                                  "language": "causally validated (edge)", "intensity": 1.0,
                                  "reason": ""}
    text, headers = chat(clean)
    assert text != plain
    assert headers["x-millm-circuit-rung"] == '2; language="causally validated (edge)"'
    # Clamped at both ends: 0.1 against [0.5, 1.5] is 0.5.
    assert chat(clean, steering_intensity=0.1)[1]["x-millm-steering-intensity"] == "0.5"
    assert chat(clean, steering_intensity="off")[0] == plain

    # The same circuit at 0.5 equals its members at half strength on both layers.
    profile(clean, "halves", (0, 5, 3.0), (1, 3, 4.0))
    assert chat(clean, steering_intensity=0.5)[0] == chat(clean, profile="halves")[0]

    # No SAE on any member layer: no header, and the state says why.
    clean.ok("POST", f"/api/saes/{L0}/detach")
    clean.ok("POST", f"/api/saes/{L1}/detach")
    assert "x-millm-circuit-rung" not in chat(clean)[1]
    state = clean.ok("GET", "/api/circuits/active")["steering"]
    assert state["steering"] is False and "no SAE" in state["reason"]


def test_rung_language_never_says_causal_below_rung_two(clean):
    clean.ok("POST", "/api/circuits", _circuit("hint", 1))
    clean.ok("POST", "/api/circuits/hint/activate")
    header = chat(clean)[1]["x-millm-circuit-rung"]
    assert header == '1; language="suggested (attribution-supported)"'
    assert "causal" not in header
    # "min" on a circuit without a declared range is off, and says so.
    plain = chat(clean, steering_intensity="off")[0]
    text, headers = chat(clean, steering_intensity="min")
    assert text == plain and "x-millm-circuit-rung" not in headers
    assert headers["x-millm-steering-intensity"] == "0.0"
    # Only circuits are activated as circuits, and deactivating one leaves a profile alone.
    profile(clean, "plain", (1, 3, 2.0))
    reply = clean.api("POST", "/api/circuits/plain/activate")
    assert reply.status_code == 404 and error(reply)["code"] == "circuit_not_found"
    clean.ok("POST", "/api/profiles/plain/activate")
    assert clean.ok("DELETE", "/api/circuits/active")["steering"]["active_profile"] == "plain"


def test_slice_fallback_circuit_is_served_by_its_cluster_without_a_rung(clean):
    clean.ok("POST", "/api/clusters", {"name": "backing", "members": [
        {"layer": 1, "feature": 3, "strength": 8.0}]})
    reply = clean.api("POST", "/api/circuits", _circuit("fb", 3, mode="slice_fallback",
                                                        fallback_cluster="nothing"))
    assert reply.status_code == 400 and error(reply)["param"] == "fallback_cluster"
    clean.ok("POST", "/api/circuits", _circuit("fb", 3, mode="slice_fallback",
                                               fallback_cluster="backing"))
    clean.ok("POST", "/api/circuits/fb/activate")
    text, headers = chat(clean)
    assert "x-millm-circuit-rung" not in headers
    assert text == chat(clean, profile="backing")[0]
    state = clean.ok("GET", "/api/circuits/active")["steering"]
    assert state["steering"] is False and "slice_fallback" in state["reason"]
    # Its own dial does not steer it; its cluster's does.
    dial = clean.ok("PUT", "/api/circuits/fb/intensity", {"intensity": 0.0})
    assert dial["liveness"]["live"] is False and "backing" in dial["liveness"]["reason"]
    assert chat(clean)[0] == text
    # The cluster rule's 0.5 floor for "min" applies.
    assert chat(clean, steering_intensity="min")[1]["x-millm-steering-intensity"] == "0.5"


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


def test_pre_steering_removes_only_this_layers_delta(clean):
    strength = 5.0
    profile(clean, "one", (1, 3, strength))
    spec = {"features": [3], "top_k": 1}
    post = _read(clean, "all", profile="one", spec=spec).json()["millm"]["sae_activations"]
    pre = _read(clean, "all", profile="one",
                spec={**spec, "read_point": "pre_steering"}).json()["millm"]["sae_activations"]
    assert pre["read_point"] == "pre_steering"
    pairs = [(a["features"][0]["value"], b["features"][0]["value"])
             for a, b in zip(pre["positions"], post["positions"], strict=True)]
    # Tied unit-norm decoder and encoder: the delta raises feature 3's
    # pre-activation by exactly the strength.
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


# -- gRPC ------------------------------------------------------------------------------------------


def test_grpc_carries_the_same_steering_as_rest(clean):
    clean.ok("POST", f"/api/saes/{L0}/attach")
    clean.ok("POST", "/api/circuits", _circuit("edge", 2))
    clean.ok("POST", "/api/circuits/edge/activate")
    with grpc.insecure_channel(f"127.0.0.1:{clean.grpc_port}") as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        request = chat_request(MESSAGES[0]["content"], temperature=0, max_tokens=24)
        request.steering_intensity.symbol = "max"
        request.return_sae_activations.sae_id = L0
        request.return_sae_activations.selector = steering_pb2.POSITION_SELECTOR_LAST
        responses = list(stub.Generate(request))
        meta = responses[0].metadata
        assert meta.steering_intensity == 2.0
        assert (meta.circuit_rung.rung, meta.circuit_rung.language) == (
            2, "causally validated (edge)")
        assert responses[-1].HasField("sae_activations")
        assert responses[-1].sae_activations.layer == 0
        text = "".join(c.text for r in responses for c in r.choices)
        assert text == chat(clean, steering_intensity="max")[0]

        request = chat_request("hi", max_tokens=2)
        request.steering_intensity.symbol = "loud"
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.Generate(request))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(caught.value).reason == "invalid_parameter"

        steering = steering_grpc.SteeringServiceStub(channel)
        state = steering.GetSteering(steering_service_pb2.GetSteeringRequest())
        assert state.steering.active_profile == "edge"
        with pytest.raises(grpc.RpcError) as caught:
            steering.GetProfile(steering_service_pb2.GetProfileRequest(name="nope"))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert error_info(caught.value).reason == "profile_not_found"


# -- persistence -----------------------------------------------------------------------------------


def test_state_survives_an_engine_restart(tmp_path, steer):
    saes_dir = steer.saes_dir
    engine, port = _start(tmp_path, saes_dir)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = steering_grpc.SteeringServiceStub(channel)
            stub.AttachSae(steering_service_pb2.AttachSaeRequest(sae_id=L0))
            stub.CreateProfile(steering_service_pb2.CreateProfileRequest(
                name="kept", entries=[steering_pb2.SteeringEntry(layer=0, feature=1,
                                                                 strength=2.5)]))
            stub.ImportCluster(steering_service_pb2.ImportClusterRequest(document_json=json.dumps(
                {"name": "dialed", "members": [{"layer": 0, "feature": 2, "strength": 1.0}]})))
            stub.SetClusterIntensity(steering_service_pb2.SetClusterIntensityRequest(
                name="dialed", intensity=1.75))
            stub.ImportCircuit(steering_service_pb2.ImportCircuitRequest(
                document_json=json.dumps(_circuit("c", 3))))
            stub.ActivateProfile(steering_service_pb2.ActivateProfileRequest(name="kept"))
            stub.SetSteering(steering_service_pb2.SetSteeringRequest(
                replace_values=True, enabled=False,
                values=[steering_pb2.SteeringEntry(layer=0, feature=9, strength=-1.0)]))
            before = stub.GetSteering(steering_service_pb2.GetSteeringRequest())
    finally:
        engine.stop()
    engine, port = _start(tmp_path, saes_dir)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = steering_grpc.SteeringServiceStub(channel)
            after = stub.GetSteering(steering_service_pb2.GetSteeringRequest())
            assert after == before
            assert list(after.steering.attached_sae_ids) == [L0]
            assert after.steering.enabled is False
            kept = stub.GetProfile(steering_service_pb2.GetProfileRequest(name="kept")).profile
            assert (kept.active, kept.entries[0].strength) == (True, 2.5)
            dialed = stub.GetCluster(steering_service_pb2.GetClusterRequest(name="dialed"))
            assert dialed.cluster.intensity == 1.75
            circuit = stub.GetCircuit(steering_service_pb2.GetCircuitRequest(name="c")).circuit
            assert circuit.rung == 3 and len(circuit.members) == 2
    finally:
        engine.stop()


def test_capabilities_report_steering_and_the_attached_saes(clean):
    body = clean.ok("GET", "/api/capabilities")
    assert body["features"]["steering"] is True
    assert body["features"]["attached_saes"] == [L1]
    table = {(f["field"], f["route"]): f for f in body["fields"]}
    assert table[("profile", "chat")]["honoured"] is True
    assert table[("profile", "completions")]["honoured"] is False
    assert table[("return_sae_activations", "completions")]["honoured"] is True


def test_management_api_never_answers_5xx_and_bad_writes_change_nothing(clean):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 300),
                        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6))
    values = st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
        max_leaves=10)
    member = st.fixed_dictionaries({}, optional={
        "layer": values | st.integers(0, 2), "feature": values | st.integers(0, 300),
        "strength": values | st.floats(-300, 300), "sae_id": values})
    document = st.fixed_dictionaries({}, optional={
        "name": values | st.sampled_from(["ok", "bad name", ""]),
        "members": values | st.lists(member, max_size=3), "rung": values | st.integers(-1, 4),
        "intensity_range": values | st.lists(st.floats(-1, 3), max_size=3),
        "intensity": values | st.floats(-1, 3), "mode": values | st.sampled_from(
            ["full", "slice_fallback"]), "fallback_cluster": values, "values": values,
        "entries": values | st.lists(member, max_size=3), "enabled": values})
    routes = st.sampled_from([("POST", "/api/clusters"), ("POST", "/api/circuits"),
                              ("POST", "/api/profiles"), ("PUT", "/api/steering"),
                              ("PUT", "/api/clusters/ok/intensity"),
                              ("PATCH", "/api/profiles/ok")])

    @settings(max_examples=150, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(routes, document)
    def fuzz(route, body):
        before = [clean.ok("GET", p) for p in ("/api/steering", "/api/profiles",
                                               "/api/clusters", "/api/circuits")]
        reply = clean.api(*route, body)
        assert reply.status_code < 500, reply.text
        if reply.status_code >= 400:
            assert set(error(reply)) == {"message", "type", "param", "code"}
            after = [clean.ok("GET", p) for p in ("/api/steering", "/api/profiles",
                                                  "/api/clusters", "/api/circuits")]
            assert after == before
        else:  # an accepted write is undone so the next example starts clean
            for name in ("ok",):
                for kind in ("circuits", "clusters", "profiles"):
                    clean.api("DELETE", f"/api/{kind}/{name}")
            clean.ok("DELETE", "/api/steering")
            clean.ok("PUT", "/api/steering", {"enabled": True})

    fuzz()


def test_steering_follows_model_switches_and_is_refused_on_gguf(tmp_path):
    own = SteerStack(tmp_path, harness.models_dir() / "saes")
    try:
        own.ok("POST", f"/api/saes/{L1}/attach")
        profile(own, "sea", (1, 3, 8.0))
        before, _ = chat(own, profile="sea")

        gguf = "millm-tiny-gguf:F32"
        reply = own.api("POST", "/v1/chat/completions", {
            "model": gguf, "messages": MESSAGES, "max_tokens": 4, "profile": "sea"})
        assert reply.status_code == 400 and error(reply)["code"] == "field_not_honoured"
        assert error(reply)["param"] == "profile"
        reply = own.api("POST", "/v1/chat/completions", {
            "model": gguf, "messages": MESSAGES, "max_tokens": 4})
        assert reply.status_code == 200, reply.text  # the engine switched to the GGUF export
        assert own.ok("GET", "/api/steering")["steering"]["attached_sae_ids"] == []
        reply = own.api("POST", f"/api/saes/{L1}/attach")
        assert reply.status_code == 400 and error(reply)["code"] == "steering_unavailable"

        # Naming millm-tiny switches back, and the SAE attached before comes back with it.
        after, _ = chat(own, profile="sea")
        assert after == before
        assert own.ok("GET", "/api/steering")["steering"]["attached_sae_ids"] == [L1]
    finally:
        own.stop()
