"""The trained demo SAEs and the record of what their features fire on.

Reading features changes no state, so these run on the session stack."""

from __future__ import annotations

import json

import grpc
import pytest

from millm.v1 import steering_service_pb2, steering_service_pb2_grpc
from service.demo_model import sae as demo_sae
from service.steering.features import FeatureRecords
from service.steering.sae import read_info
from tests import harness
from tests.grpc_helpers import error_info
from tests.http_helpers import call

L0 = "sae_millm-tiny-res-l0"


def test_demo_saes_are_trained_on_the_current_model():
    models = harness.models_dir()
    for name, _layer, d_sae, _arch, _seed in demo_sae.DEMO_SAES:
        marker = json.loads((models / "saes" / name / demo_sae.MARKER).read_text())
        assert marker["build"] == demo_sae.SAE_BUILD
        assert marker["model_revision"] == demo_sae.model_revision(models)
        # A trained dictionary explains most of the residual, with nearly every
        # feature used (a dead feature or two is the norm in dictionary learning).
        assert marker["variance_explained"] > 0.8
        assert marker["features_alive"] >= 0.98 * d_sae
        assert 1 < marker["mean_active_per_token"] < d_sae / 4


def test_features_are_browsable_and_searchable(stack):
    reply = call(stack.http_port, "GET", f"/api/saes/{L0}/features?limit=5&offset=2")
    assert reply.status_code == 200, reply.text
    page = reply.json()
    assert page["recorded"] is True and page["total"] == 128
    assert page["sae"]["id"] == L0 and page["tokens_read"] > 4000
    assert [f["index"] for f in page["features"]] == [2, 3, 4, 5, 6]
    for feature in page["features"]:
        values = [e["value"] for e in feature["examples"]]
        assert values == sorted(values, reverse=True) and values[0] == feature["max_activation"]
        assert 0 < feature["density"] < 1
        assert all(set(e) == {"value", "token", "left", "right"} for e in feature["examples"])

    # The word the layer-0 SAE is most specialised on: the one that fills the
    # most of one feature's strongest positions. Read from the record, since
    # which words a retrained demo SAE specialises on changes with each build.
    everything = call(stack.http_port, "GET", f"/api/saes/{L0}/features?limit=256").json()
    assert everything["total"] == len(everything["features"]) == 128
    count, word = max((t["count"], t["token"].strip()) for f in everything["features"]
                      for t in f["top_tokens"] if t["token"].strip().isalpha())
    # A quarter of a feature's strongest positions: a feature for that word.
    assert count >= 8, (count, word)
    needle = word.lower()
    # Search ignores case and surrounding spaces, and finds exactly the
    # features with the word among their top tokens.
    found = call(stack.http_port, "GET",
                 f"/api/saes/{L0}/features?limit=256&query=%20{word.upper()}").json()
    assert 0 < found["total"] < 128
    assert [f["index"] for f in found["features"]] == [
        f["index"] for f in everything["features"]
        if any(needle in t["token"].lower() for t in f["top_tokens"])]
    for feature in found["features"]:
        assert any(needle in t["token"].lower() for t in feature["top_tokens"])
    # The best feature for the word fires on the word in the text it was trained on.
    best = max(found["features"], key=lambda f: sum(
        t["count"] for t in f["top_tokens"] if t["token"].strip() == word))
    assert any(e["token"].strip() == word for e in best["examples"])


@pytest.mark.parametrize(("query", "param"), [
    ("limit=0", "limit"), ("limit=257", "limit"), ("offset=-1", "offset"),
    ("limit=many", "limit"), ("query=" + "x" * 65, "query")])
def test_bad_pages_name_the_field(stack, query, param):
    reply = call(stack.http_port, "GET", f"/api/saes/{L0}/features?{query}")
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_unknown_sae_is_404_over_grpc_too(stack, channel):
    reply = call(stack.http_port, "GET", "/api/saes/sae_nothing/features")
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "sae_not_found"
    stub = steering_service_pb2_grpc.SteeringServiceStub(channel)
    with pytest.raises(grpc.RpcError) as caught:
        stub.ListSaeFeatures(steering_service_pb2.ListSaeFeaturesRequest(sae_id="sae_nothing"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(caught.value).reason == "sae_not_found"


def test_an_sae_without_a_record_is_served_as_not_recorded(tmp_path):
    directory = tmp_path / "plain"
    directory.mkdir()
    (directory / "cfg.json").write_text(json.dumps(
        {"d_in": 64, "d_sae": 8, "hook_name": "blocks.0.hook_resid_post"}))
    records = FeatureRecords()
    page = records.page(read_info(directory), "", 0, None)
    assert (page.recorded, page.total, page.features) == (False, 0, ())
    # A record appears (a retrained SAE): seen at once, out-of-width entries dropped.
    (directory / "features.json").write_text(json.dumps({
        "format": "millm.sae_features.v1", "tokens_read": 10,
        "features": [{"index": 1, "top_tokens": [{"token": " sea", "count": 2}]},
                     {"index": 99, "top_tokens": []}]}))
    page = records.page(read_info(directory), "SEA", 0, None)
    assert (page.recorded, page.total, [f["index"] for f in page.features]) == (True, 1, [1])
