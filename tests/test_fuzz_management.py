"""Generated requests on every management route (/api/...): never a 5xx,
always the OpenAI envelope on an error, and the engine keeps serving.

Path names are drawn like everything else (long, odd, escaped), bodies are
plausible documents with wrong values, unknown keys, thousands of keys, deep
nesting or any JSON at all (tests/fuzz_support.py). The run uses a stack of
its own, since it creates, changes and activates steering state at random;
model loads and unloads never name a model on disk.
"""

from __future__ import annotations

import json
import urllib.parse

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from rest_bridge.serving import monitoring_api
from rest_bridge.serving.steering_api import ROUTES
from tests.conftest import MODEL
from tests.fuzz_support import ANY_JSON, KEY, LONG_TEXT, ODD_TEXT, fuzz
from tests.http_helpers import call

NAME = st.one_of(st.sampled_from(["calm", "edge", "active", "p1", "demo", "a.b-c_d"]),
                 st.text(min_size=1, max_size=12), ODD_TEXT.filter(bool), LONG_TEXT)
NUMBER = st.one_of(st.integers(-5, 300), st.floats(allow_nan=False), st.integers(-(2**70), 2**70),
                   st.sampled_from(["1", "max", None, True]))


def sometimes(strategy):
    return st.integers(0, 7).flatmap(lambda k: ANY_JSON if k == 0 else strategy)


ENTRY = st.fixed_dictionaries({}, optional={
    "layer": sometimes(NUMBER), "feature": sometimes(NUMBER), "strength": sometimes(NUMBER),
    "sae_id": sometimes(NAME), "label": sometimes(NAME)})
ENTRIES = st.one_of(st.lists(ENTRY, max_size=4), st.lists(ENTRY, min_size=300, max_size=600))
DOCUMENT = st.fixed_dictionaries({}, optional={
    "format": sometimes(st.sampled_from(["millm.cluster.v1", "millm.circuit.v1", "x"])),
    "name": sometimes(NAME), "description": sometimes(NAME), "rung": sometimes(NUMBER),
    "intensity_range": sometimes(st.lists(NUMBER, max_size=3)),
    "intensity": sometimes(NUMBER), "mode": sometimes(st.sampled_from(
        ["full", "slice_fallback", "other"])), "fallback_cluster": sometimes(NAME),
    "members": sometimes(ENTRIES), "edges": sometimes(st.lists(ANY_JSON, max_size=3)),
    "entries": sometimes(ENTRIES), "values": sometimes(ENTRIES),
    "enabled": sometimes(st.booleans()), "replace_values": sometimes(st.booleans()),
    "intensity_only": sometimes(NUMBER),
    # probes and monitoring
    "sae_id": sometimes(NAME), "feature": sometimes(NUMBER), "threshold": sometimes(NUMBER),
    "layer": sometimes(NUMBER), "model": sometimes(NAME),
    "features": sometimes(st.lists(st.fixed_dictionaries({}, optional={
        "index": sometimes(NUMBER), "weight": sometimes(NUMBER)}), max_size=70)),
    # feature search, cards and explanations
    "query": sometimes(NAME), "example": sometimes(NAME), "neighbours_of": sometimes(NUMBER),
    "limit": sometimes(NUMBER), "offset": sometimes(NUMBER), "text": sometimes(NAME)})
# A Neuronpedia explanation export, with wrong values now and then.
EXPORT = st.lists(st.fixed_dictionaries({}, optional={
    "index": sometimes(st.one_of(NUMBER, st.integers(0, 300).map(str))),
    "description": sometimes(NAME), "explanationModelName": sometimes(NAME),
    "modelId": sometimes(NAME), "layer": sometimes(NAME)}), max_size=5)
BODY = st.one_of(
    st.tuples(DOCUMENT, st.dictionaries(KEY, ANY_JSON, max_size=2)).map(
        lambda pair: json.dumps({**pair[1], **pair[0]}).encode()),
    ANY_JSON.map(lambda v: json.dumps(v).encode()),
    EXPORT.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=64),
    st.just(b""),
)
ROUTE_TABLE = [(r.method, r.path) for r in ROUTES + monitoring_api.ROUTES] + [
    # One fuzzed value per URL: two of the longest would pass the HTTP parser's limit.
    ("GET", "/api/saes/sae_millm-tiny-res-l1/features?query={name}"),
    ("GET", "/api/saes/sae_millm-tiny-res-l1/features?limit={name}&offset=3"),
    ("GET", "/api/saes/sae_millm-tiny-res-l1/features?offset={name}"),
    ("GET", "/api/monitoring?model={name}"),
    # The workbench routes on a real SAE (attached by the runs that attach it at random).
    ("POST", "/api/saes/sae_millm-tiny-res-l1/search"),
    ("POST", "/api/saes/sae_millm-tiny-res-l0/search"),
    ("GET", "/api/saes/sae_millm-tiny-res-l1/features/{name}"),
    ("GET", "/api/saes/sae_millm-tiny-res-l1/features/3?top_tokens={name}"),
    ("PUT", "/api/saes/sae_millm-tiny-res-l1/features/{name}/explanation"),
    ("PUT", "/api/saes/sae_millm-tiny-res-l1/features/3/explanation"),
    ("POST", "/api/saes/sae_millm-tiny-res-l1/explanations"),
    ("GET", "/api/models"), ("GET", "/api/models/{model_id}"),
    ("POST", "/api/models/{model_id}/load"), ("POST", "/api/models/{model_id}/unload"),
    ("GET", "/api/health/inference"), ("GET", "/api/capabilities"),
    ("POST", "/api/prefix-cache/clear"),
]


def quoted(name: str) -> str:
    # Past about 64 KiB the HTTP parser refuses the request line with a plain
    # 400 before the app sees it; up to there the bridge answers (414 beyond 32 KiB).
    return urllib.parse.quote(name.encode("utf-8", "surrogatepass"), safe="")[:48_000]


@pytest.fixture(scope="module")
def models_on_disk(fuzz_stack) -> set[str]:
    listed = call(fuzz_stack.http_port, "GET", "/api/models").json()["data"]
    return {m["id"] for m in listed}


@fuzz(max_examples=300)
@given(route=st.sampled_from(ROUTE_TABLE), name=NAME, body=BODY)
def test_no_5xx_on_the_management_api(fuzz_stack, models_on_disk, route, name, body):
    method, template = route
    if "{model_id}" in template and name in models_on_disk:
        name = "not-a-model"
    # One fuzzed value per URL (see ROUTE_TABLE): the routes with an index
    # and a fuzzed SAE id take index 3; those on a real SAE fuzz the index.
    path = template.format(name=quoted(name), sae_id=quoted(name), model_id=quoted(name),
                           vector_id=quoted(name), index=3)
    raw = body if method in ("POST", "PUT", "PATCH") else None
    reply = call(fuzz_stack.http_port, method, path, raw=raw, timeout=60)
    assert reply.status_code < 500, (method, path[:300], raw[:500] if raw else None,
                                     reply.text[:500])
    if reply.status_code >= 400:
        error = reply.json()["error"]
        event(f"{method} {template} {reply.status_code} {error['code']}")
        assert set(error) == {"message", "type", "param", "code"}, reply.text[:500]
        assert error["message"] and len(error["message"].encode()) <= 4096
    else:
        event(f"{method} {template} {reply.status_code}")
        reply.json()


def test_still_serving_after_the_fuzzing(fuzz_stack):
    reply = call(fuzz_stack.http_port, "POST", "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["finish_reason"] in ("stop", "length")
