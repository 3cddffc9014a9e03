"""`python -m rest_bridge`: run the OpenAI REST bridge."""

import logging

import uvicorn

from rest_bridge.app import create_app
from rest_bridge.config import parse_config

PROBES = ("/healthz", "/readyz")


class _SkipHealthyProbes(logging.Filter):
    """Successful liveness/readiness probes are not logged: load balancers send
    them every few seconds and would drown the requests that matter."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5:
            _, _, path, _, status = args
            return not (path in PROBES and status == 200)
        return True


def main() -> int:
    config = parse_config()
    logging.basicConfig(
        level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("uvicorn.access").addFilter(_SkipHealthyProbes())
    uvicorn.run(
        create_app(config),
        host=config.host,
        port=config.http_port,
        log_level=config.log_level.lower(),
        loop="uvloop",
        http="httptools",
        # The OpenAI SDKs keep connections alive between calls.
        timeout_keep_alive=30,
    )
    return 0


raise SystemExit(main())
