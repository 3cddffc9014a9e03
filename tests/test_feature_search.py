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
    (L1, {"example": "x" * 2001}, 400, "example"),
    (L1, {"example": "\U0001f30a" * 501}, 400, "example"),  # 2,004 bytes
    (L0, {"example": "The sea."}, 400, "sae_id"),  # not attached
    (L1, {"neighbours_of": 256}, 400, "neighbours_of"),
    (L1, {"neighbours_of": -1}, 400, "neighbours_of"),
    (L1, {"query": "sea", "limit": 0}, 400, "limit"),
    (L1, {"query": "sea", "limit": 257}, 400, "limit"),
    (L1, {"query": "sea", "offset": -1}, 400, "offset"),
    (L1, {"example": "The sea.", "model": "no-such-model"}, 404, "model"),
    (L1, {"meaning": "  "}, 400, "meaning"),
    (L1, {"meaning": "x" * 257}, 400, "meaning"),
    (L1, {"meaning": "sea", "model": "no-such-model"}, 404, "model"),
])
def test_bad_searches_are_refused_naming_the_field(clean, sae_id, body, status, param):
    reply = clean.api("POST", f"/api/saes/{sae_id}/search", body)
    assert reply.status_code == status, reply.text
    assert error(reply)["param"] == param


def test_a_body_that_is_not_a_search_is_400(clean):
    for raw in (b"[1]", b"{", b'{"query": 5}', b'{"query": "a", "example": "b"}'):
        reply = clean.api("POST", f"/api/saes/{L1}/search", raw=raw)
        assert reply.status_code == 400, (raw, reply.text)


def embeddings(stack: SteerStack, model: str, texts: list[str]) -> torch.Tensor:
    reply = stack.api("POST", "/v1/embeddings", {"model": model, "input": texts})
    assert reply.status_code == 200, reply.text
    return torch.tensor([d["embedding"] for d in reply.json()["data"]], dtype=torch.float64)


