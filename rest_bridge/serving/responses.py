"""POST /v1/responses and the stored responses' routes.

A Responses API request is served by the engine's one generation path: the
earlier conversation of `previous_response_id` comes from ResponseService,
the request becomes a GenerateRequest (responses_input.py), the generation
stream is folded into output items (responses_output.py) and answered whole
or as typed events (responses_stream.py); like chat it survives losing an
engine before the first token (failover.GenerateCall). With `store` (the default)
the finished response and its input items go back to ResponseService, which
keeps them for the key that made them. GET, DELETE and input_items read
and change that store; nothing is held in the bridge.
"""

from __future__ import annotations

import grpc
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request

from millm.v1 import response_service_pb2 as rpb
from rest_bridge.access import call_metadata
from rest_bridge.engine_client import EngineClient
from rest_bridge.errors import OpenAIError, from_rpc_error
from rest_bridge.protocol.base import query_int
from rest_bridge.protocol.responses import ResponsesRequest
from rest_bridge.routing.prefix import cache_key
from rest_bridge.serving import failover, responses_input, responses_stream, sse
from rest_bridge.serving.disconnect import unless_disconnected
from rest_bridge.serving.failover import RESTARTED, GenerateCall
from rest_bridge.serving.generation import GenerationHandler
from rest_bridge.serving.request_fields import common_fields, strict_mode
from rest_bridge.serving.responses_json import item_json, response_json
from rest_bridge.serving.responses_output import OutputBuilder

STORE_TIMEOUT_S = 30
_ORDERS = {"asc": rpb.LIST_ORDER_ASC, "desc": rpb.LIST_ORDER_DESC}


async def _stream_of(call: GenerateCall):
    """A stream's messages; a retry happens only before its first token, so
    nothing was folded yet and RESTARTED needs nothing undone."""
    async for message in call.rest():
        if message is not RESTARTED:
            yield message


def _headers(meta, origins: responses_input.Origins) -> dict[str, str]:
    """The generation headers, the ignored fields named as the client wrote them."""
    shown = type(meta)()
    shown.CopyFrom(meta)
    del shown.ignored_fields[:]
    shown.ignored_fields.extend(origins.relabel_ignored(meta.ignored_fields))
    return GenerationHandler.response_headers(shown)


def _param_error(exc: grpc.aio.AioRpcError, renames: dict[str, str]) -> OpenAIError:
    error = from_rpc_error(exc)
    if error.param in renames:  # named as the client wrote it, in the message too
        new = renames[error.param]
        error.message = error.message.replace(f"'{error.param}'", f"'{new}'")
        error.param = new
    return error


