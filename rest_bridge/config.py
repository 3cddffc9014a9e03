"""Bridge configuration: MILLM_* environment variables, each with a CLI flag."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from common import env_choices, grpc_limits, scheduling

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
    # After the drain, how long uvicorn waits for open connections (a slow SSE
    # reader) before cancelling them: the shutdown's hard cap is the sum.
    shutdown_grace_seconds: float = 5.0
    # More simultaneous connections than this get uvicorn's 503.
    max_connections: int = 1024
    # Requests whose headers together are larger get 431, a longer URL 414.
    max_header_bytes: int = 32 * 1024
    # Deadlines of engine calls: a generation gets base + per-token × its
    # max_tokens, never more than the cap (which also bounds calls without one).
    engine_deadline_base_s: float = 60.0
    engine_deadline_per_token_s: float = 0.5
    engine_deadline_max_s: float = 600.0
    # How calls carrying a prompt pick one of several engines (engine_client.py).
    routing: str = "load_prefix"
    # Generations ride one GenerateMany stream per engine (engine_mux.py);
    # "off": one Generate call each, for an L7 proxy that balances per call.
    engine_mux: str = "on"
    # A generation's replies waiting unread this long (or over 4,096 of them)
    # end it: the engine's own rule (MILLM_STREAM_STALL_S), kept here for
    # the generations on the stream, which the engine cannot see stall.
    stream_stall_s: float = grpc_limits.STREAM_STALL_S
    # Host names served besides loopback and the listening address, and web
    # origins granted CORS (browser_guard.py): comma-separated, "*" for any.
    allowed_hosts: str = ""
    cors_origins: str = ""
    # Batch lines this bridge runs at once (rest_bridge/batch_runner.py); 0: none.
    batch_concurrency: int = 8
    # The threads' Linux scheduling policy (common/scheduling.py).
    sched_policy: str = "batch"


def _env(name: str, default: str) -> str:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def _number(parser, flag: str, env: str, default, help_text: str, kind=float) -> None:
    parser.add_argument(flag, type=kind, default=kind(_env(env, str(default))),
                        help=f"{env}: {help_text}")


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
    _number(parser, "--shutdown-grace-seconds", "MILLM_SHUTDOWN_GRACE_SECONDS", 5.0,
            "after the drain, how long open connections get before they are closed")
    _number(parser, "--max-connections", "MILLM_HTTP_MAX_CONNECTIONS", 1024,
            "simultaneous HTTP connections; more get 503", int)
    _number(parser, "--max-header-bytes", "MILLM_MAX_HEADER_BYTES", 32 * 1024,
            "larger request headers (all together) get 431, a longer URL 414", int)
    _number(parser, "--engine-deadline-base-s", "MILLM_ENGINE_DEADLINE_BASE_S", 60.0,
            "a generation's deadline: this plus per-token seconds times max_tokens")
    _number(parser, "--engine-deadline-per-token-s", "MILLM_ENGINE_DEADLINE_PER_TOKEN_S", 0.5,
            "a generation's deadline: seconds allowed per requested token")
    _number(parser, "--engine-deadline-max-s", "MILLM_ENGINE_DEADLINE_MAX_S", 600.0,
            "the longest any engine call may take")
    parser.add_argument("--routing", default=_env("MILLM_ROUTING", "load_prefix"),
                        choices=("load_prefix", "round_robin"),
                        help="MILLM_ROUTING: with several engines, pick one per request by "
                        "state, model, load and prompt prefix (load_prefix), or round_robin")
    parser.add_argument("--engine-mux", default=_env("MILLM_ENGINE_MUX", "on"),
                        choices=("on", "off"),
                        help="MILLM_ENGINE_MUX: carry generations over one stream per engine "
                        "(on), or one gRPC call each (off: behind an L7 proxy that balances "
                        "per call)")
    _number(parser, "--stream-stall-s", "MILLM_STREAM_STALL_S", grpc_limits.STREAM_STALL_S,
            "a generation whose client takes nothing for this long is cancelled")
    parser.add_argument("--allowed-hosts", default=_env("MILLM_ALLOWED_HOSTS", ""),
                        help="MILLM_ALLOWED_HOSTS: Host names served besides loopback and the "
                        "listening address (comma-separated; '.example.com' for subdomains; "
                        "'*' turns the check off, unsafe without keys)")
    parser.add_argument("--cors-origins", default=_env("MILLM_CORS_ORIGINS", ""),
                        help="MILLM_CORS_ORIGINS: web origins allowed to call the API from a "
                        "browser (comma-separated, e.g. http://localhost:3000; '*' for any)")
    _number(parser, "--batch-concurrency", "MILLM_BATCH_CONCURRENCY", 8,
            "batch lines this bridge runs at once (0: it runs none)", kind=int)
    parser.add_argument("--sched-policy", choices=scheduling.POLICIES,
                        default=_env("MILLM_SCHED_POLICY", scheduling.DEFAULT),
                        help=scheduling.HELP)
    args = parser.parse_args(argv)
    env_choices.check(parser, args)
    if args.batch_concurrency < 0 or args.batch_concurrency > 256:
        parser.error("--batch-concurrency must be from 0 to 256")
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
        shutdown_grace_seconds=args.shutdown_grace_seconds,
        max_connections=args.max_connections,
        max_header_bytes=args.max_header_bytes,
        engine_deadline_base_s=args.engine_deadline_base_s,
        engine_deadline_per_token_s=args.engine_deadline_per_token_s,
        engine_deadline_max_s=args.engine_deadline_max_s,
        routing=args.routing,
        engine_mux=args.engine_mux,
        stream_stall_s=args.stream_stall_s,
        allowed_hosts=args.allowed_hosts,
        cors_origins=args.cors_origins,
        batch_concurrency=args.batch_concurrency,
        sched_policy=args.sched_policy,
    )
