"""A thin, typed client for the miLLM engine's gRPC API (millm.v1).

    from millm.client import Client

    with Client("127.0.0.1:50051", api_key="...") as client:
        for delta in client.chat([{"role": "user", "content": "Hello!"}], max_tokens=16):
            print(delta.text, end="")

`AsyncClient` has the same methods as coroutines and async iterators. Every
call takes `timeout` (seconds, a gRPC deadline) and `request_id`; a refusal
raises MillmError carrying the OpenAI error code from google.rpc.ErrorInfo.
Needs grpcio and protobuf only.

Tools (see millm.tools for the accepted shapes): pass `tools`, `tool_choice`
and `parallel_tool_calls` to chat(); each Delta carries its ToolCallFragments,
and Generation.add() folds a stream's deltas into texts and whole ToolCalls:

    result = Generation()
    for delta in client.chat(messages, tools=[weather], tool_choice="auto"):
        result.add(delta)
    if result.finish_reasons[0] == "tool_calls":
        call = result.tool_calls[0][0]   # ToolCall(id, name, arguments)

The model's tokenizer: tokenize() gives the ids a generation of a prompt or a
conversation would use (count, max_model_len, token_strs), detokenize() text
back; sampling keywords take logit_bias={token_id: bias}. The requests are
built by millm.requests (chat_request and prompt_request are re-exported here).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field

import grpc
from google.rpc import error_details_pb2, status_pb2

from millm.requests import chat_request, prompt_pb, prompt_request, tokenize_request

__all__ = ["AsyncClient", "Client", "Delta", "Generation", "MillmError", "chat_request",
           "prompt_request"]
from millm.tools import ToolCall, ToolCallFragment, fold_tool_calls, fragments
from millm.v1 import (
    batch_service_pb2_grpc,
    embedding_service_pb2,
    embedding_service_pb2_grpc,
    generation_pb2,
    generation_service_pb2,
    generation_service_pb2_grpc,
    model_service_pb2,
    model_service_pb2_grpc,
    monitoring_service_pb2_grpc,
    ranking_service_pb2_grpc,
    response_service_pb2_grpc,
    scoring_service_pb2,
    scoring_service_pb2_grpc,
    server_service_pb2,
    server_service_pb2_grpc,
    steering_service_pb2_grpc,
    tokenization_service_pb2,
    tokenization_service_pb2_grpc,
)

_FINISH = {generation_pb2.FINISH_REASON_STOP: "stop",
           generation_pb2.FINISH_REASON_LENGTH: "length",
           generation_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls"}


class MillmError(Exception):
    """A refused or failed call: `code` is the OpenAI error code (ErrorInfo.reason)."""

    def __init__(self, status: grpc.StatusCode, message: str, code: str | None,
                 param: str | None, http_status: int | None):
        super().__init__(f"{code or status.name}: {message}")
        self.status, self.message, self.code = status, message, code
        self.param, self.http_status = param, http_status


def _error(exc: grpc.RpcError) -> MillmError:
    info = None
    for key, value in exc.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
    http = info.metadata.get("http_status") if info else None
    return MillmError(exc.code(), exc.details() or "", info.reason if info else None,
                      info.metadata.get("param") if info else None,
                      int(http) if http and http.isdigit() else None)


@dataclass(frozen=True)
class Delta:
    """New output of one choice; `tool_calls` are fragments (see Generation.add)."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    tool_calls: tuple[ToolCallFragment, ...] = ()


@dataclass
class Generation:
    """A whole generation (complete()), or a stream's deltas folded with add():
    per choice index its text, finish reason and tool calls."""

    id: str = ""
    model: str = ""
    texts: dict[int, str] = field(default_factory=dict)
    finish_reasons: dict[int, str] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: dict[int, list[ToolCall]] = field(default_factory=dict)

    def add(self, delta: Delta) -> None:
        self.texts[delta.index] = self.texts.get(delta.index, "") + delta.text
        if delta.tool_calls:
            self.tool_calls[delta.index] = fold_tool_calls(
                self.tool_calls.get(delta.index, ()), delta.tool_calls)
        if delta.finish_reason:
            self.finish_reasons[delta.index] = delta.finish_reason


def _metadata(api_key: str | None, request_id: str | None) -> tuple:
    out = []
    if api_key:
        out.append(("authorization", f"Bearer {api_key}"))
    if request_id:
        out.append(("x-request-id", request_id))
    return tuple(out)


def _deltas(response) -> Iterator[Delta]:
    for d in response.choices:
        yield Delta(d.index, d.text, tuple(d.token_ids), _FINISH.get(d.finish_reason),
                    fragments(d))


def _fold(result: Generation, response) -> None:
    if response.HasField("metadata"):
        result.id, result.model = response.metadata.id, response.metadata.model
    for d in _deltas(response):
        result.add(d)
    if response.HasField("usage"):
        result.prompt_tokens = response.usage.prompt_tokens
        result.completion_tokens = response.usage.completion_tokens


