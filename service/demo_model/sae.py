"""Demo SAEs for millm-tiny, in SAELens format, built deterministically.

They are not trained: each is a fixed random dictionary of unit-norm decoder
directions with a tied encoder, which is all that steering (W_dec rows) and
activation readout (the encoder) need to be exercised end to end. One is a
standard (ReLU) SAE on block 1's output, the other a JumpReLU SAE on block 0's,
so multi-layer circuits have two SAEs to span.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

DEMO_SAES = (
    # (directory, layer, d_sae, architecture, seed)
    ("millm-tiny-res-l1", 1, 256, "standard", 7),
    ("millm-tiny-res-l0", 0, 128, "jumprelu", 11),
)
D_IN = 64  # millm-tiny's hidden size


def saes_dir_for(models_dir: pathlib.Path) -> pathlib.Path:
    return models_dir / "saes"


def _tensors(d_sae: int, architecture: str, seed: int) -> dict:
    import torch

    generator = torch.Generator().manual_seed(seed)
    w_dec = torch.randn((d_sae, D_IN), generator=generator)
    w_dec = w_dec / w_dec.norm(dim=1, keepdim=True)
    tensors = {
        "W_dec": w_dec.contiguous(),
        "W_enc": w_dec.T.contiguous(),
        "b_enc": torch.full((d_sae,), -0.05),
        "b_dec": torch.zeros(D_IN),
    }
    if architecture == "jumprelu":
        tensors["threshold"] = torch.full((d_sae,), 0.1)
    return tensors


def build_one(saes_dir: pathlib.Path, name: str, layer: int, d_sae: int, architecture: str,
              seed: int) -> pathlib.Path:
    from safetensors.torch import save_file

    target = saes_dir / name
    staging = saes_dir / f".{name}.building"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    cfg = {
        "architecture": architecture,
        "d_in": D_IN,
        "d_sae": d_sae,
        "hook_name": f"blocks.{layer}.hook_resid_post",
        "hook_layer": layer,
        "model_name": "millm-tiny",
        "dtype": "float32",
        "apply_b_dec_to_input": architecture == "standard",
        "normalize_activations": "none",
    }
    (staging / "cfg.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(_tensors(d_sae, architecture, seed), str(staging / "sae_weights.safetensors"))
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    return target


def ensure_built(models_dir: pathlib.Path) -> list[pathlib.Path]:
    """Build every demo SAE that is missing; return the ones built."""
    saes_dir = saes_dir_for(models_dir)
    built = []
    for name, layer, d_sae, architecture, seed in DEMO_SAES:
        if not (saes_dir / name / "sae_weights.safetensors").is_file():
            built.append(build_one(saes_dir, name, layer, d_sae, architecture, seed))
    return built
