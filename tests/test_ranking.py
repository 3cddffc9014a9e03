"""Rerank, score and classify (service/ranking.py, RankingService and the
bridge's /v1/rerank, /rerank, /v1/score, /v1/classify), end to end on the
demo model: over REST on both engines, and over gRPC.

What the model makes of relevance is its own business (it is tiny); what is
asserted is the method: rerank's scores are the cosine similarities of the
model's own /v1/embeddings vectors, ordered best first; a probe's verdict is
the monitoring rule applied to the input's own activations as
return_sae_activations reads them; label probabilities sum to one and the
label is the likeliest."""

from __future__ import annotations

import math

import grpc
import numpy as np
import pytest

from millm.v1 import ranking_service_pb2, ranking_service_pb2_grpc
from service.demo_model.build import CONTEXT_WINDOW
from tests import harness
from tests.conftest import MODEL
from tests.grpc_helpers import error_info
from tests.http_helpers import call

GGUF = "millm-tiny-gguf:Q8_0"
L1 = "sae_millm-tiny-res-l1"
QUERY = "Where does the miller work?"
DOCUMENTS = ["The miller works at the mill by the river.", "Cats sleep in the sun.",
             "The market opens in the morning by the bridge."]
TEXT = "The river ran past the mill, and the miller counted the sacks of grain."


def post(stack, path: str, body: dict):
    return call(stack.http_port, "POST", path, body)


def embeddings(stack, model: str, texts: list[str]) -> np.ndarray:
    reply = post(stack, "/v1/embeddings", {"model": model, "input": texts})
    assert reply.status_code == 200, reply.text
    return np.array([d["embedding"] for d in reply.json()["data"]], dtype=np.float64)


@pytest.mark.parametrize("engine", ["transformers", "gguf"])
def test_rerank_orders_documents_by_embedding_similarity(stack, gguf_stack, engine):
    own, model = (stack, MODEL) if engine == "transformers" else (gguf_stack, GGUF)
    reply = post(own, "/v1/rerank", {"model": model, "query": QUERY, "documents": DOCUMENTS})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    vectors = embeddings(own, model, [QUERY, *DOCUMENTS])
    cosine = vectors[1:] @ vectors[0] / (np.linalg.norm(vectors[1:], axis=1)
                                         * np.linalg.norm(vectors[0]))
    results = body["results"]
    assert [r["index"] for r in results] == sorted(range(3), key=lambda i: -cosine[i])
    for r in results:
        assert r["relevance_score"] == pytest.approx(cosine[r["index"]], abs=1e-4)
        assert r["document"] == {"text": DOCUMENTS[r["index"]]}
    assert body["model"] == model and body["usage"]["total_tokens"] > 0

    # /rerank (Jina's and llama.cpp's path), Cohere's document objects, top_n.
    short = post(own, "/rerank", {"model": model, "query": QUERY, "top_n": 2,
                                  "return_documents": False,
                                  "documents": [{"text": d} for d in DOCUMENTS]}).json()
    assert [r["index"] for r in short["results"]] == [r["index"] for r in results[:2]]
    assert all("document" not in r for r in short["results"])


def test_score_pairs_one_text_with_each_and_lists_in_order(stack):
    one = post(stack, "/v1/score", {"model": MODEL, "text_1": QUERY, "text_2": DOCUMENTS})
    assert one.status_code == 200, one.text
    ranked = post(stack, "/v1/rerank", {"model": MODEL, "query": QUERY,
                                        "documents": DOCUMENTS}).json()["results"]
    by_index = {r["index"]: r["relevance_score"] for r in ranked}
    data = one.json()["data"]
    assert [d["index"] for d in data] == [0, 1, 2]
    assert all(d["object"] == "score" for d in data)
    assert [d["score"] for d in data] == pytest.approx([by_index[i] for i in range(3)])
    paired = post(stack, "/v1/score", {"model": MODEL, "text_1": [QUERY, QUERY],
                                       "text_2": DOCUMENTS[:2]}).json()["data"]
    assert [d["score"] for d in paired] == pytest.approx([by_index[0], by_index[1]])
    bad = post(stack, "/v1/score", {"model": MODEL, "text_1": [QUERY, QUERY],
                                    "text_2": DOCUMENTS})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "text_1"
    for empty, param in (({"text_1": [], "text_2": []}, "text_1"),
                         ({"text_1": QUERY, "text_2": []}, "text_2")):
        refused = post(stack, "/v1/score", {"model": MODEL, **empty})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param


@pytest.mark.parametrize("engine", ["transformers", "gguf"])
def test_classify_by_labels_gives_probabilities_over_the_labels(stack, gguf_stack, engine):
    own, model = (stack, MODEL) if engine == "transformers" else (gguf_stack, GGUF)
    labels = ["river", "market", "cat"]
    reply = post(own, "/v1/classify", {"model": model, "input": [TEXT, "Cats sleep."],
                                       "labels": labels})
    assert reply.status_code == 200, reply.text
    data = reply.json()["data"]
    assert [d["index"] for d in data] == [0, 1]
    for d in data:
        assert d["num_classes"] == 3 and math.isclose(sum(d["probs"]), 1.0, abs_tol=1e-6)
        assert d["label"] == labels[int(np.argmax(d["probs"]))]


