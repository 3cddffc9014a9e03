"""Bridge configuration: MILLM_* environment variables, each with a CLI flag."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

DEFAULT_MAX_BODY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class BridgeConfig:
    host: str = "127.0.0.1"
    http_port: int = 8000
    engine_targets: tuple[str, ...] = ("127.0.0.1:50051",)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    log_level: str = "INFO"
    # On SIGTERM: answer 503 to new requests, finish running ones for up to this long.
    drain_seconds: float = 30.0
    # TLS to the engines (PEM files): the CA that signed their certificates, and
    # this bridge's own certificate and key when they require client certificates.
    engine_tls_ca: str | None = None
    engine_tls_cert: str | None = None
    engine_tls_key: str | None = None


def _env(name: str, default: str) -> str:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def parse_config(argv: list[str] | None = None) -> BridgeConfig:
    parser = argparse.ArgumentParser(prog="python -m rest_bridge", description="miLLM REST bridge")
    parser.add_argument("--host", default=_env("MILLM_HOST", "127.0.0.1"), help="MILLM_HOST")
    parser.add_argument(
        "--http-port",
        type=int,
        default=int(_env("MILLM_HTTP_PORT", "8000")),
        help="MILLM_HTTP_PORT",
    )
    default_targets = _env("MILLM_ENGINE_TARGETS", "")
    if not default_targets:
        engine_host = _env("MILLM_HOST", "127.0.0.1")
        if engine_host in ("0.0.0.0", "::"):
            engine_host = "127.0.0.1"
        default_targets = f"{engine_host}:{_env('MILLM_GRPC_PORT', '50051')}"
    parser.add_argument(
        "--engine-targets",
        default=default_targets,
        help="MILLM_ENGINE_TARGETS: comma-separated engine host:port list",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=int(_env("MILLM_MAX_BODY_BYTES", str(DEFAULT_MAX_BODY_BYTES))),
        help="MILLM_MAX_BODY_BYTES: larger request bodies get 413",
    )
    parser.add_argument(
        "--log-level", default=_env("MILLM_LOG_LEVEL", "INFO"), help="MILLM_LOG_LEVEL"
    )
    parser.add_argument(
        "--drain-seconds", type=float, default=float(_env("MILLM_DRAIN_SECONDS", "30")),
        help="MILLM_DRAIN_SECONDS: how long in-flight requests may finish after SIGTERM",
    )
    parser.add_argument("--engine-tls-ca", default=_env("MILLM_ENGINE_TLS_CA", ""),
                        help="MILLM_ENGINE_TLS_CA: CA of the engines' certificates; enables TLS")
    parser.add_argument("--engine-tls-cert", default=_env("MILLM_ENGINE_TLS_CERT", ""),
                        help="MILLM_ENGINE_TLS_CERT: client certificate for mutual TLS")
    parser.add_argument("--engine-tls-key", default=_env("MILLM_ENGINE_TLS_KEY", ""),
                        help="MILLM_ENGINE_TLS_KEY: the client certificate's key")
    args = parser.parse_args(argv)
    if bool(args.engine_tls_cert) != bool(args.engine_tls_key):
        parser.error("--engine-tls-cert and --engine-tls-key go together")
    if args.engine_tls_cert and not args.engine_tls_ca:
        parser.error("--engine-tls-cert needs --engine-tls-ca")
    targets = tuple(t.strip() for t in args.engine_targets.split(",") if t.strip())
    if not targets:
        parser.error("--engine-targets must name at least one engine")
    return BridgeConfig(
        host=args.host,
        http_port=args.http_port,
        engine_targets=targets,
        max_body_bytes=args.max_body_bytes,
        log_level=args.log_level.upper(),
        drain_seconds=args.drain_seconds,
        engine_tls_ca=args.engine_tls_ca or None,
        engine_tls_cert=args.engine_tls_cert or None,
        engine_tls_key=args.engine_tls_key or None,
    )
