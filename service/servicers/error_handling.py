"""Turning exceptions into rich gRPC statuses, for unary and streaming handlers.

Interceptors do not reliably see errors raised inside streaming handlers, so
the handlers themselves are wrapped: an EngineError aborts with its status and
ErrorInfo; anything else is logged and becomes INTERNAL with a generic message.
"""

from __future__ import annotations

import asyncio
import functools
import logging

import grpc

from service.errors import EngineError, internal_error

log = logging.getLogger(__name__)


async def _abort(context: grpc.aio.ServicerContext, error: EngineError) -> None:
    status = error.to_status()
    await context.abort(status.code, status.details, status.trailing_metadata)


def as_engine_error(exc: Exception, method: str) -> EngineError:
    if isinstance(exc, EngineError):
        return exc
    log.exception("unhandled error in %s", method)
    return internal_error()


def unary_errors(handler):
    @functools.wraps(handler)
    async def wrapper(self, request, context):
        try:
            return await handler(self, request, context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # noqa: BLE001 - every error must become a status
            await _abort(context, as_engine_error(exc, handler.__qualname__))

    return wrapper


def stream_errors(handler):
    @functools.wraps(handler)
    async def wrapper(self, request, context):
        try:
            async for response in handler(self, request, context):
                yield response
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # noqa: BLE001
            await _abort(context, as_engine_error(exc, handler.__qualname__))

    return wrapper
