"""Sparse autoencoders in SAELens format, and the registry of those on disk.

An SAE directory holds `cfg.json` (d_in, d_sae, architecture, hook_name, ...;
SAELens 6 keeps hook_name and model_name under "metadata") and
`sae_weights.safetensors` (W_enc [d_in, d_sae], W_dec [d_sae, d_in],
b_enc [d_sae], b_dec [d_in], and threshold [d_sae] for jumprelu). Steering
reads W_dec rows (a feature's direction in the residual stream); activation
readout runs the encoder.

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

import json
import math
import pathlib
import re
from dataclasses import dataclass

import torch

from service.errors import EngineError
from service.steering.plan import Edit

ARCHITECTURES = ("standard", "jumprelu", "topk")
# Clamp and ablate move along a feature's decoder row: refused where that row
# is within about 89.4 degrees of orthogonal to the feature's encoder column.
MIN_COSINE = 0.01
# The residual stream after block L: the output of decoder layer L, where the
# steering hook adds its delta.
_HOOK = re.compile(r"^blocks\.(\d+)\.hook_resid_post$")
_ID_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


def sae_id_for(directory: pathlib.Path) -> str:
    return "sae_" + _ID_CHARS.sub("-", directory.name)


def invalid_sae(message: str) -> EngineError:
    return EngineError("invalid_sae", message)


def check_feature_index(info: SaeInfo, index: int, param: str) -> None:
    """A feature index within the SAE's width, or invalid_feature_index naming `param`."""
    if not 0 <= index < info.d_sae:
        raise EngineError("invalid_feature_index", f"Feature index {index} is past the width "
                          f"of {info.id} ({info.d_sae} features).", param)


@dataclass(frozen=True)
class SaeInfo:
    """What cfg.json says, checked; no weights read."""

    id: str
    path: pathlib.Path
    d_in: int
    d_sae: int
    architecture: str
    hook_name: str
    layer: int
    model_name: str
    apply_b_dec_to_input: bool
    k: int = 0  # topk: latents kept per position
    rescale_by_decoder_norm: bool = False  # topk: folded into the weights at load


def read_info(directory: pathlib.Path) -> SaeInfo:
    """Parse and check an SAE directory's cfg.json (invalid_sae when unusable)."""
    cfg_file = directory / "cfg.json"
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as exc:
        raise invalid_sae(f"{cfg_file}: cannot read cfg.json ({exc}).") from None
    if not isinstance(cfg, dict):
        raise invalid_sae(f"{cfg_file}: cfg.json must hold an object.")
    for key in ("d_in", "d_sae"):
        if not isinstance(cfg.get(key), int) or cfg[key] < 1:
            raise invalid_sae(f"{cfg_file}: '{key}' must be a positive integer.")
    architecture = cfg.get("architecture", "standard")
    if architecture not in ARCHITECTURES:
        raise invalid_sae(f"{cfg_file}: architecture {architecture!r} is not supported "
                          f"(supported: {', '.join(ARCHITECTURES)}).")
    # SAELens 6 moved the model-side keys under "metadata".
    metadata = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    normalize = cfg.get("normalize_activations", "none")
    if normalize not in (None, "none", False):
        raise invalid_sae(f"{cfg_file}: normalize_activations {normalize!r} is not supported "
                          "(only 'none': fold the scaling into the weights first).")
    k = 0
    if architecture == "topk":
        k = cfg.get("k")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= cfg["d_sae"]:
            raise invalid_sae(f"{cfg_file}: a topk SAE needs 'k' from 1 to d_sae.")
    hook = str(cfg.get("hook_name") or metadata.get("hook_name") or "")
    match = _HOOK.match(hook)
    if match is None:
        raise invalid_sae(f"{cfg_file}: hook_name {hook!r} is not supported; steering hooks "
                          "the residual stream after a block: blocks.<L>.hook_resid_post.")
    return SaeInfo(
        id=sae_id_for(directory), path=directory, d_in=cfg["d_in"], d_sae=cfg["d_sae"],
        architecture=architecture, hook_name=hook, layer=int(match.group(1)),
        model_name=str(cfg.get("model_name") or metadata.get("model_name") or ""),
        apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", architecture == "standard")),
        k=k, rescale_by_decoder_norm=bool(cfg.get("rescale_acts_by_decoder_norm", False)),
    )


class SaeWeights:
    """An SAE's tensors on the model's device and dtype."""

    def __init__(self, info: SaeInfo, device: torch.device, dtype: torch.dtype):
        from safetensors.torch import load_file

        self.info = info
        try:
            tensors = load_file(str(info.path / "sae_weights.safetensors"), device="cpu")
        except Exception as exc:  # a missing or corrupt file: the operator's to fix
            raise invalid_sae(f"{info.path}: cannot read sae_weights.safetensors "
                              f"({type(exc).__name__}: {exc}).") from None
        shapes = {"W_enc": (info.d_in, info.d_sae), "W_dec": (info.d_sae, info.d_in),
                  "b_enc": (info.d_sae,), "b_dec": (info.d_in,)}
        if info.architecture == "jumprelu":
            shapes["threshold"] = (info.d_sae,)
        for name, shape in shapes.items():
            if name not in tensors:
                raise invalid_sae(f"{info.path}: sae_weights.safetensors lacks {name}.")
            if tuple(tensors[name].shape) != shape:
                raise invalid_sae(f"{info.path}: {name} has shape {tuple(tensors[name].shape)}, "
                                  f"expected {shape} from cfg.json.")
        if info.rescale_by_decoder_norm:
            # SAELens's own fold (exact): the rows steering reads become unit ones.
            norms = tensors["W_dec"].float().norm(dim=1).clamp(min=1e-8)
            tensors = {**tensors, "W_enc": tensors["W_enc"].float() * norms,
                       "b_enc": tensors["b_enc"].float() * norms,
                       "W_dec": tensors["W_dec"].float() / norms[:, None]}
        t = {name: tensors[name].to(device=device, dtype=dtype) for name in shapes}
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
        own encoder cannot be set so, and is refused."""
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