class _Stubs:
    def __init__(self, channel, model: str, api_key: str | None, timeout: float):
        self.channel, self.model, self.api_key, self.timeout = channel, model, api_key, timeout
        self.generation = generation_service_pb2_grpc.GenerationServiceStub(channel)
        self.scoring = scoring_service_pb2_grpc.ScoringServiceStub(channel)
        self.embeddings = embedding_service_pb2_grpc.EmbeddingServiceStub(channel)
        self.models = model_service_pb2_grpc.ModelServiceStub(channel)
        self.server = server_service_pb2_grpc.ServerServiceStub(channel)
        self.steering = steering_service_pb2_grpc.SteeringServiceStub(channel)
        self.responses = response_service_pb2_grpc.ResponseServiceStub(channel)
        self.monitoring = monitoring_service_pb2_grpc.MonitoringServiceStub(channel)
        self.tokenization = tokenization_service_pb2_grpc.TokenizationServiceStub(channel)
        self.ranking = ranking_service_pb2_grpc.RankingServiceStub(channel)
        self.batches = batch_service_pb2_grpc.BatchServiceStub(channel)

    def options(self, timeout, request_id) -> dict:
        return {"timeout": self.timeout if timeout is None else timeout,
                "metadata": _metadata(self.api_key, request_id)}

    def embed_request(self, inputs) -> embedding_service_pb2.EmbedRequest:
        items = [inputs] if isinstance(inputs, str) else inputs
        return embedding_service_pb2.EmbedRequest(model=self.model,
                                                  inputs=[prompt_pb(p) for p in items])

    def score_request(self, prompt, allowed_token_ids, top_logprobs, temperature):
        request = scoring_service_pb2.ScoreRequest(
            model=self.model, prompt=generation_pb2.PromptInput(prompts=[prompt_pb(prompt)]),
            allowed_token_ids=allowed_token_ids or (), top_logprobs=top_logprobs)
        if temperature is not None:
            request.temperature = temperature
        return request


