"""Bridge fixes checked against a real engine (and the session stack's bridge):
a replica DNS drops keeps its running calls, query integers and huge body
numbers are 400s, bounded error messages, and the helpers behind them."""

from __future__ import annotations

import asyncio
import json
import time

import grpc

from millm.v1 import (
    embedding_service_pb2,
    generation_pb2,
    generation_service_pb2,
    server_service_pb2,
)
from millm.v1 import response_service_pb2 as rpb
from rest_bridge.engine_client import EngineClient
from rest_bridge.errors import OpenAIError
from rest_bridge.routing.prefix import HASHED_CHARS, MAX_BLOCKS, block_hashes, prompt_text
from rest_bridge.routing.router import Router, dns_name
from rest_bridge.serving.responses_output import OutputBuilder
from tests import harness
from tests.conftest import MODEL
from tests.grpc_helpers import chat_request, prompt_request
from tests.http_helpers import call, post, request


def test_a_replica_dropped_from_dns_finishes_its_running_calls(stack):
    async def run() -> tuple[int, generation_pb2.FinishReason, bool, bool]:
        router = Router((stack.grpc_target,))
        router.start()
        try:
            replica = router.replicas[stack.grpc_target]
            call = replica.client.generation.Generate(
                chat_request("Tell me a story.", max_tokens=48, ignore_eos=True,
                             temperature=0.0), timeout=60)
            first = await call.read()
            assert first.HasField("metadata")
            router._drop(stack.grpc_target)  # what a re-resolution without it does
            gone = stack.grpc_target not in router.replicas
            tokens, finish = 0, None
            while (message := await call.read()) is not grpc.aio.EOF:
                for choice in message.choices:
                    tokens += len(choice.token_ids)
                    if choice.finish_reason:
                        finish = choice.finish_reason
            assert await call.code() == grpc.StatusCode.OK
            for _ in range(100):  # the channel closes once its calls ended
                if not router._draining:
                    break
                await asyncio.sleep(0.05)
            return tokens, finish, gone, not router._draining
        finally:
            await router.close()

    tokens, finish, gone, closed = asyncio.run(run())
    assert gone and closed
    assert tokens == 48
    assert finish == generation_pb2.FINISH_REASON_LENGTH


def test_a_replica_dropped_before_its_load_stream_started_closes_at_once(stack):
    """The load stream's task cancelled before grpc's own send task ran
    leaves no call holding the channel open for the grace period."""
    async def run() -> list[bool]:
        closed = []
        for delay in (0, 0, 0.01):
            router = Router((stack.grpc_target,))
            router.start()
            try:
                await asyncio.sleep(delay)
                router._drop(stack.grpc_target)
                for _ in range(40):
                    if not router._draining:
                        break
                    await asyncio.sleep(0.05)
                closed.append(not router._draining)
            finally:
                await router.close()
        return closed

    assert asyncio.run(run()) == [True, True, True]


def test_router_close_ends_a_draining_replica_at_once(stack):
    async def run() -> grpc.StatusCode:
        router = Router((stack.grpc_target,))
        router.start()
        replica = router.replicas[stack.grpc_target]
        call = replica.client.generation.Generate(
            chat_request("Tell me a story.", max_tokens=900, ignore_eos=True), timeout=60)
        await call.read()
        router._drop(stack.grpc_target)
        await router.close()  # shutdown does not wait for the grace period
        return await asyncio.wait_for(call.code(), 5)

    assert asyncio.run(run()) == grpc.StatusCode.CANCELLED


def test_a_dns_name_without_a_port_gets_grpcs_default():
    assert dns_name("dns:///engines") == ("engines", 443)
    assert dns_name("dns://8.8.8.8/engines.svc") == ("engines.svc", 443)
    assert dns_name("dns:///engines:50051") == ("engines", 50051)
    assert dns_name("dns:///[::1]:7000") == ("::1", 7000)
    assert dns_name("dns:///[::1]") == ("::1", 443)
    assert dns_name("dns:///::1") == ("::1", 443)
    assert dns_name("127.0.0.1:50051") is None


