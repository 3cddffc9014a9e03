"""Sparse autoencoders: their weights as steering and readout compute with
them, and the registry of those on disk.

The layouts on disk (SAELens, EleutherAI sparsify, transcoders) are read by
sae_formats.py into SAELens's tensors (W_enc [d_in, d_sae], W_dec [d_sae,
d_in], b_enc [d_sae], b_dec [d_in], and threshold [d_sae] for jumprelu).
Steering reads W_dec rows (a feature's direction in the residual stream);
activation readout runs the encoder.

Families, as SAELens defines their inference forward:
- standard: relu(pre), pre = (x - b_dec?) @ W_enc + b_enc;
- jumprelu: relu(pre) where pre > threshold (BatchTopK SAEs are saved as
  jumprelu with one threshold for every latent);
- topk (`k` in cfg.json): the k largest pre-activations, then relu, the rest
  0. With `rescale_acts_by_decoder_norm` SAELens scales pre by the decoder
  row norms before choosing and divides them out when decoding; folding the
  norms into the weights at load (W_enc and b_enc times the norm, W_dec
  over it) computes the same thing with plain rows, which steering reads.
Activation normalisation at run time (`normalize_activations` other than
"none") is refused: its per-token state is not carried here.
"""

from __future__ import annotations

import math
import pathlib

import torch

from service.errors import EngineError
from service.steering.plan import Edit
from service.steering.sae_formats import (  # noqa: F401 (where callers find them)
    ARCHITECTURES,
    SaeInfo,
    invalid_sae,
    read_info,
    sae_id_for,
    tensors_of,
)

# Clamp and ablate move along a feature's decoder row: refused where that row
# is within about 89.4 degrees of orthogonal to the feature's encoder column.
MIN_COSINE = 0.01


def check_feature_index(info: SaeInfo, index: int, param: str) -> None:
    """A feature index within the SAE's width, or invalid_feature_index naming `param`."""
    if not 0 <= index < info.d_sae:
        raise EngineError("invalid_feature_index", f"Feature index {index} is past the width "
                          f"of {info.id} ({info.d_sae} features).", param)


class SaeWeights:
    """An SAE's tensors on the model's device and dtype."""

    def __init__(self, info: SaeInfo, device: torch.device, dtype: torch.dtype):
        self.info = info
        t = {name: tensor.to(device=device, dtype=dtype)
             for name, tensor in tensors_of(info).items()}
        self.W_enc, self.W_dec = t["W_enc"], t["W_dec"]
        self.b_enc, self.b_dec = t["b_enc"], t["b_dec"]
        self.threshold = t.get("threshold")

    def direction(self, features: list[int], strengths: list[float]) -> torch.Tensor:
        """Σ strength_f · W_dec[f]: the residual delta of these features."""
        index = torch.tensor(features, dtype=torch.long, device=self.W_dec.device)
        weights = torch.tensor(strengths, dtype=self.W_dec.dtype, device=self.W_dec.device)
        return weights @ self.W_dec[index]

    def edit(self, feature: int, value: float, ablate: bool, level: float, where: str) -> Edit:
        """Clamp or ablate `feature` (plan.Edit): the residual moves along the
        feature's decoder row until the encoder reads `value` there (ablate:
        until it reads nothing, from wherever it fires). Where encoder and
        decoder agree on the feature (W_enc[:, f]·W_dec[f] = 1) this is exactly
        swapping the feature's contribution to the reconstruction and keeping
        the SAE's error term; otherwise it still reads back `value`, which is
        what clamping promises. A feature whose decoder row barely moves its
        own encoder cannot be set so, and is refused, as is every feature of a
        transcoder (its encoder reads the MLP's input, sae_formats.py)."""
        if self.info.transcoder:
            raise EngineError("invalid_steering_mode", f"{where}: {self.info.id} is a "
                              "transcoder, whose features are read from its MLP's input; it "
                              "steers in mode add only.", where)
        read = self.W_enc[:, feature].double().cpu()
        row = self.W_dec[feature].double().cpu()
        bias = float(self.b_enc[feature])
        if self.info.apply_b_dec_to_input:
            bias -= float(self.b_dec.double().cpu() @ read)
        gain = float(row @ read)
        if gain <= MIN_COSINE * float(read.norm() * row.norm()):
            raise EngineError("invalid_steering_mode", f"{where}: feature {feature} of "
                              f"{self.info.id} cannot be clamped or ablated: its decoder "
                              "direction does not raise its own encoder reading "
                              f"(W_enc·W_dec = {gain:.3g}).", where)
        if ablate or value == 0.0:
            # Only where it fires: jumprelu fires above its threshold, the rest above 0.
            above = float(self.threshold[feature]) if self.threshold is not None else 0.0
            target = 0.0
        else:
            above, target = -math.inf, value
        return Edit(read.float().numpy(), bias, target, above,
                    (row * (level / gain)).float().numpy())

    def decode(self, acts: torch.Tensor) -> torch.Tensor:
        """Residual (a transcoder: MLP output) vectors of activations [..., d_sae]."""
        return acts.to(self.W_dec.dtype) @ self.W_dec + self.b_dec

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Feature activations of residual vectors x [..., d_in] -> [..., d_sae]."""
        x = x.to(self.W_enc.dtype)
        if self.info.apply_b_dec_to_input:
            x = x - self.b_dec
        pre = x @ self.W_enc + self.b_enc
        if self.threshold is not None:
            return torch.relu(pre) * (pre > self.threshold)
        if self.info.k:
            best = torch.topk(pre, self.info.k, dim=-1)
            return torch.zeros_like(pre).scatter(-1, best.indices, torch.relu(best.values))
        return torch.relu(pre)


class SaeDirectory:
    """SAE directories under one folder; ids are `sae_<directory name>`."""

    def __init__(self, root: pathlib.Path):
        self.root = root

    def scan(self) -> tuple[list[SaeInfo], list[tuple[str, str]]]:
        """(usable SAEs, (id, problem) for directories that are not)."""
        found, broken = [], []
        if not self.root.is_dir():
            return found, broken
        for child in sorted(self.root.iterdir()):
            if child.name.startswith(".") or not (child / "cfg.json").is_file():
                continue
            try:
                found.append(read_info(child))
            except EngineError as exc:
                broken.append((sae_id_for(child), exc.message))
        return found, broken
