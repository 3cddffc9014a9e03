"""Demo SAEs for millm-tiny, in SAELens format, trained on the model's own
residual stream.

A random dictionary steers and reads, but its features mean nothing, so a
steered answer differs from an unsteered one only by noise. These SAEs are
trained instead: `activations` runs millm-tiny over its own training text and
keeps the residual stream after one block at every token; `train` fits a
dictionary to it; features.py records what each feature fires on, which is
how an operator (and bench/steering_effect.py) picks one to steer with.

The dictionaries are *tied*: the encoder is the decoder's transpose and every
decoder row has unit norm. Tied SAEs reconstruct a little worse than untied
ones, but they make steering legible: adding strength s along feature f's
direction raises f's own pre-activation by exactly s, whatever else the
residual holds, so a dial value reads the same on every feature. One SAE is a
standard (ReLU) SAE on block 1's output, the other a JumpReLU SAE on block
0's, so multi-layer circuits have two SAEs to span.

The build is deterministic on one CPU (fixed seeds, one thread) and takes a
few seconds; like the model's, its result depends on the CPU's vector
instructions, so the repository ships the SAEs it made (shipped.py).
A marker file records the build version and the model revision trained on;
an SAE whose marker is missing or different is trained again, so a rebuilt
model never keeps SAEs fitted to its predecessor.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

from service.demo_model import features as demo_features

DEMO_SAES = (
    # (directory, layer, d_sae, architecture, seed)
    ("millm-tiny-res-l1", 1, 256, "standard", 7),
    ("millm-tiny-res-l0", 0, 128, "jumprelu", 11),
)
D_IN = 64  # millm-tiny's hidden size
MODEL_ID = "millm-tiny"
# Written last, beside cfg.json: a directory without it is an interrupted or
# outdated build. 2: trained on millm-tiny's activations (1 was random).
# 3: unit decoder rows from the start (a wider residual trained too slowly).
MARKER = "millm_sae.json"
SAE_BUILD = 3
STEPS = 1500
BATCH = 512
LR = 4e-3
# The sparsity penalty: L1 of the activations over the mean residual norm,
# against reconstruction error over the residual's variance.
# 0.16 since the unit start (SAE_BUILD 3): 0.08 left some 15 (l0) and 26 (l1)
# features active a token where build 3 had 7 and 13; 0.16 gives 9 and 15.
L1 = 0.16
RESAMPLE_EVERY = 300
# JumpReLU: activations below this are cut to zero.
JUMP_THRESHOLD = 0.1


def saes_dir_for(models_dir: pathlib.Path) -> pathlib.Path:
    return models_dir / "saes"


def model_revision(models_dir: pathlib.Path) -> str:
    try:
        return json.loads((models_dir / MODEL_ID / "millm_model.json").read_text())["revision"]
    except (OSError, ValueError, KeyError):
        return ""


def is_built(models_dir: pathlib.Path, name: str) -> bool:
    try:
        marker = json.loads((saes_dir_for(models_dir) / name / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (marker.get("build") == SAE_BUILD
            and marker.get("model_revision") == model_revision(models_dir))


def all_built(models_dir: pathlib.Path) -> bool:
    return all(is_built(models_dir, spec[0]) for spec in DEMO_SAES)


def activations(model_dir: pathlib.Path, layers: list[int]):
    """Token ids of every training document, and the residual stream after
    each of `layers` at every token: ([doc ids], {layer: [tokens, d_in]})."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from service.demo_model.corpus import training_documents

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prose, tool_documents = training_documents()
    docs = [tokenizer(d, add_special_tokens=False)["input_ids"] for d in prose + tool_documents]
    kept: dict[int, list] = {layer: [] for layer in layers}
    handles = [model.model.layers[layer].register_forward_hook(
        lambda module, args, output, layer=layer: kept[layer].append(
            (output[0] if isinstance(output, tuple) else output)[0].detach().clone()))
        for layer in layers]
    try:
        with torch.no_grad():
            for ids in docs:
                model(input_ids=torch.tensor([ids]))
    finally:
        for handle in handles:
            handle.remove()
    return docs, {layer: torch.cat(rows) for layer, rows in kept.items()}, tokenizer


