"""Building GenerateRequests, running them (alone or several at once) and
reading ErrorInfo from gRPC errors in tests."""

from __future__ import annotations

import asyncio
import concurrent.futures
import statistics
import threading
import time

import grpc
from google.rpc import error_details_pb2, status_pb2

from millm.v1 import (
    generation_pb2,
    generation_service_pb2,
    generation_service_pb2_grpc,
    server_service_pb2,
)

MODEL = "millm-tiny"


def chat_request(content: str = "Hello!", model: str = MODEL, **sampling):
    stop = sampling.pop("stop", ())
    return generation_service_pb2.GenerateRequest(
        model=model,
        chat=generation_pb2.ChatInput(
            messages=[generation_pb2.ChatMessage(role=generation_pb2.ROLE_USER, content=content)]
        ),
        sampling=generation_pb2.SamplingParams(stop=stop, **sampling),
    )


def prompt_request(*prompts, model: str = MODEL, priority: int | None = None, **sampling):
    stop = sampling.pop("stop", ())
    return generation_service_pb2.GenerateRequest(
        model=model,
        priority=priority,
        prompt=generation_pb2.PromptInput(
            prompts=[
                generation_pb2.Prompt(text=p)
                if isinstance(p, str)
                else generation_pb2.Prompt(token_ids=generation_pb2.TokenIds(ids=p))
                for p in prompts
            ]
        ),
        sampling=generation_pb2.SamplingParams(stop=stop, **sampling),
    )


def error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    for key, value in error.trailing_metadata():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            info = error_details_pb2.ErrorInfo()
            assert status.details[0].Unpack(info)
            return info
    raise AssertionError(f"no ErrorInfo on {error!r}")


def run(stub, request):
    """Collect a whole Generate stream: (metadata, {index: text}, {index: tokens},
    {index: finish_reason}, usage, responses)."""
    responses = list(stub.Generate(request, timeout=60))
    texts, tokens, finish = {}, {}, {}
    for r in responses[1:]:
        for d in r.choices:
            texts[d.index] = texts.get(d.index, "") + d.text
            tokens.setdefault(d.index, []).extend(d.token_ids)
            if d.finish_reason:
                finish[d.index] = d.finish_reason
    return responses[0].metadata, texts, tokens, finish, responses[-1].usage, responses


class MaxRunningRows:
    """Polls an engine's GetInferenceStatus while a block runs: `value` is the
    most rows it saw running together, to prove requests really overlapped,
    and `lanes` the most lanes (batches decoded apart) it saw at once."""

    def __init__(self, server_stub):
        self.server_stub, self.value, self._stop = server_stub, 0, threading.Event()
        self.lanes = 0

    def __enter__(self):
        request = server_service_pb2.GetInferenceStatusRequest()

        def poll():
            while not self._stop.is_set():
                reply = self.server_stub.GetInferenceStatus(request)
                self.value = max(self.value, reply.running_rows)
                self.lanes = max(self.lanes, reply.lanes)
        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def concurrently(stub, requests, stagger: float = 0.02, tokens: bool = False) -> list[dict]:
    """Run `requests` at once, the i-th after i * stagger seconds (so that they
    are admitted at different steps): each one's {index: text}, or with
    tokens=True its {index: token ids}."""
    def go(i_request):
        i, request = i_request
        threading.Event().wait(i * stagger)
        return run(stub, request)[2 if tokens else 1]

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(go, enumerate(requests)))


async def timed_generate(stub, request) -> tuple[float | None, int]:
    """Stream one generation on an aio stub: (seconds to the first choice delta,
    completion tokens from usage). The benches' one way to time a request."""
    started = time.perf_counter()
    first, produced = None, 0
    async for response in stub.Generate(request, timeout=600):
        if response.choices and first is None:
            first = time.perf_counter() - started
        if response.HasField("usage"):
            produced = response.usage.completion_tokens
    return first, produced


async def closed_loop(target: str, clients: int, requests: int, make_request,
                      warmup=None) -> dict:
    """`clients` closed-loop clients on one aio channel, each sending `requests`
    generations one after another (make_request(client, n) builds each), after
    one warm-up request (`warmup`, or a short chat to the demo model): tokens
    per second over the wall time, the tokens generated, and the median time to
    the first token in ms over the requests that produced one (nan when none
    did). The benches' one load loop."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
        await timed_generate(stub, warmup or chat_request("Hi", max_tokens=4))
        samples: list[tuple[float | None, int]] = []

        async def client(c: int):
            for n in range(requests):
                first, produced = await timed_generate(stub, make_request(c, n))
                samples.append((first, produced))

        started = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        wall = time.perf_counter() - started
    firsts = [s[0] for s in samples if s[0] is not None]
    return {"tok_s": sum(s[1] for s in samples) / wall, "tokens": sum(s[1] for s in samples),
            "p50": statistics.median(firsts) * 1000 if firsts else float("nan")}
