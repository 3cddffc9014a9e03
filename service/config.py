"""Engine configuration: MILLM_* environment variables, each with a CLI flag."""

from __future__ import annotations

import argparse
import os
import pathlib
from dataclasses import dataclass

from common import env_choices, grpc_limits, scheduling


@dataclass(frozen=True)
class EngineConfig:
    host: str = "127.0.0.1"
    grpc_port: int = 50051
    data_dir: pathlib.Path = pathlib.Path(".millm")
    models_dir: pathlib.Path = pathlib.Path(".millm/models")
    model: str = "millm-tiny"
    torch_threads: int = 1
    # Float32 linear weights on a CPU (engines/transformers/packed_linear.py).
    torch_linear: str = "auto"
    device: str = "auto"
    log_level: str = "INFO"
    max_batch: int = 64
    max_queued: int = 256
    # Rows one request holds at once (0: half of max_batch); a larger n runs in parts.
    max_rows_per_request: int = 0
    # A request that cannot start lets later ones pass for this long, then blocks them.
    admission_aging_s: float = 5.0
    # Rows background work (priority above 0: batch lines) leaves free for the rest.
    priority_reserve: int = 1
    # A stream whose reader takes nothing for this long is cancelled, its row and lease freed.
    stream_stall_s: float = 30.0
    prefix_cache_tokens: int = 32768
    # Prompt tokens prefilled per scheduler turn at most, between the running rows' steps.
    prefill_chunk_tokens: int = 512
    batching: str = "continuous"
    # Prometheus metrics on this port (0: off); without a key when open.
    metrics_port: int = 0
    metrics_open: bool = False
    # On SIGTERM: stop taking work, finish what runs for up to this long, exit.
    drain_seconds: float = 30.0
    # Server TLS (PEM files); with a client CA, callers must present a certificate it signed.
    tls_cert: pathlib.Path | None = None
    tls_key: pathlib.Path | None = None
    tls_client_ca: pathlib.Path | None = None
    # SAEs (SAELens directories); default <models dir>/saes.
    saes_dir: pathlib.Path | None = None
    # llama.cpp control-vector files; default <models dir>/control_vectors.
    control_vectors_dir: pathlib.Path | None = None
    # The steering dial's floors and ceilings (docs/steering.md).
    cluster_intensity_min: float = 0.5
    cluster_intensity_max: float = 2.0
    circuit_intensity_min: float = 0.0
    circuit_intensity_max: float = 2.0
    # Serve (and list) only this model; others are 404. Empty: any model on disk.
    lock_model: str = ""
    # An unload waits this long for running requests before ending them.
    graceful_unload_timeout: float = 30.0
    # Memory a load must leave free beyond the model's weights.
    memory_headroom_mib: int = 256
    # llama.cpp threads for GGUF models, and their context (0: the file's own).
    gguf_threads: int = 1
    gguf_context: int = 0
    gguf_slots: int = 8
    # llama.cpp's flash attention for GGUF contexts (off: the exact default).
    gguf_flash_attn: bool = False
    # f32 generation KV cells for GGUF models (MILLM_GGUF_KV_TYPE=f32): the exact setting.
    gguf_kv_f32: bool = False
    # MiB the GGUF engine's KV cells may take (0: what is free beyond the weights).
    gguf_kv_memory_mib: int = 0
    # Stored Responses API responses: most kept, and how long (docs/responses.md).
    responses_max_count: int = 10_000
    responses_max_age_days: float = 30.0
    # The state database: empty for SQLite in the data dir; postgresql://… to
    # share state between replicas (docs/deployment.md).
    database_url: str = ""
    # The threads' Linux scheduling policy (common/scheduling.py).
    sched_policy: str = "batch"

    @property
    def grpc_address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.grpc_port}"


