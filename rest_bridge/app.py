"""The FastAPI application."""

from __future__ import annotations

import contextlib
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from common import api_keys
from common.log_text import shown
from rest_bridge.access import AccessMiddleware, BridgeState
from rest_bridge.batch_runner import BatchRunner
from rest_bridge.browser_guard import BrowserGuard, HostRule, OriginRule
from rest_bridge.config import BridgeConfig
from rest_bridge.engine_client import EngineClient
from rest_bridge.errors import SERVER_ERROR, OpenAIError
from rest_bridge.metrics import BridgeMetrics
from rest_bridge.routes import not_served, router, slash_redirect
from rest_bridge.serving import console, monitoring_api, steering_api
from rest_bridge.serving.chat import ChatCompletionHandler
from rest_bridge.serving.completions import CompletionHandler
from rest_bridge.serving.disconnect import ClientDisconnected
from rest_bridge.serving.embeddings import EmbeddingsHandler
from rest_bridge.serving.files import FilesHandler
from rest_bridge.serving.messages import MessagesHandler
from rest_bridge.serving.models import ModelsHandler
from rest_bridge.serving.ranking import RankingHandler
from rest_bridge.serving.responses import ResponsesHandler
from rest_bridge.serving.tokenize import TokenizeHandler
from rest_bridge.unserved import is_openai_endpoint

log = logging.getLogger("millm.bridge")


def create_app(config: BridgeConfig, keys: api_keys.KeyRing | None = None) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine = EngineClient(config.engine_targets, config.engine_tls_ca,
                              config.engine_tls_cert, config.engine_tls_key, config.routing,
                              drain_grace_s=config.engine_deadline_max_s,
                              mux=config.engine_mux == "on",
                              stall_s=config.stream_stall_s)
        app.state.engine = engine
        if engine.router is not None:
            app.state.metrics.watch_router(engine.router)
        app.state.chat = ChatCompletionHandler(engine)
        app.state.completions = CompletionHandler(engine)
        app.state.models = ModelsHandler(engine)
        app.state.embeddings = EmbeddingsHandler(engine)
        app.state.ranking = RankingHandler(engine)
        app.state.files = FilesHandler(engine)
        app.state.tokenize = TokenizeHandler(engine)
        app.state.responses = ResponsesHandler(engine)
        app.state.messages = MessagesHandler(engine)
        runner = BatchRunner(app, engine, config.batch_concurrency)
        runner.start()
        log.info("bridge forwarding to %s", engine.target)
        yield
        await runner.stop()
        await engine.close()

    app = FastAPI(title="miLLM", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    app.router.redirect_slashes = False  # routes.slash_redirect, on the raw path
    app.state.config = config
    app.state.access = BridgeState()
    app.state.metrics = BridgeMetrics()
    app.include_router(router)
    app.include_router(steering_api.router)
    app.include_router(monitoring_api.router)
    app.include_router(console.router)
    # Inside the access middleware, which logs and counts its refusals.
    app.add_middleware(BrowserGuard, hosts=HostRule(config.host, config.allowed_hosts),
                       origins=OriginRule(config.cors_origins), routes=app.router.routes)
    app.add_middleware(AccessMiddleware, keys=keys, state=app.state.access,
                       metrics=app.state.metrics, max_header_bytes=config.max_header_bytes)

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, exc: OpenAIError):
        request.state.error_code = exc.code  # for the access log and metrics
        return exc.response()

    @app.exception_handler(ClientDisconnected)
    async def client_gone(request: Request, exc: ClientDisconnected):
        # Nobody reads this; 499 marks it in access logs.
        return OpenAIError(499, "Client closed the request.", code="client_closed").response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        path = request.url.path
        if exc.status_code == 404 and (redirect := slash_redirect(request)) is not None:
            return redirect
        if exc.status_code == 404 or is_openai_endpoint(request.method, path):
            return not_served(request.method, path).response()
        if exc.status_code == 405:
            return OpenAIError(
                405, f"Method {request.method} is not allowed on {request.url.path}.",
                code="method_not_allowed",
            ).response()
        return OpenAIError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        # Routes parse bodies themselves; this only guards against FastAPI's 422.
        return OpenAIError(400, "The request is malformed.", code="invalid_request").response()

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, shown(request.url.path))
        request.state.error_code = "internal_error"
        return OpenAIError(500, "The bridge failed to handle the request.", type=SERVER_ERROR,
                           code="internal_error").response()

    return app
