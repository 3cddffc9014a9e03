"""A caller that goes away stops its generation: observed on the engine's own
counters (GetInferenceStatus), not inferred from timing."""

from __future__ import annotations

import time

import grpc

from tests.conftest import MODEL, inference_status, wait_until
from tests.grpc_helpers import prompt_request
from tests.http_helpers import open_stream

LONG = {"model": MODEL, "prompt": "The river ran", "max_tokens": 1000, "temperature": 1.0,
        "ignore_eos": True}


def settled(server_stub):
    """Wait until nothing is running, and return the counters."""
    return wait_until(lambda: (s := inference_status(server_stub)).active_generations == 0
                      and s.queued_requests == 0 and s)


def assert_stopped_early(server_stub, before):
    after = settled(server_stub)
    assert after, "the generation kept running after the client left"
    assert after.cancelled_generations_total == before.cancelled_generations_total + 1
    assert after.completed_generations_total == before.completed_generations_total
    generated = after.generated_tokens_total - before.generated_tokens_total
    assert 0 < generated < LONG["max_tokens"]
    # Nothing more is generated once it has stopped.
    time.sleep(0.3)
    assert inference_status(server_stub).generated_tokens_total == after.generated_tokens_total


def test_streaming_client_disconnect_stops_generation(stack, server_stub):
    before = settled(server_stub)
    sock = open_stream(stack.http_port, "/v1/completions", {**LONG, "stream": True})
    received = b""
    while received.count(b"data: ") < 5:
        received += sock.recv(4096)
    assert inference_status(server_stub).active_generations == 1
    sock.close()
    assert_stopped_early(server_stub, before)


def test_non_streaming_client_disconnect_stops_generation(stack, server_stub):
    before = settled(server_stub)
    sock = open_stream(stack.http_port, "/v1/completions", LONG)
    assert wait_until(lambda: inference_status(server_stub).generated_tokens_total
                      > before.generated_tokens_total + 5)
    sock.close()
    assert_stopped_early(server_stub, before)


def test_grpc_cancel_stops_generation(generation_stub, server_stub):
    before = settled(server_stub)
    call = generation_stub.Generate(
        prompt_request("The river ran", max_tokens=1000, temperature=1.0, ignore_eos=True)
    )
    for i, _ in enumerate(call):
        if i == 5:
            break
    call.cancel()
    assert call.code() == grpc.StatusCode.CANCELLED
    assert_stopped_early(server_stub, before)


def test_a_compared_stream_stops_both_sides_when_the_client_leaves(stack, server_stub):
    """steering_compare runs two generations; a client that leaves ends both."""
    before = settled(server_stub)
    sock = open_stream(stack.http_port, "/v1/completions",
                       {**LONG, "stream": True, "steering_compare": True})
    received = b""
    while received.count(b"data: ") < 6:
        received += sock.recv(4096)
    assert inference_status(server_stub).active_generations == 2
    sock.close()
    after = settled(server_stub)
    assert after, "a side kept running after the client left"
    assert after.cancelled_generations_total == before.cancelled_generations_total + 2
    assert after.completed_generations_total == before.completed_generations_total
