"""Cancelling work whose HTTP client has gone away."""

from __future__ import annotations

import asyncio
import contextlib

from starlette.requests import Request


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work):
    """Await `work`, cancelling it (and so its gRPC call) if the client leaves.

    Streaming responses get this from Starlette, which cancels the body
    iterator on disconnect; a non-streaming handler would otherwise keep
    generating for nobody. The body must already have been read.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise ClientDisconnected()
    return task.result()


class ClientDisconnected(Exception):
    """The client left before the answer was ready."""
