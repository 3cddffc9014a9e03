"""Long reads interleave (engines/model_thread.py): a 2,048-input embeddings
call or a many-prompt scoring call runs one chunk per turn of the model thread,
between decode steps, so a running stream keeps receiving tokens while it runs;
a caller that leaves (gRPC cancel or deadline, HTTP disconnect) stops the read
at its next chunk, as the engine's log says."""

from __future__ import annotations

import concurrent.futures
import json
import time

import grpc

from millm.v1 import embedding_service_pb2, generation_pb2
from tests.conftest import MODEL, wait_until
from tests.grpc_helpers import prompt_request
from tests.http_helpers import open_stream, post

WORDS = "the river ran past the old mill and down into the valley where the town slept"


def _embed_request(count: int) -> embedding_service_pb2.EmbedRequest:
    return embedding_service_pb2.EmbedRequest(model=MODEL, inputs=[
        generation_pb2.Prompt(text=f"{i} {WORDS} {i}") for i in range(count)])


def _cancellations(stack) -> int:
    return stack.engine.log().count("a read was cancelled by its caller")


def test_a_stream_keeps_flowing_while_a_large_embeddings_call_runs(channel, generation_stub):
    from millm.v1 import embedding_service_pb2_grpc

    embedder = embedding_service_pb2_grpc.EmbeddingServiceStub(channel)
    arrivals: list[float] = []
    stream = generation_stub.Generate(prompt_request("The river ran", max_tokens=900,
                                                     temperature=0, ignore_eos=True),
                                      timeout=120)

    def read_stream():
        for response in stream:
            if response.choices:
                arrivals.append(time.monotonic())

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reader = pool.submit(read_stream)
        assert wait_until(lambda: len(arrivals) >= 3)
        started = time.monotonic()
        reply = embedder.Embed(_embed_request(2048), timeout=120)
        ended = time.monotonic()
        stream.cancel()
        reader.exception()
    assert len(reply.embeddings) == 2048
    during = [t for t in arrivals if started <= t <= ended]
    # Tokens kept arriving all through the read, never stalled for its length.
    assert len(during) >= 5, (len(during), ended - started)
    gaps = [b - a for a, b in zip([started, *during], [*during, ended], strict=True)]
    assert max(gaps) < (ended - started) / 3, (max(gaps), ended - started)


GIVE_UP_AT = (0.6, 0.8, 0.9)  # shares of a whole read's time


def test_a_read_whose_caller_gives_up_stops_at_its_next_chunk(stack, channel):
    from millm.v1 import embedding_service_pb2_grpc

    embedder = embedding_service_pb2_grpc.EmbeddingServiceStub(channel)
    request = _embed_request(2048)
    started = time.monotonic()
    embedder.Embed(request, timeout=120)
    whole = time.monotonic() - started
    # Give up past its tokenizing, before its end (the whole call timed just
    # now); on a loaded machine tokenizing may take longer, so later tries
    # give up later.
    for share in GIVE_UP_AT:
        before = _cancellations(stack)
        try:
            embedder.Embed(request, timeout=whole * share)
            continue  # it finished first: nothing to stop
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        if wait_until(lambda b=before: _cancellations(stack) > b, timeout=whole + 5):
            break
    else:
        raise AssertionError("no read was stopped part-way")


def test_an_http_client_that_leaves_stops_its_embeddings_read(stack):
    body = {"model": MODEL, "input": [f"{i} {WORDS} {i}" for i in range(2048)]}
    started = time.monotonic()
    assert post(stack.http_port, "/v1/embeddings", body)[0].status == 200
    whole = time.monotonic() - started
    for share in GIVE_UP_AT:  # past its tokenizing, before its end (as above)
        before = _cancellations(stack)
        sock = open_stream(stack.http_port, "/v1/embeddings", body)
        time.sleep(whole * share)
        sock.close()
        if wait_until(lambda b=before: _cancellations(stack) > b, timeout=whole + 5):
            break
    else:
        raise AssertionError("no read was stopped part-way")
    # The log names no client text, only how far the read got.
    line = [ln for ln in stack.engine.log().splitlines() if "a read was cancelled" in ln][-1]
    assert WORDS not in line and json.dumps(body)[:40] not in line