class Client(_Stubs):
    """Blocking client. `target` is host:port; pass `credentials` for TLS."""

    def __init__(self, target: str, *, model: str = "millm-tiny", api_key: str | None = None,
                 timeout: float = 120.0, credentials: grpc.ChannelCredentials | None = None,
                 options: list[tuple[str, object]] | None = None):
        channel = (grpc.secure_channel(target, credentials, options=options) if credentials
                   else grpc.insecure_channel(target, options=options))
        super().__init__(channel, model, api_key, timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def stream(self, request: generation_service_pb2.GenerateRequest, *, timeout=None,
               request_id=None) -> Iterator[Delta]:
        """Deltas of a prepared GenerateRequest, as they come."""
        try:
            for response in self.generation.Generate(request, **self.options(timeout,
                                                                             request_id)):
                yield from _deltas(response)
        except grpc.RpcError as exc:
            raise _error(exc) from None

    def chat(self, messages: Iterable[dict], *, tools=None, tool_choice=None,
             parallel_tool_calls: bool | None = None, timeout=None, request_id=None,
             **sampling) -> Iterator[Delta]:
        request = chat_request(self.model, messages, tools=tools, tool_choice=tool_choice,
                               parallel_tool_calls=parallel_tool_calls, **sampling)
        return self.stream(request, timeout=timeout, request_id=request_id)

    def complete(self, prompts: Iterable[str | list[int]], *, timeout=None, request_id=None,
                 **sampling) -> Generation:
        result = Generation()
        try:
            for response in self.generation.Generate(prompt_request(self.model, prompts,
                                                                    **sampling),
                                                     **self.options(timeout, request_id)):
                _fold(result, response)
        except grpc.RpcError as exc:
            raise _error(exc) from None
        return result

    def score(self, prompt: str | list[int], *, allowed_token_ids=None, top_logprobs: int = 0,
              temperature: float | None = None, timeout=None, request_id=None):
        try:
            return self.scoring.Score(self.score_request(prompt, allowed_token_ids, top_logprobs,
                                                         temperature),
                                      **self.options(timeout, request_id))
        except grpc.RpcError as exc:
            raise _error(exc) from None

    def embed(self, inputs, *, timeout=None, request_id=None) -> list[list[float]]:
        try:
            reply = self.embeddings.Embed(self.embed_request(inputs),
                                          **self.options(timeout, request_id))
        except grpc.RpcError as exc:
            raise _error(exc) from None
        return [list(e.values) for e in reply.embeddings]

    def tokenize(self, text_or_messages: str | Iterable[dict], *, tools=None, timeout=None,
                 request_id=None, **options) -> tokenization_service_pb2.TokenizeResponse:
        """The ids a generation of this prompt or conversation would feed the
        model (`tokens`, `count`, `max_model_len`; `token_strs` with
        return_token_strs=True). Options: add_generation_prompt,
        continue_final_message, add_special_tokens, parse_special_tokens."""
        try:
            return self.tokenization.Tokenize(tokenize_request(self.model, text_or_messages, tools,
                                                                    **options),
                                              **self.options(timeout, request_id))
        except grpc.RpcError as exc:
            raise _error(exc) from None

    def detokenize(self, tokens: Iterable[int], *, timeout=None, request_id=None) -> str:
        try:
            return self.tokenization.Detokenize(tokenization_service_pb2.DetokenizeRequest(
                model=self.model, tokens=tokens), **self.options(timeout, request_id)).prompt
        except grpc.RpcError as exc:
            raise _error(exc) from None

    def list_models(self, *, timeout=None) -> list[str]:
        try:
            reply = self.models.ListModels(model_service_pb2.ListModelsRequest(),
                                           **self.options(timeout, None))
        except grpc.RpcError as exc:
            raise _error(exc) from None
        return [m.id for m in reply.models]

    def load_model(self, model_id: str, *, timeout=None):
        """Make the model the loaded one (admin key); returns its millm.v1.Model."""
        try:
            reply = self.models.LoadModel(model_service_pb2.LoadModelRequest(id=model_id),
                                          **self.options(timeout, None))
        except grpc.RpcError as exc:
            raise _error(exc) from None
        return reply.model

    def unload_model(self, model_id: str, *, timeout=None):
        """Unload the loaded model (admin key); returns its millm.v1.Model."""
        try:
            reply = self.models.UnloadModel(model_service_pb2.UnloadModelRequest(id=model_id),
                                            **self.options(timeout, None))
        except grpc.RpcError as exc:
            raise _error(exc) from None
        return reply.model

    def capabilities(self, *, timeout=None) -> server_service_pb2.GetCapabilitiesResponse:
        try:
            return self.server.GetCapabilities(server_service_pb2.GetCapabilitiesRequest(),
                                               **self.options(timeout, None))
        except grpc.RpcError as exc:
            raise _error(exc) from None


class AsyncClient(_Stubs):
    """The same calls for asyncio. `options` are gRPC channel options (a service
    config for load balancing, say); the stubs are public for raw calls."""

    def __init__(self, target: str, *, model: str = "millm-tiny", api_key: str | None = None,
                 timeout: float = 120.0, credentials: grpc.ChannelCredentials | None = None,
                 options: list[tuple[str, object]] | None = None):
        channel = (grpc.aio.secure_channel(target, credentials, options=options) if credentials
                   else grpc.aio.insecure_channel(target, options=options))
        super().__init__(channel, model, api_key, timeout)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    async def stream(self, request: generation_service_pb2.GenerateRequest, *, timeout=None,
                     request_id=None) -> AsyncIterator[Delta]:
        try:
            async for response in self.generation.Generate(request,
                                                           **self.options(timeout,
                                                                          request_id)):
                for delta in _deltas(response):
                    yield delta
        except grpc.RpcError as exc:
            raise _error(exc) from None

    def chat(self, messages: Iterable[dict], *, tools=None, tool_choice=None,
             parallel_tool_calls: bool | None = None, timeout=None, request_id=None,
             **sampling) -> AsyncIterator[Delta]:
        request = chat_request(self.model, messages, tools=tools, tool_choice=tool_choice,
                               parallel_tool_calls=parallel_tool_calls, **sampling)
        return self.stream(request, timeout=timeout, request_id=request_id)

    async def score(self, prompt: str | list[int], *, allowed_token_ids=None,
                    top_logprobs: int = 0, temperature: float | None = None, timeout=None,
                    request_id=None):
        try:
            return await self.scoring.Score(
                self.score_request(prompt, allowed_token_ids, top_logprobs, temperature),
                **self.options(timeout, request_id))
        except grpc.RpcError as exc:
            raise _error(exc) from None

    async def embed(self, inputs, *, timeout=None, request_id=None) -> list[list[float]]:
        try:
            reply = await self.embeddings.Embed(self.embed_request(inputs),
                                                **self.options(timeout, request_id))
        except grpc.RpcError as exc:
            raise _error(exc) from None
        return [list(e.values) for e in reply.embeddings]

    async def tokenize(self, text_or_messages: str | Iterable[dict], *, tools=None,
                       timeout=None, request_id=None, **options
                       ) -> tokenization_service_pb2.TokenizeResponse:
        try:
            return await self.tokenization.Tokenize(
                tokenize_request(self.model, text_or_messages, tools, **options),
                **self.options(timeout, request_id))
        except grpc.RpcError as exc:
            raise _error(exc) from None

    async def detokenize(self, tokens: Iterable[int], *, timeout=None, request_id=None) -> str:
        try:
            reply = await self.tokenization.Detokenize(tokenization_service_pb2.DetokenizeRequest(
                model=self.model, tokens=tokens), **self.options(timeout, request_id))
        except grpc.RpcError as exc:
            raise _error(exc) from None
        return reply.prompt