class ResponsesHandler:
    def __init__(self, engine: EngineClient):
        self.engine = engine

    async def _read(self, response_id: str, param: str = "response_id",
                    items: bool = False) -> rpb.GetResponseResponse:
        """A stored response; a refusal names `param`, the field or path
        parameter (OpenAI's `{response_id}`) the id came in."""
        try:
            return await self.engine.responses.GetResponse(
                rpb.GetResponseRequest(id=response_id, include_input_items=items),
                timeout=STORE_TIMEOUT_S, metadata=call_metadata.get())
        except grpc.aio.AioRpcError as exc:
            raise _param_error(exc, {"id": param}) from None

    async def _save(self, response: rpb.StoredResponse, items: list[rpb.ResponseItem]) -> None:
        try:
            await self.engine.responses.SaveResponse(
                rpb.SaveResponseRequest(response=response, input_items=items),
                timeout=STORE_TIMEOUT_S, metadata=call_metadata.get())
        except grpc.aio.AioRpcError as exc:
            raise _param_error(exc, {"response.id": "id", "response.previous_response_id":
                                     "previous_response_id"}) from None

    # -- POST /v1/responses ---------------------------------------------------------------

    async def create(self, request: ResponsesRequest, http_request: Request):
        strict = strict_mode(http_request)
        if request.prompt is not None:
            raise OpenAIError(400, "'prompt' is not honoured: stored prompt templates are not "
                              "served; send the text as 'input' or 'instructions'.",
                              param="prompt", code="field_not_honoured")
        unused: list[str] = []
        new = responses_input.input_items(request, unused)
        replayed: list[rpb.ResponseItem] = []
        if request.previous_response_id is not None:
            earlier = await self._read(request.previous_response_id, "previous_response_id",
                                       items=True)
            replayed = [*earlier.input_items, *earlier.response.output]
        if not new and not replayed:
            raise OpenAIError(400, "Missing required parameter: 'input'.", param="input",
                              code="missing_required_parameter")
        settings, tools = responses_input.settings(request)
        chat, origins = responses_input.conversation(request.instructions, replayed, new)
        origins.tools = tools.origins
        pb = common_fields(request, responses_input.generate_request(request, chat, settings),
                           strict)
        # Hosted tools are kept from the model, and reported where the client
        # sent them (not through the offered tools' numbering).
        pb.unused_fields.extend([*tools.hosted, *unused])
        origins.as_sent.update(tools.hosted)
        if request.prompt_cache_key:
            cache_key.set(request.prompt_cache_key)

        call, meta = await failover.start(self.engine, pb, http_request.app.state,
                                          bool(request.stream), origins.relabel)
        response = rpb.StoredResponse(
            id=responses_input.new_id("resp"), created_at=meta.created, model=meta.model,
            metadata=request.metadata or {}, settings=settings,
            previous_response_id=request.previous_response_id or "")
        if request.instructions is not None:
            response.instructions = request.instructions
        store = request.store is not False
        builder = OutputBuilder(response, tools)
        headers = _headers(meta, origins)

        async def save() -> None:
            await self._save(response, [*replayed, *new])

        if request.stream:
            call.pin_seed()
            def failed(code: str) -> None:
                # The 200 is out: the access log and metrics count a failure,
                # as for a chat stream's error event.
                http_request.state.error_code = code
                http_request.state.stream_failed = True

            body = responses_stream.events(_stream_of(call), builder, store,
                                           save if store else None, origins.relabel,
                                           call.cancel, failed)
            return StreamingResponse(body, media_type="text/event-stream",
                                     headers={**sse.SSE_HEADERS, **headers})

        async def collect() -> None:
            nonlocal builder
            try:
                async for message in call.rest():
                    if message is RESTARTED:  # sent again on another engine: start over
                        del response.output[:]
                        response.ClearField("usage")
                        builder = OutputBuilder(response, tools)
                        continue
                    builder.feed(message)
            except grpc.aio.AioRpcError as exc:
                raise origins.relabel(from_rpc_error(exc)) from None
            finally:
                call.cancel()
            builder.finish()

        await unless_disconnected(http_request, collect())
        # A retried request is answered from the call that completed.
        meta = call.metadata
        response.created_at, response.model = meta.created, meta.model
        headers = _headers(meta, origins)
        if store:
            await save()
        return JSONResponse(response_json(response, store=store), headers=headers)

    # -- the stored responses ----------------------------------------------------------------

    async def retrieve(self, response_id: str, query) -> dict:
        if query.get("stream", "false").lower() not in ("false", "0"):
            # Replaying a stored response as events is not served.
            raise OpenAIError(400, "'stream' is not honoured when reading a stored response: "
                              "it is returned whole.", param="stream",
                              code="field_not_honoured")
        return response_json((await self._read(response_id)).response, store=True)

    async def delete(self, response_id: str) -> dict:
        try:
            await self.engine.responses.DeleteResponse(
                rpb.DeleteResponseRequest(id=response_id), timeout=STORE_TIMEOUT_S,
                metadata=call_metadata.get())
        except grpc.aio.AioRpcError as exc:
            raise _param_error(exc, {"id": "response_id"}) from None
        return {"id": response_id, "object": "response", "deleted": True}

    async def input_items(self, response_id: str, query) -> dict:
        listing = rpb.ListInputItemsRequest(response_id=response_id,
                                            after=query.get("after", ""),
                                            before=query.get("before", ""))
        limit = query_int(query, "limit")
        if limit is not None:
            listing.limit = limit
        order = query.get("order")
        if order is not None:
            if order not in _ORDERS:
                raise OpenAIError(400, "'order' must be asc or desc.", param="order",
                                  code="invalid_parameter")
            listing.order = _ORDERS[order]
        try:
            page = await self.engine.responses.ListInputItems(
                listing, timeout=STORE_TIMEOUT_S, metadata=call_metadata.get())
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        return {"object": "list", "data": [item_json(i) for i in page.items],
                "first_id": page.first_id or None, "last_id": page.last_id or None,
                "has_more": page.has_more}
