"""`python -m service.demo_model`: put the demo model in place, or train it.

By default (what `make model` runs) the repository's trained files are
installed and exported to GGUF (shipped.py says why they are shipped), and
the revision is printed. `--train` runs the training build instead (build.py,
then the SAEs, then the export) and compares what it made with the shipped
files: on a machine whose CPU trains other bits it stops with a message that
says so, and `--ship` makes the new build the repository's demo model (after
a deliberate change to the build). `--seed` trains another model, to check
that the tests hold for more than one build (tests/harness.py keeps such a
build in place when MILLM_DEMO_MODEL_KEEP=1).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import time

from service.demo_model import build as demo_build
from service.demo_model import gguf_export, shipped
from service.demo_model import sae as demo_sae


def default_models_dir() -> str:
    return (os.environ.get("MILLM_MODELS_DIR")
            or os.path.join(os.environ.get("MILLM_DATA_DIR", ".millm"), "models"))


def export(models_dir: pathlib.Path) -> None:
    started = time.monotonic()
    target = gguf_export.export(models_dir / demo_build.MODEL_ID, models_dir)
    print(f"exported {gguf_export.REPO_ID} ({', '.join(gguf_export.QUANTIZATIONS)}) in "
          f"{target} ({time.monotonic() - started:.1f}s)", file=sys.stderr)


def install(models_dir: pathlib.Path, force: bool) -> int:
    if force or not shipped.is_installed(models_dir):
        shipped.install(models_dir)
        export(models_dir)
        shipped.check_export(models_dir)
        print(f"installed {demo_build.MODEL_ID} and its SAEs from {shipped.ARTIFACTS}",
              file=sys.stderr)
    print(f"{demo_build.MODEL_ID} revision {shipped.revision()} in {models_dir}")
    return 0


def train(models_dir: pathlib.Path, seed: int, ship: bool) -> int:
    started = time.monotonic()
    target = demo_build.build(models_dir, seed)
    meta = json.loads((target / demo_build.METADATA_FILE).read_text())
    print(f"trained {demo_build.MODEL_ID} in {target} ({time.monotonic() - started:.1f}s, "
          f"revision {meta['revision']}, loss {meta['final_training_loss']})", file=sys.stderr)
    # Trained afresh even when the checkpoint's revision is the shipped one:
    # the SAEs are part of what a build must reproduce.
    shutil.rmtree(demo_sae.saes_dir_for(models_dir), ignore_errors=True)
    started = time.monotonic()
    for path in demo_sae.ensure_built(models_dir, seed - demo_build.SEED):
        marker = json.loads((path / demo_sae.MARKER).read_text())
        print(f"trained demo SAE {path} ({time.monotonic() - started:.1f}s, "
              f"{marker['variance_explained']:.0%} of variance explained, "
              f"{marker['features_alive']} features alive)", file=sys.stderr)
    export(models_dir)
    if ship:
        record = shipped.ship(models_dir)
        print(f"shipped {demo_build.MODEL_ID} revision {record['revision']} into "
              f"{shipped.ARTIFACTS}: commit it, and update the revision the docs name")
        return 0
    print(f"{demo_build.MODEL_ID} revision {meta['revision']} in {models_dir}")
    if seed != demo_build.SEED:
        return 0
    differing = shipped.differences(models_dir)
    if differing:
        expected = shipped.manifest()
        print(f"This build made revision {meta['revision']}; the repository's demo model is "
              f"revision {expected['revision']}, trained on {json.dumps(expected['made_on'])}. "
              f"This machine is {json.dumps(shipped.cpu_fingerprint())}. Training rounds "
              f"differently on another CPU, so {len(differing)} files differ "
              f"({', '.join(differing[:4])}{', ...' if len(differing) > 4 else ''}). "
              f"`make model` installs the repository's files over this build; "
              f"`--train --ship` makes this build the demo model.", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Install (or train) the millm-tiny demo model.")
    parser.add_argument("--models-dir", default=default_models_dir())
    parser.add_argument("--force", action="store_true", help="install again even if present")
    parser.add_argument("--train", action="store_true",
                        help="train instead of installing the shipped files, and compare")
    parser.add_argument("--seed", type=int, default=demo_build.SEED,
                        help="with --train: another seed gives another model")
    parser.add_argument("--ship", action="store_true",
                        help="with --train: make this build the repository's demo model")
    args = parser.parse_args(argv)
    if (args.ship or args.seed != demo_build.SEED) and not args.train:
        parser.error("--seed and --ship go with --train")
    if args.ship and args.seed != demo_build.SEED:
        parser.error("the shipped demo model is trained with the default seed")
    models_dir = pathlib.Path(args.models_dir)
    try:
        if args.train:
            return train(models_dir, args.seed, args.ship)
        return install(models_dir, args.force)
    except shipped.ShippedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
