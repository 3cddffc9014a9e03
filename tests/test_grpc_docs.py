"""Every command shown in docs/grpc.md runs against a live engine."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

from tests import harness

DOC = harness.ROOT / "docs" / "grpc.md"
COMMANDS = re.findall(r"```sh\n(.+?)\n```", DOC.read_text(), flags=re.S)
TOOLS = {"grpcurl": str(harness.ROOT / ".venv" / "bin" / "grpcurl"),
         "buf": str(harness.ROOT / "tools" / "node_modules" / ".bin" / "buf")}
if not (harness.ROOT / ".venv" / "bin" / "grpcurl").exists():
    TOOLS["grpcurl"] = str(harness.pathlib.Path(sys.executable).parent / "grpcurl")


def test_the_doc_shows_commands():
    assert len(COMMANDS) >= 6


@pytest.mark.parametrize("command", COMMANDS, ids=[c.split(" -d")[0][:60] for c in COMMANDS])
def test_documented_command(stack, command):
    argv = shlex.split(command.replace("127.0.0.1:50051", stack.grpc_target))
    argv[0] = TOOLS[argv[0]]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    out = done.stdout + done.stderr
    if '"temperature": 5' in command:  # the documented refusal
        assert done.returncode != 0 and "InvalidArgument" in out
        assert '"reason":"invalid_parameter"' in out.replace(" ", "")
        return
    assert done.returncode == 0, out
    if argv[1:3] == ["-plaintext", stack.grpc_target] and argv[-1] == "list":
        assert "millm.v1.GenerationService" in out and "grpc.health.v1.Health" in out
    elif "describe" in argv:
        assert "optional double temperature" in out
    elif command.rstrip().endswith("Generate"):
        messages = [json.loads(m) for m in re.findall(r"^\{.*?^\}", done.stdout, re.S | re.M)]
        assert "metadata" in messages[0] and "usage" in messages[-1]
    elif command.rstrip().endswith("Tokenize"):
        reply = json.loads(done.stdout)
        assert reply["tokenStrs"][:2] == ["<|im_start|>", "user"]
        assert int(reply["count"]) == len(reply["tokens"])
    elif command.rstrip().endswith("Detokenize"):
        assert json.loads(done.stdout)["prompt"] == "<|im_start|>user\n"
    elif "Score" in command:
        assert {t["tokenId"] for t in json.loads(done.stdout)["choices"][0]["next"]["top"]} == {
            "40", "41"}
    else:
        assert json.loads(done.stdout)
