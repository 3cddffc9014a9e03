"""Starting the real engine and bridge as subprocesses on free loopback ports.

Every process started here is stopped when the parent exits, however it
exits: normally or by an exception (atexit), or by SIGTERM or SIGHUP (a
`timeout`, a closed terminal), which become KeyboardInterrupt in the main
thread. An interrupted benchmark once left eight engines decoding for an hour.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import weakref

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = pathlib.Path(__file__).resolve().parent.parent


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def models_dir() -> pathlib.Path:
    configured = os.environ.get("MILLM_MODELS_DIR")
    data = os.environ.get("MILLM_DATA_DIR", str(ROOT / ".millm"))
    path = pathlib.Path(configured) if configured else pathlib.Path(data) / "models"
    from service.demo_model import shipped

    # MILLM_DEMO_MODEL_KEEP=1 runs the tests on a model trained with
    # `python -m service.demo_model --train --seed N` (how the tests' margins
    # are checked on other builds) instead of installing the shipped one.
    keep = os.environ.get("MILLM_DEMO_MODEL_KEEP") == "1" and (path / "millm-tiny").is_dir()
    if not keep and not shipped.is_installed(path):
        subprocess.run(
            [sys.executable, "-m", "service.demo_model", "--models-dir", str(path)],
            check=True, cwd=ROOT,
        )
    return path


_LIVE: weakref.WeakSet[Process] = weakref.WeakSet()


def _stop_all() -> None:
    for process in list(_LIVE):
        process.stop()


def _exit_on(signum, frame) -> None:
    # As Ctrl-C: pytest ends the session (a SystemExit would only fail one test).
    raise KeyboardInterrupt(f"signal {signum}")


def _stop_children_on_exit() -> None:
    """atexit, and SIGTERM/SIGHUP as Ctrl-C where nobody else handles them."""
    atexit.register(_stop_all)
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) is signal.SIG_DFL:
                signal.signal(signum, _exit_on)


_stop_children_on_exit()


class Process:
    def __init__(self, args: list[str], env: dict[str, str], log_path: pathlib.Path,
                 cpus: set[int] | None = None, sched_batch: bool = False):
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()

        # The benchmark gives each process its own cores, and a native peer
        # miLLM's scheduling policy (common/scheduling.py); threads inherit both.
        def pin():
            if cpus:
                os.sched_setaffinity(0, cpus)
            if sched_batch:
                os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        self.proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=self._log,
                                     stderr=subprocess.STDOUT,
                                     preexec_fn=pin if cpus or sched_batch else None)
        _LIVE.add(self)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        _LIVE.discard(self)
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()


def start_engine(tmp: pathlib.Path, cpus: set[int] | None = None,
                 **env_overrides: str) -> tuple[Process, int]:
    port = free_port()
    env = {
        **os.environ,
        "MILLM_HOST": "127.0.0.1",
        "MILLM_GRPC_PORT": str(port),
        "MILLM_MODELS_DIR": str(models_dir()),
        "MILLM_DATA_DIR": str(tmp),
        "MILLM_TORCH_THREADS": "1",
        **env_overrides,
    }
    return Process([sys.executable, "-m", "service"], env, tmp / f"engine-{port}.log",
                   cpus), port


def wait_serving(process: Process, port: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if not process.alive():
                raise RuntimeError(f"engine exited:\n{process.log()}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise RuntimeError(f"engine not SERVING after {timeout}s:\n{process.log()}")


def start_bridge(tmp: pathlib.Path, engine_port: int, cpus: set[int] | None = None,
                 **env_overrides: str) -> tuple[Process, int]:
    port = free_port()
    env = {
        **os.environ,
        "MILLM_HOST": "127.0.0.1",
        "MILLM_HTTP_PORT": str(port),
        "MILLM_ENGINE_TARGETS": f"127.0.0.1:{engine_port}",
        "MILLM_LOG_LEVEL": "WARNING",
        **env_overrides,
    }
    return Process([sys.executable, "-m", "rest_bridge"], env, tmp / f"bridge-{port}.log",
                   cpus), port


def wait_http(process: Process, url: str, timeout: float = 60, want: int = 200) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive():
            raise RuntimeError(f"bridge exited:\n{process.log()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:
                if reply.status == want:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code == want:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer {want} after {timeout}s:\n{process.log()}")


class OwnStack:
    """An engine and bridge of a test's own (a model change there leaves the
    session stack on millm-tiny)."""

    def __init__(self, tmp: pathlib.Path, bridge_env: dict[str, str] | None = None,
                 **engine_env: str):
        self.engine, self.grpc_port = start_engine(tmp, **engine_env)
        self.bridge = None
        try:
            wait_serving(self.engine, self.grpc_port)
            self.bridge, self.http_port = start_bridge(tmp, self.grpc_port, **(bridge_env or {}))
            wait_http(self.bridge, f"{self.base_url}/readyz")
        except BaseException:
            self.stop()
            raise

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def stop(self) -> None:
        if self.bridge is not None:
            self.bridge.stop()
        self.engine.stop()


def gguf_file(model_id: str) -> pathlib.Path:
    """The demo GGUF export's file for 'millm-tiny-gguf:<QUANT>'."""
    repo, quant = model_id.split(":")
    return models_dir() / repo / f"{repo}-{quant}.gguf"


def start_llama_cpp_server(tmp: pathlib.Path, model_path: pathlib.Path, n_ctx: int = 1024,
                           cpus: set[int] | None = None) -> tuple[Process, int]:
    """llama-cpp-python's own OpenAI server on the same file: the GGUF peer
    miLLM is compared with (one thread, as miLLM's GGUF engine uses here)."""
    port = free_port()
    args = [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path),
            "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx),
            "--n_threads", "1", "--n_threads_batch", "1", "--verbose", "False",
            # Its default lets a new request cut the running stream short;
            # miLLM queues instead, so the peer must too for a fair comparison.
            "--interrupt_requests", "False"]
    return Process(args, dict(os.environ), tmp / f"llama-cpp-server-{port}.log", cpus), port


LLAMA_SERVER = ROOT / ".millm" / "llama-server" / "bin" / "llama-server"


def llama_server_binary() -> pathlib.Path | None:
    """llama.cpp's own C++ server, built by tools/build_llama_server.sh (or
    MILLM_LLAMA_SERVER); None when it has not been built."""
    path = pathlib.Path(os.environ.get("MILLM_LLAMA_SERVER", LLAMA_SERVER))
    return path if path.is_file() and os.access(path, os.X_OK) else None


def start_llama_server(tmp: pathlib.Path, model_path: pathlib.Path, parallel: int = 8,
                       n_ctx: int = 1024, cpus: set[int] | None = None) -> tuple[Process, int]:
    """llama.cpp's native server on the same file: `parallel` slots of n_ctx
    tokens each, continuous batching, one thread (as miLLM's GGUF engine)."""
    port = free_port()
    args = [str(llama_server_binary()), "--model", str(model_path), "--host", "127.0.0.1",
            "--port", str(port), "--parallel", str(parallel), "--ctx-size", str(n_ctx * parallel),
            "--threads", "1", "--threads-batch", "1", "--cont-batching", "--no-webui"]
    return Process(args, dict(os.environ), tmp / f"llama-server-{port}.log", cpus), port


def demo_config() -> dict:
    """The demo checkpoint's config.json: its real vocabulary and window."""
    import json

    return json.loads((models_dir() / "millm-tiny" / "config.json").read_text())
