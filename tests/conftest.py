"""The shared stacks of a test session, on free loopback ports, serving the
real demo model: the default engine and bridge, and the steering stack
(`steer`) the steering test files share; other files start their own.
Tests talk to them with the openai SDK, generated gRPC stubs, grpcurl and
raw HTTP."""

from __future__ import annotations

import time

import grpc
import openai
import pytest

from millm.v1 import (
    embedding_service_pb2_grpc,
    generation_service_pb2_grpc,
    model_service_pb2_grpc,
    scoring_service_pb2_grpc,
    server_service_pb2,
    server_service_pb2_grpc,
)
from tests import harness

MODEL = "millm-tiny"


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    own = harness.OwnStack(tmp_path_factory.mktemp("stack"))
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture(scope="session")
def gguf_stack(tmp_path_factory):
    """The demo model's Q8_0 GGUF export on its own stack, for the files that
    check a feature on both engines (test_tokenize.py, test_logit_bias.py)."""
    own = harness.OwnStack(tmp_path_factory.mktemp("gguf-stack"),
                           MILLM_MODEL="millm-tiny-gguf:Q8_0")
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture(scope="session")
def fuzz_stack(tmp_path_factory):
    """A stack of the fuzzers' own: they create, change and activate steering
    state at random, which the session stack's tests must not see."""
    own = harness.OwnStack(tmp_path_factory.mktemp("fuzz-stack"))
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture(scope="session")
def steer(tmp_path_factory):
    """A stack of the steering tests' own, on an SAE dir of theirs
    (tests/steering_helpers.py): they change steering state, which the session
    stack's tests must not see. Session-scoped so that test_steering.py,
    test_steering_management.py and test_steering_readout.py share one."""
    from tests import steering_helpers

    own = steering_helpers.steer_stack(tmp_path_factory.mktemp("steer"))
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture
def clean(steer):
    """Each steering test starts from no steering at all, with the layer-1 SAE
    attached, on `steer`. (test_monitoring.py's own `clean`, on its own stack,
    overrides this one there.)"""
    from tests import steering_helpers

    steering_helpers.reset(steer)
    yield steer
    steering_helpers.reset(steer)


@pytest.fixture(scope="module")
def pg():
    """A throwaway PostgreSQL cluster of the module's own (tests/postgres.py)."""
    from tests.postgres import PostgresCluster

    cluster = PostgresCluster()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def channel(stack):
    with grpc.insecure_channel(stack.grpc_target) as ch:
        yield ch


@pytest.fixture(scope="session")
def generation_stub(channel):
    return generation_service_pb2_grpc.GenerationServiceStub(channel)


@pytest.fixture(scope="session")
def scoring_stub(channel):
    return scoring_service_pb2_grpc.ScoringServiceStub(channel)


@pytest.fixture(scope="session")
def embedding_stub(channel):
    return embedding_service_pb2_grpc.EmbeddingServiceStub(channel)


@pytest.fixture(scope="session")
def model_stub(channel):
    return model_service_pb2_grpc.ModelServiceStub(channel)


@pytest.fixture(scope="session")
def server_stub(channel):
    return server_service_pb2_grpc.ServerServiceStub(channel)


@pytest.fixture(scope="session")
def client(stack):
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0,
                         timeout=60)


@pytest.fixture
def async_client(stack):
    return openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0,
                              timeout=60)


def inference_status(server_stub, timeout: float | None = None
                     ) -> server_service_pb2.GetInferenceStatusResponse:
    return server_stub.GetInferenceStatus(server_service_pb2.GetInferenceStatusRequest(),
                                          timeout=timeout)


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()