def test_query_integers_are_checked_alike_on_every_route(stack):
    paths = ("/v1/responses/resp_none/input_items?limit={}",
             "/api/saes/sae_millm-tiny-res-l1/features?limit={}")
    for path in paths:
        for bad in ("--5", "%C2%B2", "1_0", "+5", "5.0", "9" * 30, ""):
            reply = call(stack.http_port, "GET", path.format(bad))
            assert reply.status_code == 400, (path, bad, reply.text)
            error = reply.json()["error"]
            assert (error["code"], error["param"]) == ("invalid_parameter", "limit"), error
    reply = call(stack.http_port, "GET",
                 "/api/saes/sae_millm-tiny-res-l1/features?limit=2&offset=x")
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "offset"
    # A well-formed integer gets through to the engine (an unknown id: 404).
    for good in ("5", "-5"):
        reply = call(stack.http_port, "GET", paths[0].format(good))
        assert reply.status_code == 404, reply.text
        assert reply.json()["error"]["code"] == "response_not_found"


def test_a_huge_integer_in_an_unknown_field_is_a_400(stack):
    huge = "9" * 400  # no double holds it
    for path, body in (
        ("/v1/chat/completions",
         '{"model": "millm-tiny", "messages": [{"role": "user", "content": "Hi"}], '
         '"foo": HUGE}'),
        ("/v1/embeddings", '{"model": "millm-tiny", "input": "Hi", "bar": [1, {"x": HUGE}]}'),
        ("/v1/responses", '{"model": "millm-tiny", "input": "Hi", "baz": HUGE}'),
    ):
        body = body.replace("HUGE", huge)
        reply = call(stack.http_port, "POST", path, raw=body.encode())
        assert reply.status_code == 400, (path, reply.text)
        error = reply.json()["error"]
        assert error["code"] == "invalid_parameter", error
        assert error["param"] in ("foo", "bar", "baz"), error


def test_an_embed_routed_to_a_lost_engine_is_sent_to_another(stack):
    dead = f"127.0.0.1:{harness.free_port()}"  # nothing listens: the engine is gone

    async def run():
        engine = EngineClient((stack.grpc_target, dead))
        try:
            live = engine.router.replicas[stack.grpc_target]
            for _ in range(200):
                if live.routable(time.monotonic()):
                    break
                await asyncio.sleep(0.05)
            # The lost replica still looks routable (its loss not yet seen) and
            # is the least loaded, so the router gives it the call first.
            lost = engine.router.replicas[dead]
            engine.router._tasks[dead].cancel()
            await asyncio.sleep(0)
            lost.report = server_service_pb2.WatchLoadResponse()
            lost.report.CopyFrom(live.report)
            lost.streaming, lost.seen_at = True, time.monotonic()
            live.in_flight = 5
            retries = []
            request = embedding_service_pb2.EmbedRequest(
                model=MODEL, inputs=[generation_pb2.Prompt(text="hello")])
            reply = await engine.embed(request, timeout=30, on_retry=retries.append)
            return reply, retries, lost.routed, live.routed
        finally:
            await engine.close()

    reply, retries, lost_routed, live_routed = asyncio.run(run())
    assert len(reply.embeddings) == 1 and len(reply.embeddings[0].values) > 0
    assert retries == [1]
    assert sum(lost_routed.values()) == 1 and sum(live_routed.values()) == 1


def test_bridge_made_errors_are_bounded(stack):
    huge = "x" * 500_000
    reply = call(stack.http_port, "POST", "/v1/responses",
                 {"model": MODEL, "input": [{"type": huge, "content": "hi"}]})
    assert reply.status_code == 400, reply.text[:300]
    error = reply.json()["error"]
    assert len(error["message"].encode()) <= 1024, len(error["message"])
    assert error["message"].endswith("… (truncated)")
    assert len(reply.text) < 4096
    made = OpenAIError(400, "x" * 5000, param="p" * 5000)
    assert len(made.message.encode()) == 1024 and len(made.param.encode()) == 256
    made.param = "q" * 1000  # a relabel is bounded too
    assert len(made.param.encode()) == 256 and made.param.startswith("q")
    assert OpenAIError(400, "short", param="p").body()["error"]["message"] == "short"


