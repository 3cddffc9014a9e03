"""`python -m rest_bridge`: run the OpenAI REST bridge."""

import asyncio
import logging
import sys

import uvicorn

from common import api_keys, scheduling
from rest_bridge.app import create_app
from rest_bridge.config import parse_config

log = logging.getLogger("millm.bridge")


class DrainingServer(uvicorn.Server):
    """SIGTERM (or Ctrl-C) drains first: new requests get 503 with Retry-After
    and /readyz turns 503, running ones finish for up to drain_seconds, then the
    server stops. A second signal stops at once."""

    def __init__(self, config: uvicorn.Config, app, drain_seconds: float):
        super().__init__(config)
        self.app, self.drain_seconds = app, drain_seconds

    def handle_exit(self, sig, frame) -> None:
        access = self.app.state.access
        if access.draining:
            super().handle_exit(sig, frame)
            return
        access.draining = True
        self.app.state.metrics.draining.set(1)
        log.info("draining: %d requests running, up to %.0fs", access.in_flight,
                 self.drain_seconds)
        asyncio.get_event_loop().call_soon_threadsafe(
            lambda: asyncio.ensure_future(self._drain()))

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_seconds
        while self.app.state.access.in_flight and loop.time() < deadline:
            await asyncio.sleep(0.05)
        self.should_exit = True


def main() -> int:
    config = parse_config()
    logging.basicConfig(
        level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Before uvicorn and gRPC start their threads: they inherit it.
    scheduling.apply(config.sched_policy, log)
    try:
        keys = api_keys.load_for_listener(config.host, log)
    except api_keys.KeyConfigError as exc:
        log.error("%s", exc)
        return 2
    app = create_app(config, keys)
    server = DrainingServer(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.http_port,
            log_level=config.log_level.lower(),
            loop="uvloop",
            http="httptools",
            # The OpenAI SDKs keep connections alive between calls.
            timeout_keep_alive=30,
            # More connections than this are answered 503 by uvicorn itself.
            limit_concurrency=config.max_connections,
            # The hard cap on shutdown after the drain: a stream whose reader
            # stopped reading is cancelled rather than waited for.
            timeout_graceful_shutdown=max(1, round(config.shutdown_grace_seconds)),
            # rest_bridge/access.py writes one JSON line per request instead.
            access_log=False,
        ),
        app,
        config.drain_seconds,
    )
    server.run()
    return 0


sys.exit(main())
