"""`python -m service`: run the miLLM gRPC engine."""

import asyncio
import logging

from common import scheduling
from service.config import parse_config
from service.server import serve


def main() -> int:
    config = parse_config()
    logging.basicConfig(
        level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Before the event loop and gRPC start their threads: they inherit it.
    scheduling.apply(config.sched_policy, logging.getLogger("millm.engine"))
    return asyncio.run(serve(config))


raise SystemExit(main())