def _metric(port: int, name: str, **labels) -> float:
    _, content = request(port, "GET", "/metrics")
    total = 0.0
    for line in content.decode().splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_failed_responses_stream_is_counted_as_a_stream_failure(stack):
    name = "millm_bridge_stream_failures_total"
    before = _metric(stack.http_port, name, code="invalid_parameter")
    # Generated, then refused by the store (too many metadata pairs): response.failed.
    metadata = {f"k{i}": "v" for i in range(100)}
    reply, content = post(stack.http_port, "/v1/responses",
                          {"model": MODEL, "input": "Hi", "stream": True, "max_output_tokens": 4,
                           "metadata": metadata})
    assert reply.status == 200
    last = content.decode().strip().split("\n\n")[-1]
    assert last.startswith("event: response.failed"), last[:300]
    assert json.loads(last.split("data: ", 1)[1])["response"]["error"]["code"] \
        == "invalid_parameter"
    assert _metric(stack.http_port, name, code="invalid_parameter") == before + 1


def _whole_text(request) -> str:
    """prompt_text as it was: every message, however long."""
    if request.WhichOneof("input") == "chat":
        parts = [request.model, "\x1d"]
        parts += [f"{t.name}\x1f{t.description}\x1f{t.parameters_json}\x1e" for t in request.tools]
        parts += [f"{m.role}\x1f{m.content}\x1e" for m in request.chat.messages]
        return "".join(parts)
    first = request.prompt.prompts[0]
    body = first.text if first.HasField("text") else ",".join(map(str, first.token_ids.ids))
    return f"{request.model}\x1d{body}"


def test_prompt_text_gathers_only_what_is_hashed():
    long_chat = chat_request("x" * 40_000)
    long_chat.chat.messages.extend(
        [generation_pb2.ChatMessage(role=generation_pb2.ROLE_ASSISTANT, content="y" * 30_000)] * 30)
    long_chat.tools.add(name="t", description="d" * 1000, parameters_json="{}")
    cases = [long_chat, chat_request("short"), chat_request("z" * (HASHED_CHARS - 20)),
             prompt_request("p" * 200_000), prompt_request(list(range(100_000))),
             prompt_request("short")]
    for case in cases:
        text, whole = prompt_text(case), _whole_text(case)
        assert len(text) <= HASHED_CHARS
        assert whole.startswith(text) and text == whole[:HASHED_CHARS]
        assert block_hashes(text) == block_hashes(whole)
    assert len(block_hashes(prompt_text(long_chat))) == MAX_BLOCKS


def test_the_responses_fold_joins_each_items_text_once_closed():
    response = rpb.StoredResponse(id="resp_x")
    builder = OutputBuilder(response)
    events = []
    for word in ["Hel", "lo", " wor", "ld"]:
        events += builder.feed(generation_service_pb2.GenerateResponse(
            choices=[generation_pb2.ChoiceDelta(text=word)]))
    assert [e for e in events if e[0] == "response.output_text.delta"][-1][1]["delta"] == "ld"
    calls = [generation_pb2.ToolCallDelta(index=0, id="call_a", name="f", arguments='{"a"'),
             generation_pb2.ToolCallDelta(index=1, id="call_b", name="g", arguments="{"),
             generation_pb2.ToolCallDelta(index=0, arguments=": 1}"),  # its item closed
             generation_pb2.ToolCallDelta(index=1, arguments="}")]
    for fragment in calls:
        events += builder.feed(generation_service_pb2.GenerateResponse(
            choices=[generation_pb2.ChoiceDelta(tool_calls=[fragment])]))
    events += builder.finish()
    done = {e[1]["item_id"]: e[1]["text"] for e in events if e[0] == "response.output_text.done"}
    assert list(done.values()) == ["Hello world"]
    assert response.output[0].message.content[0].text == "Hello world"
    assert [o.function_call.arguments_json for o in response.output[1:]] == ['{"a": 1}', "{}"]
    assert response.status == rpb.RESPONSE_STATUS_COMPLETED