@pytest.mark.parametrize("model", [TINY, F32])
def test_search_by_meaning_ranks_by_the_served_models_embeddings(clean, model):
    """Each feature's description (meaning.descriptions) and the query are
    embedded by the served model (as /v1/embeddings returns them) and ranked
    by cosine around the descriptions' mean; a query that is a feature's own
    description finds it first; an explanation becomes part of it."""
    from service.steering.meaning import descriptions
    from service.steering.sae import read_info

    info = read_info(harness.models_dir() / "saes" / "millm-tiny-res-l1")
    described = descriptions(record(L1), info, {})
    indices = sorted(described)
    vectors = embeddings(clean, model, [described[i] for i in indices])
    centre = vectors.mean(dim=0)
    target = indices[len(indices) // 2]
    found = search(clean, L1, meaning=described[target], model=model, limit=5)
    assert found["total"] == len(indices)
    assert found["data"][0] == {"index": target, "score": pytest.approx(1.0, abs=1e-6)}
    query = "gulls over the sea"
    found = search(clean, L1, meaning=query, model=model, limit=5)
    q = embeddings(clean, model, [query])[0] - centre
    rows = torch.nn.functional.normalize(vectors - centre, dim=1)
    want = (rows @ torch.nn.functional.normalize(q, dim=0)).tolist()
    for match in found["data"]:
        assert match["score"] == pytest.approx(want[indices.index(match["index"])], abs=1e-4)
    assert [m["score"] for m in found["data"]] == sorted(
        (m["score"] for m in found["data"]), reverse=True)
    # An explanation joins the description (and the cached vectors follow).
    clean.ok("PUT", f"/api/saes/{L1}/features/{target}/explanation",
             {"text": "lighthouses at night"})
    try:
        again = descriptions(record(L1), info, {target: "lighthouses at night"})
        assert again[target].startswith("lighthouses at night")
        first = search(clean, L1, meaning=again[target], model=model, limit=1)["data"][0]
        assert first["index"] == target and first["score"] == pytest.approx(1.0, abs=1e-6)
    finally:
        clean.ok("PUT", f"/api/saes/{L1}/features/{target}/explanation", {"text": ""})


# --- cards and explanations -------------------------------------------------------------


def _unembedding_and_decoder(sae_dir: str) -> tuple[torch.Tensor, torch.Tensor]:
    model = load_file(str(harness.models_dir() / "millm-tiny" / "model.safetensors"))
    sae = load_file(str(harness.models_dir() / "saes" / sae_dir / "sae_weights.safetensors"))
    return model["lm_head.weight"].float(), sae["W_dec"].float()


@pytest.mark.parametrize("model", [TINY, F32])
def test_a_card_holds_the_record_and_the_tokens_the_direction_promotes(clean, model):
    clean.api("POST", "/v1/completions", {"model": model, "prompt": "Hi", "max_tokens": 1})
    index = 18
    card = clean.ok("GET", f"/api/saes/{L0}/features/{index}?top_tokens=5")
    feature = next(f for f in record(L0)["features"] if f["index"] == index)
    assert card["index"] == index and card["recorded"] is True
    assert card["density"] == pytest.approx(feature["density"])
    assert [c["left"] for c in card["top_contexts"]] == [e["left"] for e in feature["examples"]]
    assert [t["token"] for t in card["top_tokens"]] == [t["token"] for t in feature["top_tokens"]]
    unembedding, decoder = _unembedding_and_decoder("millm-tiny-res-l0")
    logits = unembedding @ decoder[index]
    assert card["model"] == model
    promoted = [t["token_id"] for t in card["promoted_tokens"]]
    assert promoted == torch.topk(logits, 5).indices.tolist()
    suppressed = [t["token_id"] for t in card["suppressed_tokens"]]
    assert suppressed == torch.topk(-logits, 5).indices.tolist()
    for token in card["promoted_tokens"] + card["suppressed_tokens"]:
        assert token["value"] == pytest.approx(float(logits[token["token_id"]]), abs=1e-4)
        assert token["token"]
    assert card["explanation"] is None


def test_explanations_are_set_imported_searched_and_removed(clean):
    base = f"/api/saes/{L1}/features"
    set_reply = clean.ok("PUT", f"{base}/200/explanation", {"text": "  harbours and boats "})
    assert set_reply["explanation"]["text"] == "harbours and boats"
    assert set_reply["explanation"]["source"] == "user"
    # Neuronpedia's export: indices as strings, the explainer's name kept as the source.
    export = [{"modelId": "millm-tiny", "layer": "1-res", "index": "201",
               "description": "lighthouses by the harbours", "explanationModelName": "gpt-4o"},
              {"modelId": "millm-tiny", "layer": "1-res", "index": 202,
               "description": "quiet evenings"}]
    assert clean.ok("POST", f"/api/saes/{L1}/explanations", export) == {"imported": 2}
    assert clean.ok("GET", f"{base}/201")["explanation"]["source"] == "gpt-4o"
    assert clean.ok("GET", f"{base}/202")["explanation"]["source"] == "neuronpedia"
    found = search(clean, L1, query="harbours", limit=256)
    assert {200, 201} <= {m["index"] for m in found["data"]}
    assert all(m["score"] >= 1.0 for m in found["data"] if m["index"] in (200, 201))
    for index in (200, 201, 202):
        assert clean.ok("PUT", f"{base}/{index}/explanation", {"text": ""}) == {
            "explanation": None}
        assert clean.ok("GET", f"{base}/{index}")["explanation"] is None


@pytest.mark.parametrize("method, path, body, status, param", [
    ("GET", f"/api/saes/{L0}/features/128", None, 400, "index"),
    ("GET", f"/api/saes/{L0}/features/x", None, 400, "index"),
    ("GET", f"/api/saes/{L0}/features/3?top_tokens=65", None, 400, "top_tokens"),
    ("GET", "/api/saes/sae_nothing/features/3", None, 404, "sae_id"),
    ("PUT", f"/api/saes/{L0}/features/128/explanation", {"text": "x"}, 400, "index"),
    ("PUT", f"/api/saes/{L0}/features/3/explanation", {"text": "x" * 1001}, 400, "text"),
    ("PUT", f"/api/saes/{L0}/features/3/explanation", {"words": "x"}, 400, "text"),
    ("POST", f"/api/saes/{L0}/explanations", {"a": 1}, 400, "document"),
    ("POST", f"/api/saes/{L0}/explanations", [], 400, "document"),
    ("POST", f"/api/saes/{L0}/explanations", [{"index": "128", "description": "x"}], 400,
     "document[0].index"),
    ("POST", f"/api/saes/{L0}/explanations", [{"index": 1, "description": ""}], 400,
     "document[0].description"),
    ("POST", f"/api/saes/{L0}/explanations", [{"index": 1, "description": "x" * 1001}], 400,
     "document[0].description"),
])
def test_bad_cards_and_explanations_are_refused_naming_the_field(clean, method, path, body,
                                                                 status, param):
    reply = clean.api(method, path, body)
    assert reply.status_code == status, reply.text
    assert error(reply)["param"] == param
    assert clean.ok("GET", f"/api/saes/{L0}/features/1")["explanation"] is None


def test_the_longest_example_fits_the_readout_whatever_its_tokens(clean):
    """2,000 bytes of four-byte characters: as many tokens as the tokenizer
    makes of them, every one read."""
    found = search(clean, L1, example="\U0001f30a" * 500, limit=1)
    assert found["tokens"] and found["total"] >= 1
