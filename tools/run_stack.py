"""`make run`: the engine and the bridge in the foreground until Ctrl-C.

Both get the same environment (so MILLM_* settings apply to both). If either
exits, the other is stopped; Ctrl-C or SIGTERM stops both.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request


def supervise(procs: list[subprocess.Popen], ready_url: str, ready_message: str,
              stop_timeout: float = 15) -> int:
    """Run until Ctrl-C or SIGTERM, or until a process exits (its status, or 1,
    is returned); print ready_message once ready_url answers 200. Then every
    process gets SIGTERM, and a kill after stop_timeout seconds."""
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    announced = False
    code = 0
    try:
        while not stopping:
            exited = [p for p in procs if p.poll() is not None]
            if exited:
                print("a process exited; stopping the others", file=sys.stderr)
                code = exited[0].returncode or 1
                break
            if not announced:
                try:
                    with urllib.request.urlopen(ready_url, timeout=1) as reply:
                        announced = reply.status == 200
                except OSError:
                    pass
                if announced:
                    print(ready_message, flush=True)
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=stop_timeout)
            except subprocess.TimeoutExpired:
                p.kill()
    return code


def main() -> int:
    env = dict(os.environ)
    env.setdefault("MILLM_METRICS_PORT", "9464")  # the engine's Prometheus endpoint
    host = env.get("MILLM_HOST", "127.0.0.1")
    http_port = env.get("MILLM_HTTP_PORT", "8000")
    procs = [
        subprocess.Popen([sys.executable, "-m", "service"], env=env),
        subprocess.Popen([sys.executable, "-m", "rest_bridge"], env=env),
    ]
    ready_url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{http_port}/readyz"
    return supervise(procs, ready_url, (
        f"\nmiLLM is ready: OpenAI API at http://{host}:{http_port}/v1 , gRPC at "
        f"{host}:{env.get('MILLM_GRPC_PORT', '50051')} , metrics at "
        f"http://{host}:{http_port}/metrics and "
        f"http://{host}:{env['MILLM_METRICS_PORT']}/metrics (Ctrl-C stops both)\n"))


if __name__ == "__main__":
    raise SystemExit(main())
