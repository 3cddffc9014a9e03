"""One demo model on every machine (service/demo_model/shipped.py): `make
model` installs the repository's trained files whatever the CPU, each file
checked against the manifest; the engine names that revision; a damaged
file or a build that made other bits stops with a message saying so; and on
a machine like the one that trained them, training gives the same files."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from service.demo_model import make, shipped
from tests import harness

ROOT = pathlib.Path(__file__).resolve().parents[1]


# Training the model and its SAEs takes about 9 minutes on one core.
TRAINING_S = 1500


def _run(*args: str, env: dict | None = None, timeout: float = 900
         ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "service.demo_model", *args], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=timeout)


@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_make_model_installs_the_revision_written_in_the_repository(tmp_path, capability):
    done = _run("--models-dir", str(tmp_path), env={"ATEN_CPU_CAPABILITY": capability})
    assert done.returncode == 0, done.stderr
    expected = shipped.manifest()
    assert f"millm-tiny revision {expected['revision']}" in done.stdout
    assert shipped.differences(tmp_path) == []
    meta = json.loads((tmp_path / "millm-tiny-gguf" / "millm_model.json").read_text())
    assert meta["revisions"] == expected["gguf"]
    assert meta["exported_from"]["revision"] == expected["revision"]
    # Installed: a second run changes nothing and says the same revision.
    again = _run("--models-dir", str(tmp_path))
    assert again.returncode == 0 and expected["revision"] in again.stdout
    assert "installed" not in again.stderr


def test_the_engine_names_the_shipped_revision(client, server_stub):
    from millm.v1 import server_service_pb2

    if os.environ.get("MILLM_DEMO_MODEL_KEEP") == "1":
        pytest.skip("this run serves another build on purpose (MILLM_DEMO_MODEL_KEEP)")

    revision = shipped.revision()
    reply = client.chat.completions.create(
        model="millm-tiny", messages=[{"role": "user", "content": "Hello!"}], max_tokens=2)
    assert f"millm-tiny@{revision}:" in reply.system_fingerprint
    caps = server_stub.GetCapabilities(server_service_pb2.GetCapabilitiesRequest())
    assert f"@{revision}:" in caps.system_fingerprint


def test_a_damaged_shipped_file_is_refused_by_name(tmp_path, monkeypatch):
    artifacts = tmp_path / "artifacts"
    shutil.copytree(shipped.ARTIFACTS, artifacts)
    weights = artifacts / "millm-tiny" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(shipped, "ARTIFACTS", artifacts)
    monkeypatch.setattr(shipped, "MANIFEST", artifacts / "manifest.json")
    with pytest.raises(shipped.ShippedError, match="model.safetensors"):
        shipped.install(tmp_path / "models")
    assert not (tmp_path / "models" / "millm-tiny").exists()


def test_a_build_with_other_bits_is_reported_file_by_file(tmp_path):
    models = tmp_path / "models"
    shipped.install(models)
    assert shipped.differences(models) == []
    weights = models / "saes" / "millm-tiny-res-l1" / "sae_weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert shipped.differences(models) == ["saes/millm-tiny-res-l1/sae_weights.safetensors"]
    # The installed tree is no longer taken for the shipped one by its metadata
    # alone once the model's revision differs.
    meta_path = models / "millm-tiny" / "millm_model.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "revision": "000000000000"}))
    assert not shipped.is_installed(models)


def test_the_option_rules():
    with pytest.raises(SystemExit):
        make.main(["--ship"])
    with pytest.raises(SystemExit):
        make.main(["--train", "--ship", "--seed", "5"])


@pytest.mark.skipif(not shipped.same_cpu(shipped.cpu_fingerprint(),
                                         shipped.manifest()["made_on"]),
                    reason="training reproduces the shipped bits only on a CPU like the one "
                           "in the manifest (made_on)")
@pytest.mark.timeout(TRAINING_S + 60)
def test_training_here_reproduces_the_shipped_files(tmp_path):
    done = _run("--train", "--models-dir", str(tmp_path), timeout=TRAINING_S)
    assert done.returncode == 0, done.stderr[-2000:]
    assert shipped.differences(tmp_path) == []
    assert shipped.is_installed(tmp_path)


def test_the_tests_run_on_the_shipped_model_unless_told_otherwise():
    if os.environ.get("MILLM_DEMO_MODEL_KEEP") == "1":
        pytest.skip("this run keeps another build on purpose (MILLM_DEMO_MODEL_KEEP)")
    assert shipped.is_installed(harness.models_dir())
