"""`python -m rest_bridge`: run the OpenAI REST bridge."""

import logging

import uvicorn

from rest_bridge.app import create_app
from rest_bridge.config import parse_config


def main() -> int:
    config = parse_config()
    logging.basicConfig(
        level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    uvicorn.run(
        create_app(config),
        host=config.host,
        port=config.http_port,
        log_level=config.log_level.lower(),
        # The OpenAI SDKs keep connections alive between calls.
        timeout_keep_alive=30,
    )
    return 0


raise SystemExit(main())
