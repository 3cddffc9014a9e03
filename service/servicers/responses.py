"""millm.v1.ResponseService: stored Responses API responses.

Protobuf in, the store's documents out and back. The caller's key (set by
servicers/access.py) decides ownership: a save belongs to its key, and a
read or delete by another key answers response_not_found, as if nothing
were there, so ids cannot be probed; an admin key (or an engine without
keys) sees every response. SQLite calls run off the event loop.

Every id a call names is checked by the one id rule (responses/rules.py)
before any query, so the database never sees one no save could have stored;
and a save is refused, naming the field, when a reader could not render
what it holds (responses/renderable.py), so reading it back never fails.
"""

from __future__ import annotations

import asyncio

from google.protobuf import json_format

from common import api_keys
from millm.v1 import response_service_pb2 as pb
from millm.v1 import response_service_pb2_grpc
from service.errors import EngineError
from service.responses import renderable, rules
from service.responses.store import ResponseStore
from service.servicers import access
from service.servicers.error_handling import unary_errors

_ORDERS = {pb.LIST_ORDER_UNSPECIFIED: rules.DESC, pb.LIST_ORDER_DESC: rules.DESC,
           pb.LIST_ORDER_ASC: rules.ASC}


def _reader() -> str | None:
    """The owner whose responses the caller may see; None: every owner."""
    key = access.caller.get()
    return None if key is None or key.allows(api_keys.ADMIN) else key.name


def _document(message) -> str:
    return json_format.MessageToJson(message, indent=None)


def _parse(document: str, message):
    return json_format.Parse(document, message, ignore_unknown_fields=True)


class ResponseServicer(response_service_pb2_grpc.ResponseServiceServicer):
    def __init__(self, store: ResponseStore):
        self._store = store

    async def _found(self, response_id: str, param: str) -> pb.StoredResponse:
        rules.check_id(response_id, param)  # before any query: a NUL byte is no id
        stored = await asyncio.to_thread(self._store.get, response_id, _reader())
        if stored is None:
            raise rules.not_found(response_id, param)
        response = _parse(stored.document, pb.StoredResponse())
        response.owner = stored.owner
        return response

    async def _items(self, response_id: str) -> list[pb.ResponseItem]:
        """Every input item, parsed off the event loop (a chain may hold many)."""
        def read() -> list[pb.ResponseItem]:
            return [_parse(document, pb.ResponseItem())
                    for _, document in self._store.items(response_id)]

        return await asyncio.to_thread(read)

    @unary_errors
    async def SaveResponse(self, request, context):
        response = pb.StoredResponse()
        response.CopyFrom(request.response)
        rules.check_id(response.id, "response.id")
        rules.check_metadata(dict(response.metadata))
        # Nothing is stored that a reader could not render back.
        renderable.check(response, "response")
        for i, item in enumerate(request.input_items):
            renderable.check(item, f"input_items[{i}]")
        for where, items in (("response.output", response.output),
                             ("input_items", request.input_items)):
            rules.check_items([i.id for i in items], [i.WhichOneof("item") for i in items],
                              where)
        if response.previous_response_id:
            # Only a response the caller could read may be continued.
            await self._found(response.previous_response_id, "response.previous_response_id")
        key = access.caller.get()
        response.owner = ""  # the store's column says who owns it
        items = [(item.id, _document(item)) for item in request.input_items]
        try:
            pruned = await asyncio.to_thread(self._store.save, response.id,
                                             key.name if key is not None else "",
                                             _document(response), items)
        except KeyError:
            raise EngineError("already_exists", f"A response with id '{response.id}' already "
                              "exists.", "response.id") from None
        return pb.SaveResponseResponse(pruned=pruned)

    @unary_errors
    async def GetResponse(self, request, context):
        response = await self._found(request.id, "id")
        reply = pb.GetResponseResponse(response=response)
        if request.include_input_items:
            reply.input_items.extend(await self._items(request.id))
        return reply

    @unary_errors
    async def DeleteResponse(self, request, context):
        rules.check_id(request.id, "id")
        if not await asyncio.to_thread(self._store.delete, request.id, _reader()):
            raise rules.not_found(request.id, "id")
        return pb.DeleteResponseResponse(id=request.id)

    @unary_errors
    async def ListInputItems(self, request, context):
        await self._found(request.response_id, "response_id")
        order = _ORDERS.get(request.order)
        if order is None:
            raise EngineError("invalid_parameter", "'order' must be asc or desc.", "order")
        rows = await asyncio.to_thread(self._store.items, request.response_id)
        page = rules.page([item_id for item_id, _ in rows],
                          request.limit if request.HasField("limit") else None, order,
                          request.after, request.before)
        # Only the page's items are parsed, not the whole (up to MAX_ITEMS) list.
        chosen = [_parse(rows[i][1], pb.ResponseItem()) for i in page.positions]
        return pb.ListInputItemsResponse(
            items=chosen, first_id=chosen[0].id if chosen else "",
            last_id=chosen[-1].id if chosen else "", has_more=page.has_more)
