"""Two real engines on one real PostgreSQL (tests/postgres.py), the first
behind a bridge: text PostgreSQL cannot hold (a NUL) is answered 4xx naming
the field, through HTTP and gRPC, never 503 state_store_unavailable; and a
write whose caller's deadline expired while it waited for the cluster's write
lock leaves that lock free: the other replica writes within a second of the
lock coming free, and both replicas agree on what was written.
(tests/test_state_postgres_faults.py has the same faults in process.)
"""

from __future__ import annotations

import time
import urllib.parse

import grpc
import psycopg
import pytest

from millm.v1 import response_service_pb2 as rpb
from millm.v1 import response_service_pb2_grpc, steering_service_pb2
from millm.v1 import steering_service_pb2_grpc as steering_grpc
from service.state.postgres import WRITE_LOCK
from tests import harness
from tests.conftest import MODEL, wait_until
from tests.grpc_helpers import error_info
from tests.http_helpers import call
from tests.postgres import PostgresCluster

NUL_ID = "resp_a\x00b"


class Engines:
    def __init__(self, tmp, pg: PostgresCluster):
        self.pg = pg
        self.a = harness.OwnStack(tmp / "a", MILLM_DATABASE_URL=pg.url)
        self.b, self.b_port = harness.start_engine(tmp / "b", MILLM_DATABASE_URL=pg.url)
        harness.wait_serving(self.b, self.b_port)
        self.channels = [grpc.insecure_channel(self.a.grpc_target),
                         grpc.insecure_channel(f"127.0.0.1:{self.b_port}")]
        self.steering = [steering_grpc.SteeringServiceStub(c) for c in self.channels]
        self.responses = response_service_pb2_grpc.ResponseServiceStub(self.channels[0])

    def profile_names(self, i: int) -> set[str]:
        return {p.name for p in self.steering[i].ListProfiles(
            steering_service_pb2.ListProfilesRequest(), timeout=5).profiles}

    def stop(self) -> None:
        for c in self.channels:
            c.close()
        self.b.stop()
        self.a.stop()


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replica-store-faults")
    (tmp / "a").mkdir()
    (tmp / "b").mkdir()
    pg = PostgresCluster()
    try:
        own = Engines(tmp, pg)
        try:
            yield own
        finally:
            own.stop()
    finally:
        pg.close()


def _refused(rpc, request) -> tuple[str, str]:
    with pytest.raises(grpc.RpcError) as caught:
        rpc(request, timeout=10)
    info = error_info(caught.value)
    return info.reason, info.metadata.get("param", "")


def test_a_nul_in_a_profile_description_is_400_naming_it(engines):
    http = engines.a.http_port
    reply = call(http, "POST", "/api/profiles", {"name": "nul", "description": "a\x00b",
                                                 "entries": []})
    assert reply.status_code == 400, reply.text
    assert (reply.json()["error"]["code"], reply.json()["error"]["param"]) == (
        "invalid_parameter", "description")
    assert call(http, "POST", "/api/profiles", {"name": "nul", "entries": []}).status_code == 200
    reply = call(http, "PATCH", "/api/profiles/nul", {"description": "\x00"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "description"
    b = engines.steering[1]
    assert _refused(b.UpdateProfile, steering_service_pb2.UpdateProfileRequest(
        name="nul", description="x\x00")) == ("invalid_parameter", "description")
    assert _refused(b.ImportCluster, steering_service_pb2.ImportClusterRequest(
        document_json='{"format": "millm.cluster.v1", "name": "c", "description": "\\u0000",'
                      ' "members": [{"layer": 1, "feature": 1}]}')) == (
        "invalid_document", "description")
    assert [p.description for p in b.ListProfiles(
        steering_service_pb2.ListProfilesRequest()).profiles if p.name == "nul"] == [""]


# The response id rule (service/responses/rules.py) refuses a NUL id before
# any query: 400 naming the field, never the 503 that PostgreSQL's DataError
# used to become.
REFUSALS = ("invalid_parameter",)


def test_a_nul_in_a_response_id_is_a_400_naming_it(engines):
    stub = engines.responses
    for rpc, request, param in (
            (stub.GetResponse, rpb.GetResponseRequest(id=NUL_ID), "id"),
            (stub.DeleteResponse, rpb.DeleteResponseRequest(id=NUL_ID), "id"),
            (stub.ListInputItems, rpb.ListInputItemsRequest(response_id=NUL_ID), "response_id"),
            (stub.SaveResponse, rpb.SaveResponseRequest(response=rpb.StoredResponse(
                id="resp_fine", model=MODEL, previous_response_id=NUL_ID)),
             "response.previous_response_id")):
        reason, named = _refused(rpc, request)
        assert reason in REFUSALS and named == param, (rpc, reason, named)
    http = engines.a.http_port
    quoted = urllib.parse.quote(NUL_ID, safe="")
    for method, path in (("GET", f"/v1/responses/{quoted}"), ("DELETE", f"/v1/responses/{quoted}"),
                         ("GET", f"/v1/responses/{quoted}/input_items")):
        reply = call(http, method, path)
        assert reply.status_code == 400, (path, reply.text)
        assert reply.json()["error"]["code"] in REFUSALS
    reply = call(http, "POST", "/v1/responses", {
        "model": MODEL, "input": "Hi", "max_output_tokens": 2, "previous_response_id": NUL_ID})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["code"] in REFUSALS
    assert reply.json()["error"]["param"] == "previous_response_id"


def test_a_write_whose_caller_gave_up_leaves_the_cluster_lock_free(engines):
    a, b = engines.steering
    with psycopg.connect(engines.pg.url, autocommit=True) as holder:
        # Someone holds the cluster's write lock: a's write waits for it past
        # its caller's deadline.
        holder.execute("SELECT pg_advisory_lock(%s)", (WRITE_LOCK,))
        with pytest.raises(grpc.RpcError) as caught:
            a.CreateProfile(steering_service_pb2.CreateProfileRequest(name="gave-up"),
                            timeout=0.5)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        holder.execute("SELECT pg_advisory_unlock(%s)", (WRITE_LOCK,))
    start = time.monotonic()
    b.CreateProfile(steering_service_pb2.CreateProfileRequest(name="b-after"), timeout=5)
    took = time.monotonic() - start
    print(f"\nthe other replica's write answered {took * 1000:.0f} ms after the lock came free")
    assert took < 1.0
    # The write whose caller left ran whole: both replicas have it.
    assert wait_until(lambda: all({"gave-up", "b-after"} <= engines.profile_names(i)
                                  for i in (0, 1)), 2.0)
