"""`make cluster`: replicas on one machine, as an operator would run them.

A real PostgreSQL (Debian's, started in a temporary cluster: tests/postgres.py,
run as the unprivileged `postgres` account when we are root), two engines
sharing it (gRPC :50051 and :50052, metrics :9464 and :9465) and one bridge
over both (HTTP :8000). Ctrl-C or SIGTERM stops everything and removes the
temporary database; if a process exits, the rest are stopped too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.postgres import PostgresCluster  # noqa: E402
from tools.run_stack import supervise  # noqa: E402

ENGINES = ((50051, 9464), (50052, 9465))


def main() -> int:
    pg = PostgresCluster()
    print(f"PostgreSQL: {pg.url}", flush=True)
    procs: list[subprocess.Popen] = []
    try:
        base = dict(os.environ, MILLM_DATABASE_URL=pg.url)
        for grpc_port, metrics_port in ENGINES:
            data = tempfile.mkdtemp(prefix=f"millm-engine-{grpc_port}-")
            procs.append(subprocess.Popen([sys.executable, "-m", "service"], env=dict(
                base, MILLM_GRPC_PORT=str(grpc_port), MILLM_METRICS_PORT=str(metrics_port),
                MILLM_DATA_DIR=data, MILLM_MODELS_DIR=base.get("MILLM_MODELS_DIR",
                                                               ".millm/models"))))
        targets = ",".join(f"127.0.0.1:{g}" for g, _ in ENGINES)
        procs.append(subprocess.Popen([sys.executable, "-m", "rest_bridge"],
                                      env=dict(base, MILLM_ENGINE_TARGETS=targets)))
        return supervise(procs, "http://127.0.0.1:8000/readyz",
                         "cluster ready: http://127.0.0.1:8000/v1 (two engines, one PostgreSQL); "
                         "Ctrl-C stops it", stop_timeout=40)
    finally:
        for p in procs:  # started before something failed
            if p.poll() is None:
                p.kill()
        pg.close()


if __name__ == "__main__":
    sys.exit(main())