def _env(name: str, default: str) -> str:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def parse_config(argv: list[str] | None = None) -> EngineConfig:
    parser = argparse.ArgumentParser(prog="python -m service", description="miLLM gRPC engine")
    parser.add_argument("--host", default=_env("MILLM_HOST", "127.0.0.1"), help="MILLM_HOST")
    parser.add_argument(
        "--grpc-port",
        type=int,
        default=int(_env("MILLM_GRPC_PORT", "50051")),
        help="MILLM_GRPC_PORT (0 picks a free port and prints it)",
    )
    parser.add_argument(
        "--data-dir", default=_env("MILLM_DATA_DIR", ".millm"), help="MILLM_DATA_DIR"
    )
    parser.add_argument(
        "--models-dir",
        default=os.environ.get("MILLM_MODELS_DIR") or None,
        help="MILLM_MODELS_DIR (default: <data dir>/models)",
    )
    parser.add_argument("--model", default=_env("MILLM_MODEL", "millm-tiny"), help="MILLM_MODEL")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=int(_env("MILLM_TORCH_THREADS", "1")),
        help="MILLM_TORCH_THREADS: intra-op threads; one is fastest for tiny models",
    )
    parser.add_argument(
        "--torch-linear", choices=("auto", "packed", "plain", "bf16"),
        default=_env("MILLM_TORCH_LINEAR", "auto"),
        help="MILLM_TORCH_LINEAR: float32 linear layers on a CPU in oneDNN's packed layout "
             "(auto: for models past 64 MiB of them; packed: always), PyTorch's plain one "
             "(its exact bits), or packed in bfloat16 (faster where the CPU has the "
             "instructions; greedy text may differ)",
    )
    parser.add_argument(
        "--device", default=_env("MILLM_DEVICE", "auto"), help="MILLM_DEVICE: auto, cpu or cuda"
    )
    parser.add_argument(
        "--log-level", default=_env("MILLM_LOG_LEVEL", "INFO"), help="MILLM_LOG_LEVEL"
    )
    parser.add_argument(
        "--max-batch", type=int, default=int(_env("MILLM_MAX_BATCH", "64")),
        help="MILLM_MAX_BATCH: most rows (choices) decoded together",
    )
    parser.add_argument(
        "--max-rows-per-request", type=int,
        default=int(_env("MILLM_MAX_ROWS_PER_REQUEST", "0")),
        help="MILLM_MAX_ROWS_PER_REQUEST: rows one request holds at once (0: half of "
             "--max-batch); a larger n or many prompts run in parts as rows free up",
    )
    parser.add_argument(
        "--admission-aging-s", type=float, default=float(_env("MILLM_ADMISSION_AGING_S", "5")),
        help="MILLM_ADMISSION_AGING_S: how long later requests may pass one that does not "
             "fit yet, before it is admitted next",
    )
    parser.add_argument(
        "--priority-reserve", type=int, default=int(_env("MILLM_PRIORITY_RESERVE", "1")),
        help="MILLM_PRIORITY_RESERVE: rows of the batch that background work (priority "
             "above 0, such as a batch's lines) never takes, kept for other requests",
    )
    parser.add_argument(
        "--stream-stall-s", type=float, default=float(_env("MILLM_STREAM_STALL_S",
                                                       str(grpc_limits.STREAM_STALL_S))),
        help="MILLM_STREAM_STALL_S: a stream whose reader takes nothing for this long is "
             "cancelled, freeing its row and model lease",
    )
    parser.add_argument(
        "--max-queued", type=int, default=int(_env("MILLM_MAX_QUEUED", "256")),
        help="MILLM_MAX_QUEUED: most requests waiting; past it, 503 queue_full",
    )
    parser.add_argument(
        "--prefix-cache-tokens", type=int,
        default=int(_env("MILLM_PREFIX_CACHE_TOKENS", "32768")),
        help="MILLM_PREFIX_CACHE_TOKENS: prompt-prefix KV budget in tokens; 0 disables",
    )
    parser.add_argument(
        "--prefill-chunk-tokens", type=int,
        default=int(_env("MILLM_PREFILL_CHUNK_TOKENS", "512")),
        help="MILLM_PREFILL_CHUNK_TOKENS: prompt tokens prefilled per scheduler turn at most "
             "(a longer prompt takes several turns, between the running rows' decode steps)",
    )
    parser.add_argument(
        "--batching", choices=("continuous", "serial"),
        default=_env("MILLM_BATCHING", "continuous"),
        help="MILLM_BATCHING: continuous, or serial (one request at a time, for comparison)",
    )
    parser.add_argument(
        "--metrics-port", type=int, default=int(_env("MILLM_METRICS_PORT", "0")),
        help="MILLM_METRICS_PORT: Prometheus /metrics on this port (0: off)",
    )
    parser.add_argument(
        "--metrics-open", action=argparse.BooleanOptionalAction,
        default=_env("MILLM_METRICS_OPEN", "0").lower() in ("1", "true", "yes"),
        help="MILLM_METRICS_OPEN=1: serve the metrics port without an API key (for scrapers "
             "that send none, such as GIE's endpoint picker); expose that port only inside "
             "the cluster")
    parser.add_argument(
        "--drain-seconds", type=float, default=float(_env("MILLM_DRAIN_SECONDS", "30")),
        help="MILLM_DRAIN_SECONDS: how long in-flight work may finish after SIGTERM",
    )
    parser.add_argument("--tls-cert", default=_env("MILLM_GRPC_TLS_CERT", ""),
                        help="MILLM_GRPC_TLS_CERT: server certificate (PEM); enables TLS")
    parser.add_argument("--tls-key", default=_env("MILLM_GRPC_TLS_KEY", ""),
                        help="MILLM_GRPC_TLS_KEY: the certificate's private key (PEM)")
    parser.add_argument("--tls-client-ca", default=_env("MILLM_GRPC_TLS_CLIENT_CA", ""),
                        help="MILLM_GRPC_TLS_CLIENT_CA: require client certificates it signed")
    parser.add_argument("--saes-dir", default=os.environ.get("MILLM_SAES_DIR") or None,
                        help="MILLM_SAES_DIR: SAELens SAE directories (default: <models dir>/saes)")
    parser.add_argument("--control-vectors-dir",
                        default=os.environ.get("MILLM_CONTROL_VECTORS_DIR") or None,
                        help="MILLM_CONTROL_VECTORS_DIR: llama.cpp control-vector files "
                        "(default: <models dir>/control_vectors)")
    for name, default in (("cluster-intensity-min", "0.5"), ("cluster-intensity-max", "2.0"),
                          ("circuit-intensity-min", "0.0"), ("circuit-intensity-max", "2.0")):
        env = "MILLM_" + name.upper().replace("-", "_")
        parser.add_argument(f"--{name}", type=float, default=float(_env(env, default)),
                            help=f"{env} (default {default}; docs/steering.md)")
    parser.add_argument("--lock-model", default=_env("MILLM_LOCK_MODEL", ""),
                        help="MILLM_LOCK_MODEL: serve and list only this model id; others 404")
    parser.add_argument(
        "--graceful-unload-timeout", type=float,
        default=float(_env("MILLM_GRACEFUL_UNLOAD_TIMEOUT", "30")),
        help="MILLM_GRACEFUL_UNLOAD_TIMEOUT: seconds an unload waits for running requests")
    parser.add_argument(
        "--memory-headroom-mib", type=int, default=int(_env("MILLM_MEMORY_HEADROOM_MIB", "256")),
        help="MILLM_MEMORY_HEADROOM_MIB: memory a load must leave free beyond the weights")
    parser.add_argument("--gguf-threads", type=int, default=int(_env("MILLM_GGUF_THREADS", "1")),
                        help="MILLM_GGUF_THREADS: llama.cpp threads for GGUF models")
    parser.add_argument("--gguf-context", type=int, default=int(_env("MILLM_GGUF_CONTEXT", "0")),
                        help="MILLM_GGUF_CONTEXT: GGUF context window (0: the file's own, "
                             "shortened to fit memory)")
    parser.add_argument("--gguf-kv-memory-mib", type=int,
                        default=int(_env("MILLM_GGUF_KV_MEMORY_MIB", "0")),
                        help="MILLM_GGUF_KV_MEMORY_MIB: memory the GGUF KV cache and attention "
                             "buffers may take (0: what is free beyond weights and headroom)")
    parser.add_argument("--gguf-flash-attn", choices=("on", "off"),
                        default=_env("MILLM_GGUF_FLASH_ATTN", "off"),
                        help="MILLM_GGUF_FLASH_ATTN: llama.cpp's flash attention for GGUF "
                             "models (on: faster with many slots; logits move in the last "
                             "bits, so greedy text may differ from the transformers engine)")
    parser.add_argument("--gguf-kv-type", choices=("f16", "f32"),
                        default=_env("MILLM_GGUF_KV_TYPE", "f16"),
                        help="MILLM_GGUF_KV_TYPE: the GGUF generation KV cache's values (f16, "
                             "llama.cpp's default; f32: twice the memory, and generated "
                             "log-probabilities as exact as scoring's)")
    parser.add_argument("--gguf-slots", type=int, default=int(_env("MILLM_GGUF_SLOTS", "8")),
                        help="MILLM_GGUF_SLOTS: GGUF sequences decoded together (each with "
                             "its own context window of KV cache)")
    parser.add_argument(
        "--responses-max-count", type=int,
        default=int(_env("MILLM_RESPONSES_MAX_COUNT", "10000")),
        help="MILLM_RESPONSES_MAX_COUNT: most stored responses kept; the oldest go first")
    parser.add_argument(
        "--responses-max-age-days", type=float,
        default=float(_env("MILLM_RESPONSES_MAX_AGE_DAYS", "30")),
        help="MILLM_RESPONSES_MAX_AGE_DAYS: stored responses older than this are removed")
    parser.add_argument(
        "--database-url", default=_env("MILLM_DATABASE_URL", ""),
        help="MILLM_DATABASE_URL: postgresql://user:password@host:5432/db shares the steering "
             "state and stored responses between replicas (default: SQLite in the data dir)")
    parser.add_argument(
        "--database-url-file", default=_env("MILLM_DATABASE_URL_FILE", ""),
        help="MILLM_DATABASE_URL_FILE: read the database URL from this file (a mounted "
             "Secret) instead")
    parser.add_argument("--sched-policy", choices=scheduling.POLICIES,
                        default=_env("MILLM_SCHED_POLICY", scheduling.DEFAULT),
                        help=scheduling.HELP)
    args = parser.parse_args(argv)
    env_choices.check(parser, args)
    if args.database_url_file:
        if args.database_url:
            parser.error("--database-url and --database-url-file are exclusive")
        try:
            args.database_url = pathlib.Path(args.database_url_file).read_text().strip()
        except OSError as exc:
            parser.error(f"--database-url-file: {exc.strerror}")
    if args.database_url and not args.database_url.startswith(
            ("postgresql://", "postgres://", "sqlite:")):
        parser.error("--database-url must start with postgresql:// (or sqlite:<path>)")
    for low, high in (("cluster_intensity_min", "cluster_intensity_max"),
                      ("circuit_intensity_min", "circuit_intensity_max")):
        if not 0 <= getattr(args, low) <= getattr(args, high) <= 2:
            parser.error(f"--{low.replace('_', '-')} and --{high.replace('_', '-')} must "
                         "satisfy 0 <= min <= max <= 2")
    if args.graceful_unload_timeout < 0 or args.memory_headroom_mib < 0:
        parser.error("--graceful-unload-timeout and --memory-headroom-mib must not be negative")
    if (args.gguf_threads < 1 or args.gguf_context < 0 or args.gguf_kv_memory_mib < 0
            or not 1 <= args.gguf_slots <= 256):
        parser.error("--gguf-threads must be at least 1, --gguf-context and "
                     "--gguf-kv-memory-mib not negative and --gguf-slots from 1 to 256")
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    if args.tls_client_ca and not args.tls_cert:
        parser.error("--tls-client-ca needs --tls-cert and --tls-key")
    for name in ("max_batch", "max_queued"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.responses_max_count < 1 or not args.responses_max_age_days > 0:
        parser.error("--responses-max-count must be at least 1 and --responses-max-age-days "
                     "above 0")
    if args.stream_stall_s <= 0:
        parser.error("--stream-stall-s must be above 0")
    if args.max_rows_per_request < 0 or args.admission_aging_s < 0 or args.priority_reserve < 0:
        parser.error("--max-rows-per-request, --admission-aging-s and --priority-reserve must "
                     "not be negative")
    if args.prefix_cache_tokens < 0:
        parser.error("--prefix-cache-tokens must not be negative")
    if args.prefill_chunk_tokens < 1:
        parser.error("--prefill-chunk-tokens must be at least 1")
    data_dir = pathlib.Path(args.data_dir)
    models_dir = pathlib.Path(args.models_dir) if args.models_dir else data_dir / "models"
    if args.torch_threads < 1:
        parser.error("--torch-threads must be at least 1")
    return EngineConfig(
        host=args.host,
        grpc_port=args.grpc_port,
        data_dir=data_dir,
        models_dir=models_dir,
        # A locked server starts with the model it is locked to.
        model=args.lock_model or args.model,
        torch_threads=args.torch_threads,
        torch_linear=args.torch_linear,
        device=args.device,
        log_level=args.log_level.upper(),
        max_batch=args.max_batch,
        max_queued=args.max_queued,
        max_rows_per_request=args.max_rows_per_request,
        admission_aging_s=args.admission_aging_s,
        priority_reserve=args.priority_reserve,
        stream_stall_s=args.stream_stall_s,
        prefix_cache_tokens=args.prefix_cache_tokens,
        prefill_chunk_tokens=args.prefill_chunk_tokens,
        batching=args.batching,
        metrics_port=args.metrics_port,
        metrics_open=args.metrics_open,
        drain_seconds=args.drain_seconds,
        tls_cert=pathlib.Path(args.tls_cert) if args.tls_cert else None,
        tls_key=pathlib.Path(args.tls_key) if args.tls_key else None,
        tls_client_ca=pathlib.Path(args.tls_client_ca) if args.tls_client_ca else None,
        saes_dir=pathlib.Path(args.saes_dir) if args.saes_dir else models_dir / "saes",
        control_vectors_dir=(pathlib.Path(args.control_vectors_dir) if args.control_vectors_dir
                             else models_dir / "control_vectors"),
        cluster_intensity_min=args.cluster_intensity_min,
        cluster_intensity_max=args.cluster_intensity_max,
        circuit_intensity_min=args.circuit_intensity_min,
        circuit_intensity_max=args.circuit_intensity_max,
        lock_model=args.lock_model,
        graceful_unload_timeout=args.graceful_unload_timeout,
        memory_headroom_mib=args.memory_headroom_mib,
        gguf_threads=args.gguf_threads,
        gguf_context=args.gguf_context,
        gguf_slots=args.gguf_slots,
        gguf_flash_attn=args.gguf_flash_attn == "on",
        gguf_kv_f32=args.gguf_kv_type == "f32",
        gguf_kv_memory_mib=args.gguf_kv_memory_mib,
        responses_max_count=args.responses_max_count,
        responses_max_age_days=args.responses_max_age_days,
        database_url=args.database_url,
        sched_policy=args.sched_policy,
    )
