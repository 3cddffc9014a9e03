"""The TypeScript and Go clients, built and run against the session's engine:
a unary call, a streamed generation, and a refusal whose code is read from the
status details; and, without the engine, the tool-calling helpers (the request
they build, streamed fragments folded into calls)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests import harness

TS = harness.ROOT / "clients" / "typescript"


@pytest.mark.timeout(300)
def test_typescript_client(stack):
    if not (TS / "node_modules").is_dir():
        pytest.fail("clients/typescript/node_modules is missing: run `make clients`")
    done = subprocess.run(["npm", "test", "--silent"], cwd=TS, capture_output=True, text=True,
                          timeout=280, env={**os.environ, "MILLM_TEST_TARGET": stack.grpc_target})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "# pass 7" in out and "# fail 0" in out, out


GO = harness.ROOT / "clients" / "go"


@pytest.mark.timeout(300)
def test_go_client(stack):
    if shutil.which("go") is None or shutil.which("protoc-gen-go-grpc") is None:
        pytest.fail("Debian's Go toolchain is missing: run `make clients`")
    done = subprocess.run([str(GO / "build.sh"), "test"], capture_output=True, text=True,
                          timeout=280, env={**os.environ, "MILLM_TEST_TARGET": stack.grpc_target})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert out.count("--- PASS") == 5 and "\nok " in out, out