@pytest.mark.parametrize(("body", "param"), [
    ({"query": "", "documents": ["a"]}, "query"),
    ({"query": "q", "documents": []}, "documents"),
    ({"query": "q", "documents": ["a", ""]}, "documents[1]"),
    ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ({"query": "q", "documents": ["a"] * 1025}, "documents"),
    ({"query": "q", "documents": ["word " * (CONTEXT_WINDOW + 8)]}, "documents[0]"),
])
def test_bad_rerank_bodies_are_400_naming_the_field(stack, body, param):
    reply = post(stack, "/v1/rerank", {"model": MODEL, **body})
    assert reply.status_code == 400, reply.text[:300]
    assert reply.json()["error"]["param"] == param


@pytest.mark.parametrize(("body", "param", "status"), [
    ({"input": "x"}, "labels", 400),
    ({"input": "x", "labels": ["a"]}, "labels", 400),
    ({"input": "x", "labels": ["a", "a"]}, "labels", 400),
    ({"input": "x", "labels": ["a", "b"], "probe": "p"}, "labels", 400),
    ({"input": [], "labels": ["a", "b"]}, "input", 400),
    ({"input": ["x"] * 100, "labels": [str(i) for i in range(11)]}, "labels", 400),
    ({"input": "x", "probe": "nothing"}, "probe", 404),
])
def test_bad_classify_bodies_are_refused_naming_the_field(stack, body, param, status):
    reply = post(stack, "/v1/classify", {"model": MODEL, **body})
    assert reply.status_code == status, reply.text
    assert reply.json()["error"]["param"] == param


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    own = harness.OwnStack(tmp_path_factory.mktemp("ranking"))
    try:
        assert call(own.http_port, "POST", f"/api/saes/{L1}/attach").status_code == 200
        yield own
    finally:
        own.stop()


def test_a_probe_classifies_by_the_inputs_own_activations(probed):
    """The strongest feature at any of the input's tokens (as the readout
    reports it) is the probe; with the threshold under its peak it fires,
    above it it does not, and its score is the peak (the test can fail: a
    verdict read from other positions or another layer misses it)."""
    read = post(probed, "/v1/completions", {
        "model": MODEL, "prompt": TEXT, "max_tokens": 1, "temperature": 0,
        "return_sae_activations": {"sae_id": L1, "positions": "prompt", "top_k": 1}})
    assert read.status_code == 200, read.text
    peaks = [(p["features"][0]["value"], p["features"][0]["index"])
             for p in read.json()["millm"]["sae_activations"]["positions"] if p["features"]]
    value, feature = max(peaks)
    assert value > 0
    for name, threshold in (("low", value / 2), ("high", value * 2)):
        created = call(probed.http_port, "POST", "/api/probes", {
            "name": name, "sae_id": L1, "feature": feature, "threshold": threshold})
        assert created.status_code == 200, created.text
    verdicts = {}
    for name in ("low", "high"):
        reply = post(probed, "/v1/classify", {"model": MODEL, "input": [TEXT], "probe": name})
        assert reply.status_code == 200, reply.text
        verdicts[name] = reply.json()["data"][0]
        assert verdicts[name]["score"] == pytest.approx(value, rel=1e-3, abs=1e-4)
    assert verdicts["low"]["label"] == "fired" and verdicts["high"]["label"] == "not_fired"
    assert verdicts["low"]["threshold"] == pytest.approx(value / 2)

    # A probe whose SAE is not attached is refused, naming it.
    assert call(probed.http_port, "POST", f"/api/saes/{L1}/detach").status_code == 200
    try:
        refused = post(probed, "/v1/classify", {"model": MODEL, "input": TEXT, "probe": "low"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "probe"
    finally:
        assert call(probed.http_port, "POST", f"/api/saes/{L1}/attach").status_code == 200


def test_ranking_over_grpc(channel):
    stub = ranking_service_pb2_grpc.RankingServiceStub(channel)
    reply = stub.Rerank(ranking_service_pb2.RerankRequest(model=MODEL, query=QUERY,
                                                          documents=DOCUMENTS, top_n=1))
    assert len(reply.results) == 1 and reply.model == MODEL
    labelled = stub.Classify(ranking_service_pb2.ClassifyRequest(
        model=MODEL, inputs=[TEXT], labels=["yes", "no"]))
    assert labelled.data[0].label in ("yes", "no") and len(labelled.data[0].probs) == 2
    with pytest.raises(grpc.RpcError) as caught:
        stub.Rerank(ranking_service_pb2.RerankRequest(model=MODEL, query=QUERY))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).metadata["param"] == "documents"
