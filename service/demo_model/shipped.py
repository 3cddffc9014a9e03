"""The demo model as the repository ships it: one millm-tiny on every machine.

Why ship trained files rather than train on the user's machine: the build is
deterministic on one CPU, but the same commit trained on CPUs with other
vector instructions (AVX2, AVX-512, AMX; even ATEN_CPU_CAPABILITY on one
machine) gives other weights, because float sums round differently with
another SIMD width and four hundred training steps carry that into every
weight. A user, a test and a doc example would each see another model. So
the checkpoint and its SAEs (with their feature records) live in
artifacts/, with a manifest of every file's SHA-256, the revision, and the
machine that trained them. `make model` copies them (checking each hash) and
exports GGUF from them, which is plain numpy on fixed data and so the same
bytes everywhere (the manifest holds those revisions too, and they are
checked after each export).

Training stays the way the files are made (`--train`, make.py): on a machine
like the one in the manifest it must give the same revision
(tests/test_demo_model_shipped.py checks it there), and `--ship` writes a new
build into artifacts/ when the model is meant to change.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import platform
import shutil

from service.demo_model import gguf_export
from service.demo_model import sae as demo_sae

ARTIFACTS = pathlib.Path(__file__).with_name("artifacts")
MANIFEST = ARTIFACTS / "manifest.json"
MODEL_ID = "millm-tiny"
METADATA_FILE = "millm_model.json"
# Files written per build whose bytes carry a time, not the build's result.
UNCOMPARED = {f"{MODEL_ID}/{METADATA_FILE}"}


class ShippedError(RuntimeError):
    """The shipped files, or a build, are not the demo model the manifest names."""


def manifest() -> dict:
    return json.loads(MANIFEST.read_text(encoding="utf-8"))


def revision() -> str:
    """The demo model's revision, as written in the repository."""
    return manifest()["revision"]


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def roots(models_dir: pathlib.Path) -> list[pathlib.Path]:
    """The directories a build makes, relative to its models dir: the
    checkpoint and each SAE."""
    saes = demo_sae.saes_dir_for(models_dir).relative_to(models_dir)
    return [pathlib.Path(MODEL_ID)] + [saes / spec[0] for spec in demo_sae.DEMO_SAES]


def tree_files(models_dir: pathlib.Path) -> dict[str, str]:
    """SHA-256 of every file of the model and its SAEs under models_dir, by
    path relative to it (the manifest's shape)."""
    return {path.relative_to(models_dir).as_posix(): sha256(path)
            for root in roots(models_dir) for path in sorted((models_dir / root).rglob("*"))
            if path.is_file()}


def cpu_fingerprint() -> dict:
    """What decides a training run's rounding: the architecture, the CPU
    vendor and vector extensions (MKL and oneDNN pick kernels by them),
    PyTorch's own kernel level and version."""
    import torch

    vendor, model, flags = "", "", set()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "vendor_id" and not vendor:
                vendor = value.strip()
            elif key == "model name" and not model:
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {"machine": platform.machine(), "vendor": vendor, "cpu": model,
            "torch": torch.__version__,
            "capability": torch.backends.cpu.get_cpu_capability(),
            "isa": sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c",
                                                             "asimd", "sve")))}


def same_cpu(a: dict, b: dict) -> bool:
    """Whether two fingerprints should train the same bits (the model name
    is a label, not a kernel choice)."""
    keys = ("machine", "vendor", "torch", "capability", "isa")
    return all(a.get(k) == b.get(k) for k in keys)


def is_installed(models_dir: pathlib.Path) -> bool:
    """The shipped model, its SAEs and its GGUF export are all in place."""
    expected = revision()
    try:
        meta = json.loads((models_dir / MODEL_ID / METADATA_FILE).read_text())
        gguf_meta = json.loads((models_dir / gguf_export.REPO_ID / METADATA_FILE).read_text())
    except (OSError, ValueError):
        return False
    return (meta.get("revision") == expected and demo_sae.all_built(models_dir)
            and gguf_meta.get("exported_from", {}).get("revision") == expected
            and gguf_meta.get("revisions") == manifest()["gguf"])


def install(models_dir: pathlib.Path) -> str:
    """Copy the shipped model and SAEs into models_dir, each file checked
    against the manifest first; returns the revision."""
    shipped = manifest()
    for rel, digest in shipped["files"].items():
        path = ARTIFACTS / rel
        if not path.is_file() or sha256(path) != digest:
            raise ShippedError(
                f"{path} is missing or does not match the SHA-256 in {MANIFEST}: the "
                "checkout is damaged (a Git LFS pointer, a line-ending filter or an edit). "
                "Restore it with `git checkout -- service/demo_model/artifacts`.")
    models_dir.mkdir(parents=True, exist_ok=True)
    for root in roots(models_dir):
        target = models_dir / root
        staging = target.with_name(f".{target.name}.installing")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(ARTIFACTS / root, staging)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    return shipped["revision"]


def check_export(models_dir: pathlib.Path) -> None:
    """The GGUF export of the shipped checkpoint gives the shipped bytes."""
    meta = json.loads((models_dir / gguf_export.REPO_ID / METADATA_FILE).read_text())
    expected = manifest()["gguf"]
    if meta.get("revisions") != expected:
        raise ShippedError(
            f"the GGUF export made {meta.get('revisions')}, the repository's is {expected}: "
            "the export is meant to give the same bytes on every machine (plain numpy on "
            "the shipped weights); please report this with your CPU and numpy version.")


def differences(models_dir: pathlib.Path) -> list[str]:
    """The files of a build under models_dir that differ from the shipped ones."""
    built = tree_files(models_dir)
    shipped = manifest()["files"]
    return sorted(rel for rel in built.keys() | shipped.keys()
                  if rel not in UNCOMPARED and built.get(rel) != shipped.get(rel))


def ship(models_dir: pathlib.Path) -> dict:
    """Make the build under models_dir the demo model: its files become
    artifacts/, and the manifest names them and this machine."""
    meta = json.loads((models_dir / MODEL_ID / METADATA_FILE).read_text())
    gguf_meta = json.loads((models_dir / gguf_export.REPO_ID / METADATA_FILE).read_text())
    files = tree_files(models_dir)
    staging = ARTIFACTS.with_name(".artifacts.shipping")
    shutil.rmtree(staging, ignore_errors=True)
    for rel in files:
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(models_dir / rel, staging / rel)
    record = {"model": MODEL_ID, "revision": meta["revision"], "seed": meta.get("seed"),
              "made_on": cpu_fingerprint(), "files": files, "gguf": gguf_meta["revisions"]}
    (staging / MANIFEST.name).write_text(json.dumps(record, indent=2) + "\n")
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    os.replace(staging, ARTIFACTS)
    return record