def train(x, d_sae: int, seed: int) -> dict:
    """A tied SAE for residual vectors x [tokens, d_in]: decoder rows of unit
    norm, encoder their transpose, fitted by Adam on reconstruction error plus
    an L1 penalty. Features that stop firing are restarted on the inputs the
    dictionary reconstructs worst."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    n, d_in = x.shape
    scale = float(x.norm(dim=1).mean())
    # Start from the data: each direction a (centred) token's residual.
    b_dec = x.mean(dim=0).clone()
    centred = x - b_dec
    picks = torch.randperm(n, generator=generator)[:d_sae]
    w = centred[picks] + 0.01 * torch.randn((d_sae, d_in), generator=generator)
    # Unit rows: Adam's steps are then the same size relative to every row,
    # whatever the residual's norm (the decoder normalises them anyway).
    w = torch.nn.Parameter(w / w.norm(dim=1, keepdim=True))
    b_enc = torch.nn.Parameter(torch.zeros(d_sae))
    b_dec = torch.nn.Parameter(b_dec)
    optimizer = torch.optim.Adam([w, b_enc, b_dec], lr=LR)
    variance = float(centred.pow(2).sum(dim=1).mean())
    fired = torch.zeros(d_sae, dtype=torch.bool)
    for step in range(1, STEPS + 1):
        batch = x[torch.randint(0, n, (BATCH,), generator=generator)]
        w_dec = w / w.norm(dim=1, keepdim=True)
        acts = torch.relu((batch - b_dec) @ w_dec.T + b_enc)
        error = (acts @ w_dec + b_dec - batch).pow(2).sum(dim=1).mean() / variance
        sparsity = acts.sum(dim=1).mean() / scale
        loss = error + L1 * sparsity
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        fired |= (acts > 0).any(dim=0)
        if step % RESAMPLE_EVERY == 0 and step < STEPS * 0.8:
            _restart_dead(x, w, b_enc, b_dec, ~fired, generator)
            fired.zero_()
    with torch.no_grad():
        w_dec = (w / w.norm(dim=1, keepdim=True)).detach()
    return {"W_dec": w_dec.contiguous(), "W_enc": w_dec.T.contiguous(),
            "b_enc": b_enc.detach().clone(), "b_dec": b_dec.detach().clone()}


def _restart_dead(x, w, b_enc, b_dec, dead, generator) -> None:
    import torch

    count = int(dead.sum())
    if not count:
        return
    with torch.no_grad():
        w_dec = w / w.norm(dim=1, keepdim=True)
        acts = torch.relu((x - b_dec) @ w_dec.T + b_enc)
        error = (acts @ w_dec + b_dec - x).pow(2).sum(dim=1)
        picks = torch.multinomial(error, count, replacement=False, generator=generator)
        restarted = x[picks] - b_dec
        w[dead] = restarted / restarted.norm(dim=1, keepdim=True)
        b_enc[dead] = 0.0


def _encode(tensors: dict, x, architecture: str):
    import torch

    pre = (x - tensors["b_dec"]) @ tensors["W_enc"] + tensors["b_enc"]
    if architecture == "jumprelu":
        return pre * (pre > tensors["threshold"])
    return torch.relu(pre)


def build_one(saes_dir: pathlib.Path, name: str, layer: int, d_sae: int, architecture: str,
              seed: int, x, docs, tokenizer, revision: str) -> pathlib.Path:
    import torch
    from safetensors.torch import save_file

    target = saes_dir / name
    staging = saes_dir / f".{name}.building"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    tensors = train(x, d_sae, seed)
    if architecture == "jumprelu":
        tensors["threshold"] = torch.full((d_sae,), JUMP_THRESHOLD)
    cfg = {
        "architecture": architecture,
        "d_in": D_IN,
        "d_sae": d_sae,
        "hook_name": f"blocks.{layer}.hook_resid_post",
        "hook_layer": layer,
        "model_name": MODEL_ID,
        "dtype": "float32",
        # Tied and trained with b_dec subtracted first, whatever the architecture.
        "apply_b_dec_to_input": True,
        "normalize_activations": "none",
    }
    (staging / "cfg.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(tensors, str(staging / "sae_weights.safetensors"))
    with torch.no_grad():
        acts = _encode(tensors, x, architecture)
        recon = acts @ tensors["W_dec"] + tensors["b_dec"]
        explained = 1 - float((recon - x).pow(2).sum() / (x - x.mean(0)).pow(2).sum())
    summary = demo_features.write(staging, acts, docs, tokenizer)
    marker = {"build": SAE_BUILD, "model_revision": revision, "tokens": int(x.shape[0]),
              "variance_explained": round(explained, 4), **summary}
    (staging / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    return target


def ensure_built(models_dir: pathlib.Path, seed_offset: int = 0) -> list[pathlib.Path]:
    """Train every demo SAE that is missing or outdated; return the ones built.
    Needs millm-tiny built first. `seed_offset` moves every SAE's seed (a
    model built with another seed gets SAEs of other seeds too)."""
    import torch

    missing = [spec for spec in DEMO_SAES if not is_built(models_dir, spec[0])]
    if not missing:
        return []
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    docs, per_layer, tokenizer = activations(models_dir / MODEL_ID,
                                             sorted({spec[1] for spec in missing}))
    revision = model_revision(models_dir)
    return [build_one(saes_dir_for(models_dir), name, layer, d_sae, architecture,
                      seed + seed_offset, per_layer[layer], docs, tokenizer, revision)
            for name, layer, d_sae, architecture, seed in missing]
