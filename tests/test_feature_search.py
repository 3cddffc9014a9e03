"""Feature search (issue 43): by words in a feature's record, by example on
both engines, by decoder direction; over REST and gRPC; its refusals.

The scores are checked against what they are defined from, not against one
trained SAE: the record's own words, the readout a completion returns for
the same text, and the decoder rows read from the SAE's file. Runs on the
steering tests' own stack (conftest.py's `steer`): it attaches SAEs.
"""

from __future__ import annotations

import json
import re

import grpc
import pytest
import torch
from safetensors.torch import load_file

from millm.v1 import steering_service_pb2, steering_service_pb2_grpc
from tests import harness
from tests.steering_helpers import L0, L1, SteerStack, error, reset

TINY, F32 = "millm-tiny", "millm-tiny-gguf:F32"
SENTENCE = "The sea is calm and the boats rest in the harbour."


@pytest.fixture
def clean(steer: SteerStack) -> SteerStack:
    reset(steer)
    return steer


def search(stack: SteerStack, sae_id: str, **body) -> dict:
    return stack.ok("POST", f"/api/saes/{sae_id}/search", body)


def record(sae_id: str) -> dict:
    name = sae_id.removeprefix("sae_")
    return json.loads((harness.models_dir() / "saes" / name / "features.json").read_text())


def holds(feature: dict, word: str) -> bool:
    tokens = {str(t["token"]).strip().lower() for t in feature["top_tokens"]}
    contexts = " ".join(f"{e['left']}{e['token']}{e['right']}" for e in feature["examples"])
    return word in tokens or word in re.findall(r"\w+", contexts.lower())


def test_text_search_finds_the_features_whose_record_holds_the_word(clean):
    features = record(L1)["features"]
    by_index = {f["index"]: f for f in features}
    # The word some feature fires on most often, whatever this build learned.
    word, owner, _ = max(((str(t["token"]).strip().lower(), f["index"], t["count"])
                          for f in features for t in f["top_tokens"]
                          if re.fullmatch(r"[a-z]{3,}", str(t["token"]).strip().lower())),
                         key=lambda found: found[2])
    found = search(clean, L1, query=word.upper(), limit=256)
    indices = [m["index"] for m in found["data"]]
    assert owner in indices and found["total"] == len(indices)
    scores = [m["score"] for m in found["data"]]
    assert scores == sorted(scores, reverse=True) and all(s > 0 for s in scores)
    assert all(holds(by_index[i], word) for i in indices)
    assert sum(holds(f, word) for f in features) == len(indices)
    # Paging cuts the same ranking.
    page = search(clean, L1, query=word, offset=1, limit=2)
    assert [m["index"] for m in page["data"]] == indices[1:3] and page["total"] == len(indices)
    assert search(clean, L1, query="zzzqqq")["data"] == []


@pytest.mark.parametrize("model", [TINY, F32])
def test_search_by_example_ranks_what_the_readout_reads(clean, model):
    found = search(clean, L1, example=SENTENCE, model=model, limit=256)
    reply = clean.api("POST", "/v1/completions", {
        "model": model, "prompt": SENTENCE, "max_tokens": 1, "logprobs": 0,
        "return_sae_activations": {"sae_id": L1, "positions": "prompt", "top_k": 32}})
    assert reply.status_code == 200, reply.text
    positions = reply.json()["millm"]["sae_activations"]["positions"]
    best: dict[int, float] = {}
    for position in positions:
        for f in position["features"]:
            if f["value"] > 0:
                best[f["index"]] = max(best.get(f["index"], 0.0), f["value"])
    assert {m["index"] for m in found["data"]} == set(best)
    for match in found["data"]:
        assert match["score"] == pytest.approx(best[match["index"]], abs=1e-5)
    scores = [m["score"] for m in found["data"]]
    assert scores == sorted(scores, reverse=True)
    # Each token with its strongest features, as the readout read them.
    assert [t["token_id"] for t in found["tokens"]] == [p["token_id"] for p in positions]
    for token, position in zip(found["tokens"], positions, strict=True):
        assert token["token"]
        read = [(f["index"], f["value"]) for f in position["features"] if f["value"] > 0][:8]
        assert [m["index"] for m in token["features"]] == [i for i, _ in read]


def test_neighbours_are_ranked_by_decoder_cosine(clean):
    weights = load_file(str(harness.models_dir() / "saes" / "millm-tiny-res-l0"
                            / "sae_weights.safetensors"))
    rows = torch.nn.functional.normalize(weights["W_dec"].float(), dim=1)
    cosines = (rows @ rows[5]).tolist()
    expected = sorted((i for i in range(len(cosines)) if i != 5), key=lambda i: -cosines[i])
    found = search(clean, L0, neighbours_of=5, limit=10)  # L0 is not attached: read from disk
    assert found["total"] == len(cosines) - 1
    assert [m["index"] for m in found["data"]] == expected[:10]
    for match in found["data"]:
        assert match["score"] == pytest.approx(cosines[match["index"]], abs=1e-5)


def test_grpc_search_answers_as_rest_does(clean):
    with grpc.insecure_channel(clean.grpc_target) as channel:
        reply = steering_service_pb2_grpc.SteeringServiceStub(channel).SearchSaeFeatures(
            steering_service_pb2.SearchSaeFeaturesRequest(sae_id=L1, example=SENTENCE, limit=5),
            timeout=60)
    rest = search(clean, L1, example=SENTENCE, limit=5)
    assert [(m.index, round(m.score, 5)) for m in reply.data] == [
        (m["index"], round(m["score"], 5)) for m in rest["data"]]
    assert reply.total == rest["total"] and len(reply.tokens) == len(rest["tokens"])


@pytest.mark.parametrize("sae_id, body, status, param", [
    ("sae_nothing", {"query": "sea"}, 404, "sae_id"),
    (L1, {}, 400, "query"),
    (L1, {"query": "  ,, "}, 400, "query"),
    (L1, {"query": "x" * 257}, 400, "query"),
    (L1, {"example": ""}, 400, "example"),
    (L1, {"example": "x" * 2049}, 400, "example"),
    (L0, {"example": "The sea."}, 400, "sae_id"),  # not attached
    (L1, {"neighbours_of": 256}, 400, "neighbours_of"),
    (L1, {"neighbours_of": -1}, 400, "neighbours_of"),
    (L1, {"query": "sea", "limit": 0}, 400, "limit"),
    (L1, {"query": "sea", "limit": 257}, 400, "limit"),
    (L1, {"query": "sea", "offset": -1}, 400, "offset"),
    (L1, {"example": "The sea.", "model": "no-such-model"}, 404, "model"),
])
def test_bad_searches_are_refused_naming_the_field(clean, sae_id, body, status, param):
    reply = clean.api("POST", f"/api/saes/{sae_id}/search", body)
    assert reply.status_code == status, reply.text
    assert error(reply)["param"] == param


def test_a_body_that_is_not_a_search_is_400(clean):
    for raw in (b"[1]", b"{", b'{"query": 5}', b'{"query": "a", "example": "b"}'):
        reply = clean.api("POST", f"/api/saes/{L1}/search", raw=raw)
        assert reply.status_code == 400, (raw, reply.text)
