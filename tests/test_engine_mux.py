"""GenerateMany, the bridge's one stream per engine (rest_bridge/engine_mux.py,
service/servicers/generation_mux.py), against the session's real engine: the
same replies and errors as Generate calls, many calls sharing frames, cancel
and deadline freeing the rows, and per-call fallback for an engine without it."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from millm.v1 import (
    generation_service_pb2,
    generation_service_pb2_grpc,
    server_service_pb2,
    server_service_pb2_grpc,
)
from rest_bridge.engine_client import _generate
from rest_bridge.engine_mux import Mux
from rest_bridge.errors import from_rpc_error
from tests.grpc_helpers import chat_request, error_info, prompt_request


async def _drain(call) -> tuple[list, grpc.StatusCode]:
    replies = []
    while (message := await call.read()) is not grpc.aio.EOF:
        replies.append(message)
    return replies, grpc.StatusCode.OK


def _comparable(replies: list) -> list:
    """Replies without what differs per call (ids, times) or with timing (how
    a stream's steps were split into messages): each choice's deltas joined."""
    out, choices = [], {}
    for reply in replies:
        reply = type(reply).FromString(reply.SerializeToString())
        if reply.HasField("metadata"):
            reply.metadata.ClearField("id")
            reply.metadata.ClearField("created")
        for d in reply.choices:
            joined = choices.setdefault(d.index, type(d)(index=d.index))
            joined.text += d.text
            joined.token_ids.extend(d.token_ids)
            joined.logprobs.extend(d.logprobs)
            if d.finish_reason:
                joined.finish_reason = d.finish_reason
        reply.ClearField("choices")
        if reply.ByteSize():
            out.append(reply.SerializeToString(deterministic=True))
    return out + [choices[i].SerializeToString(deterministic=True) for i in sorted(choices)]


def _requests():
    return [
        chat_request("Tell me a story.", max_tokens=12, temperature=0.0),
        chat_request("Hi", max_tokens=6, temperature=0.0, logprobs=2, n=2),
        prompt_request("Once upon a time", "The clock", max_tokens=5, temperature=0.0),
    ]


def test_replies_and_errors_equal_generate_calls(stack):
    async def run():
        async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
            stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
            mux = Mux(channel)
            try:
                for request in _requests():
                    for streamed in (True, False):
                        request.stream, request.coalesce = streamed, not streamed
                        direct, _ = await _drain(stub.Generate(request, timeout=60))
                        muxed, _ = await _drain(mux.start(request, (), 60, None))
                        assert _comparable(muxed) == _comparable(direct)
                errors = []
                for bad in (chat_request(model="no-such-model"),
                            chat_request(temperature=-1.0)):
                    pair = []
                    for call in (stub.Generate(bad, timeout=60), mux.start(bad, (), 60, None)):
                        with pytest.raises(grpc.aio.AioRpcError) as caught:
                            await _drain(call)
                        pair.append(caught.value)
                    errors.append(pair)
                return errors
            finally:
                await mux.close()

    for direct, muxed in asyncio.run(run()):
        assert muxed.code() == direct.code() != grpc.StatusCode.OK
        assert muxed.details() == direct.details()
        assert error_info(muxed) == error_info(direct)
        seen = [from_rpc_error(e) for e in (muxed, direct)]
        assert len({(e.status, e.message, e.type, e.param, e.code) for e in seen}) == 1


def test_concurrent_calls_share_frames(stack):
    async def run():
        async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
            mux = Mux(channel)
            try:
                calls = [mux.start(chat_request(f"Story {i}.", max_tokens=24, ignore_eos=True,
                                                temperature=0.0, n=1), (), 60, None)
                         for i in range(8)]
                for call in calls:
                    call.add_done_callback(lambda c: done.append(c.id))
                results = await asyncio.gather(*(_drain(c) for c in calls))
                return results, mux.frames, mux.events, mux.in_flight
            finally:
                await mux.close()

    done: list[int] = []
    results, frames, events, left = asyncio.run(run())
    for replies, _ in results:
        assert sum(len(d.token_ids) for r in replies for d in r.choices) == 24
    assert sorted(done) == list(range(1, 9)) and left == 0
    assert frames < events  # replies of one step travel together


async def _idle(channel) -> bool:
    """The engine runs and queues nothing (a cancelled row's lease is back)."""
    server = server_service_pb2_grpc.ServerServiceStub(channel)
    for _ in range(100):
        stream = server.WatchLoad(server_service_pb2.WatchLoadRequest(interval_ms=0))
        report = await stream.read()
        stream.cancel()
        if report.running_requests == 0 and report.waiting_requests == 0:
            return True
        await asyncio.sleep(0.05)
    return False


def test_cancel_and_deadline_end_the_call_and_free_the_row(stack):
    async def run():
        async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
            mux = Mux(channel)
            try:
                long = chat_request("Tell me a story.", max_tokens=900, ignore_eos=True)
                long.stream = True
                call = mux.start(long, (), 60, None)
                await call.read()  # metadata
                await call.read()  # a token
                assert call.cancel() and call.cancelled() and not call.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await call.read()
                cancelled_idle = await _idle(channel)
                late = mux.start(long, (), 0.1, None)  # far less than 900 tokens take
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await _drain(late)
                late_idle = await _idle(channel)
                after, _ = await _drain(mux.start(chat_request(max_tokens=3), (), 60, None))
                return cancelled_idle, caught.value.code(), late_idle, len(after)
            finally:
                await mux.close()

    cancelled_idle, code, late_idle, replies = asyncio.run(run())
    assert cancelled_idle and late_idle
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert replies >= 2


def _old_engine(stub):
    """An engine of before GenerateMany: Generate only, passed on to the real one."""

    async def generate(request, context):
        async for message in stub.Generate(request, timeout=60):
            yield message

    return grpc.method_handlers_generic_handler("millm.v1.GenerationService", {
        "Generate": grpc.unary_stream_rpc_method_handler(
            generate, request_deserializer=generation_service_pb2.GenerateRequest.FromString,
            response_serializer=generation_service_pb2.GenerateResponse.SerializeToString)})


def test_an_engine_without_the_stream_gets_a_call_a_request(stack):
    async def run():
        async with grpc.aio.insecure_channel(stack.grpc_target) as real:
            server = grpc.aio.server()
            server.add_generic_rpc_handlers((_old_engine(
                generation_service_pb2_grpc.GenerationServiceStub(real)),))
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as old:
                    stub = generation_service_pb2_grpc.GenerationServiceStub(old)
                    mux = Mux(old)
                    request = chat_request("Hi", max_tokens=4, temperature=0.0)
                    first = [_generate(mux, stub, request, timeout=60) for _ in range(2)]
                    results = [await _drain(c) for c in first]
                    then = _generate(mux, stub, request, timeout=60)
                    results.append(await _drain(then))
                    await mux.close()
                    return results, mux.unsupported, type(then).__name__
            finally:
                await server.stop(None)

    results, unsupported, later = asyncio.run(run())
    assert unsupported and later != "MuxCall"
    texts = [_comparable(replies)[1:] for replies, _ in results]
    assert texts[0] == texts[1] == texts[2] and len(texts[0]) >= 2


def test_a_reader_that_stops_reading_is_cancelled_and_its_rows_freed(stack):
    async def run():
        async with grpc.aio.insecure_channel(stack.grpc_target) as channel:
            # Far less than 900 tokens take on any CPU: the stall comes first.
            mux = Mux(channel, stall_s=0.05)
            try:
                long = chat_request("Tell me a story.", max_tokens=900, ignore_eos=True)
                long.stream = True
                call = mux.start(long, (), 60, None)
                await call.read()  # the metadata; then nothing is read for a while
                for _ in range(100):
                    if call.done():
                        break
                    await asyncio.sleep(0.05)
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    while True:
                        await call.read()
                return caught.value, await _idle(channel)
            finally:
                await mux.close()

    error, idle = asyncio.run(run())
    assert error.code() == grpc.StatusCode.CANCELLED and "took nothing" in error.details()
    assert idle


def test_a_broken_stream_fails_its_calls_as_lost_calls_and_the_next_opens_anew(tmp_path):
    """An engine killed mid-generation: every call on its stream ends as a
    lost Generate call would (UNAVAILABLE, no ErrorInfo: failover may send it
    on), and a call after the engine is back opens a new stream."""
    from rest_bridge.errors import engine_lost
    from tests.harness import start_engine, wait_serving

    engine, port = start_engine(tmp_path)
    try:
        wait_serving(engine, port)

        async def run():
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                mux = Mux(channel)
                try:
                    long = chat_request("Tell me a story.", max_tokens=900, ignore_eos=True)
                    long.stream = True
                    calls = [mux.start(long, (), 120, None) for _ in range(3)]
                    for call in calls:
                        await call.read()  # the metadata
                    engine.proc.kill()
                    engine.proc.wait()
                    errors = []
                    for call in calls:
                        with pytest.raises(grpc.aio.AioRpcError) as caught:
                            while True:
                                await call.read()
                        errors.append(caught.value)
                    again, _ = start_engine(tmp_path, MILLM_GRPC_PORT=str(port))
                    try:
                        replies = []
                        for _ in range(600):  # until it serves: each try a new stream
                            try:
                                replies, _ = await _drain(mux.start(
                                    chat_request(max_tokens=3), (), 60, None))
                                break
                            except grpc.aio.AioRpcError as exc:
                                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                                await asyncio.sleep(0.1)
                    finally:
                        again.stop()
                    return errors, replies
                finally:
                    await mux.close()

        errors, replies = asyncio.run(run())
        assert all(e.code() == grpc.StatusCode.UNAVAILABLE and engine_lost(e) for e in errors)
        assert replies and replies[0].HasField("metadata")
    finally:
        engine.stop()
