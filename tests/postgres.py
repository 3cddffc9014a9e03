"""A throwaway PostgreSQL cluster for tests: initdb and pg_ctl from Debian's
`postgresql` package (`make postgres` installs it), in a temporary directory,
on a free loopback port, with trust authentication for one user, `millm`.

Run as root (CI and these machines are), initdb refuses to run, and rightly:
the server would own its files as root. The cluster is then created and run
by the unprivileged `postgres` account that the Debian package creates
(`runuser -u postgres`); its directory is handed to that account. The engines
connect over TCP as the database user `millm`, so nothing else changes.

fsync is off: the cluster lives for one test module, and no test here kills
the database server's host. The engines' own durability (a committed write
survives an engine SIGKILL) does not depend on it.
"""

from __future__ import annotations

import glob
import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest

from tests.harness import free_port


def bin_dir() -> pathlib.Path | None:
    """The newest installed PostgreSQL's bin directory (Debian puts them in
    /usr/lib/postgresql/<major>/bin, off PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if found:
        return pathlib.Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return pathlib.Path(initdb).parent if initdb else None


class PostgresCluster:
    def __init__(self):
        bindir = bin_dir()
        if bindir is None:
            pytest.fail("PostgreSQL is not installed: run `make postgres` (Debian's postgresql)")
        self.bin = bindir
        # Not under pytest's tmp dir: its parent is private to root, and the
        # server runs as postgres.
        self.root = root = pathlib.Path(tempfile.mkdtemp(prefix="millm-pg-"))
        self.data = root / "pgdata"
        self.port = free_port()
        self._as = []
        if os.geteuid() == 0:
            self._as = ["runuser", "-u", "postgres", "--"]
            shutil.chown(root, "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "millm", "-A", "trust", "-E", "UTF8",
                  "--locale=C.UTF-8", "--no-sync")
        self.start()
        subprocess.run([self.bin / "psql" if (self.bin / "psql").exists() else "psql",
                        "-h", "127.0.0.1", "-p", str(self.port), "-U", "millm", "-d", "postgres",
                        "-q", "-c", "CREATE DATABASE millm"], check=True, capture_output=True)

    def _run(self, tool: str, *args: str) -> None:
        result = subprocess.run([*self._as, str(self.bin / tool), *args], capture_output=True,
                                text=True, cwd=self.root)
        if result.returncode != 0:
            raise RuntimeError(f"{tool} failed: {result.stdout}{result.stderr}")

    @property
    def url(self) -> str:
        return f"postgresql://millm@127.0.0.1:{self.port}/millm"

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w",
                  "-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                  "-c fsync=off -c max_connections=50", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def close(self) -> None:
        try:
            self.stop()
        except RuntimeError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)
