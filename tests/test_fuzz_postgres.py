"""The fuzzers once more, on a stack whose state store is a real PostgreSQL
(tests/postgres.py): PostgreSQL refuses what SQLite stores (a NUL in text),
so a value that was harmless on SQLite could become a 5xx here.

Only the fuzzers whose requests reach the state store run again: the
management API's bodies (tests/test_fuzz_management.py), the Responses API's
bodies (tests/test_responses_fuzz.py, which stores and continues responses)
and the gRPC fuzzer (tests/test_fuzz_grpc.py) on the services that keep state
(steering, monitoring, stored responses). Each runs its own test's checks
(`.hypothesis.inner_test`), on fewer examples, so this stays short; chat,
completion and embedding bodies never reach the store. Since those fuzzers
seldom draw a write valid enough to be stored, one more draws valid writes
whose free text (a description) is hostile, and checks them the same way.
"""

from __future__ import annotations

import json

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from millm.v1 import (
    model_service_pb2,
    model_service_pb2_grpc,
    monitoring_service_pb2,
    response_service_pb2,
    steering_service_pb2,
)
from tests import harness, sweep_support
from tests.conftest import MODEL
from tests.fuzz_support import TEXT, fuzz
from tests.http_helpers import call
from tests.postgres import PostgresCluster
from tests.test_fuzz_bodies import STRICT
from tests.test_fuzz_grpc import test_no_server_fault_from_any_request as grpc_fuzz
from tests.test_fuzz_management import BODY, NAME, ROUTE_TABLE
from tests.test_fuzz_management import test_no_5xx_on_the_management_api as management_fuzz
from tests.test_responses_fuzz import BODIES
from tests.test_responses_fuzz import test_responses_bodies as responses_fuzz

STATEFUL = [(service, method)
            for module in (steering_service_pb2, monitoring_service_pb2, response_service_pb2)
            for service in module.DESCRIPTOR.services_by_name.values()
            for method in service.methods]


PROFILES = ["calm", "edge"]
STORED_WRITES = st.one_of(
    st.tuples(st.just(("POST", "/api/profiles")), st.sampled_from(PROFILES),
              st.fixed_dictionaries({"name": st.sampled_from(PROFILES), "description": TEXT,
                                     "entries": st.just([])})),
    st.tuples(st.just(("PATCH", "/api/profiles/{name}")), st.sampled_from(PROFILES),
              st.fixed_dictionaries({"description": TEXT})),
    st.tuples(st.just(("POST", "/api/clusters")), st.sampled_from(PROFILES),
              st.fixed_dictionaries({
                  "format": st.just("millm.cluster.v1"), "name": st.sampled_from(PROFILES),
                  "description": TEXT,
                  "members": st.just([{"layer": 1, "feature": 3, "strength": 1.0}])})),
).map(lambda t: (t[0], t[1], json.dumps(t[2]).encode()))


@pytest.fixture(scope="module")
def pg_stack(tmp_path_factory):
    pg = PostgresCluster()
    try:
        own = harness.OwnStack(tmp_path_factory.mktemp("fuzz-postgres"),
                               MILLM_DATABASE_URL=pg.url)
        try:
            yield own
        finally:
            own.stop()
    finally:
        pg.close()


@pytest.fixture(scope="module")
def pg_channel(pg_stack):
    with grpc.insecure_channel(pg_stack.grpc_target) as channel:
        yield channel


@pytest.fixture(scope="module")
def models_on_disk(pg_channel) -> set[str]:
    stub = model_service_pb2_grpc.ModelServiceStub(pg_channel)
    return {m.id for m in stub.ListModels(model_service_pb2.ListModelsRequest()).models}


@fuzz(max_examples=150)
@given(route=st.sampled_from(ROUTE_TABLE), name=NAME, body=BODY)
def test_management_bodies_on_postgresql(pg_stack, models_on_disk, route, name, body):
    management_fuzz.hypothesis.inner_test(pg_stack, models_on_disk, route, name, body)


@fuzz(max_examples=40)
@given(write=STORED_WRITES)
def test_stored_free_text_on_postgresql(pg_stack, models_on_disk, write):
    management_fuzz.hypothesis.inner_test(pg_stack, models_on_disk, *write)


@fuzz(max_examples=50)
@given(payload=BODIES, headers=STRICT)
def test_responses_bodies_on_postgresql(pg_stack, payload, headers):
    responses_fuzz.hypothesis.inner_test(pg_stack, payload, headers)


@fuzz(max_examples=150)
@given(data=st.data(), which=st.sampled_from(STATEFUL))
def test_stateful_grpc_requests_on_postgresql(pg_channel, models_on_disk, data, which):
    grpc_fuzz.hypothesis.inner_test(pg_channel, models_on_disk, data, which)


def test_the_sweep_of_store_routes_on_postgresql(pg_stack):
    """The systematic sweep's routes that reach the store: every management
    field and every stored-response read, each JSON type, on PostgreSQL."""
    made = call(pg_stack.http_port, "POST", "/v1/responses", {
        "model": MODEL, "input": "Hi", "max_output_tokens": 1})
    assert made.status_code == 200, made.text
    cases = (sweep_support.management_cases()
             + sweep_support.responses_read_cases(made.json()["id"]))
    failures = sweep_support.sweep(pg_stack, cases)
    assert not failures, "\n".join(failures[:20])
    assert sweep_support.alive(pg_stack) is None


def test_the_store_still_answers_after_the_fuzzing(pg_stack):
    reply = call(pg_stack.http_port, "POST", "/api/profiles", {"name": "after-fuzz",
                                                              "entries": []})
    assert reply.status_code == 200, reply.text
    assert call(pg_stack.http_port, "GET", "/api/profiles/after-fuzz").status_code == 200
