"""The SAE layouts miLLM reads from disk, each mapped onto one set of tensors
(SAELens's names: W_enc [d_in, d_sae], W_dec [d_sae, d_in], b_enc, b_dec,
threshold) so that steering, readout and monitoring see one kind of SAE.

Why a module of its own: each publisher writes its own cfg keys and tensor
names; what they mean is settled here once, and sae.py computes with the
result.

- SAELens (`cfg.json` + `sae_weights.safetensors`): architectures standard,
  jumprelu, topk (`k`, `rescale_acts_by_decoder_norm`), and the transcoders
  (transcoder, skip_transcoder, jumprelu_transcoder, jumprelu_skip_transcoder:
  `d_out`, metadata `hook_name_out`). SAELens 6 keeps hook_name, hook_name_out
  and model_name under "metadata". BatchTopK SAEs are saved as jumprelu.
- EleutherAI sparsify (`cfg.json` + `sae.safetensors`, one folder per
  hookpoint, named after it: `layers.N`, or `layers.N.mlp` for a transcoder):
  encoder.weight [n, d_in] (W_enc transposed), encoder.bias, W_dec [n, d_in]
  (already SAELens's orientation), b_dec; latents = num_latents or
  d_in · expansion_factor; encode relu then the k largest, subtracting b_dec
  from the input unless it transcodes. `layers.N` is the output of block N:
  SAELens's blocks.N.hook_resid_post.

A transcoder reads an MLP's input and writes its output. Its decoder rows are
directions the MLP adds to the residual stream at the end of its block, so
they steer (mode add) at that layer exactly as an SAE's do; reading its
features needs the MLP's input, which the engines do not hook, so readout,
clamp, ablate, conditions and probes on a transcoder are refused.
"""

from __future__ import annotations

import json
import pathlib
import re
from dataclasses import dataclass

from service.errors import EngineError

SAELENS_WEIGHTS, SPARSIFY_WEIGHTS = "sae_weights.safetensors", "sae.safetensors"
SAES = ("standard", "jumprelu", "topk")
TRANSCODERS = ("transcoder", "skip_transcoder", "jumprelu_transcoder",
               "jumprelu_skip_transcoder")
ARCHITECTURES = SAES + TRANSCODERS
# The residual stream after block L: the output of decoder layer L, where the
# steering hook adds its delta; a transcoder's output is its block's MLP's.
_HOOK = re.compile(r"^blocks\.(\d+)\.hook_resid_post$")
_HOOK_OUT = re.compile(r"^blocks\.(\d+)\.hook_mlp_out$")
# A sparsify folder: its hookpoint, after any prefix the operator added.
_HOOKPOINT = re.compile(r"(?:^|[._-])(?:layers|h)\.(\d+)(\.mlp)?$")
_ID_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


def sae_id_for(directory: pathlib.Path) -> str:
    return "sae_" + _ID_CHARS.sub("-", directory.name)


def invalid_sae(message: str) -> EngineError:
    return EngineError("invalid_sae", message)


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
    layout: str = "saelens"  # or "sparsify"
    transcoder: bool = False  # reads an MLP's input: steers only (module docstring)

    @property
    def weights_file(self) -> pathlib.Path:
        return self.path / (SPARSIFY_WEIGHTS if self.layout == "sparsify" else SAELENS_WEIGHTS)


def read_info(directory: pathlib.Path) -> SaeInfo:
    """Parse and check an SAE directory's cfg.json (invalid_sae when unusable)."""
    cfg_file = directory / "cfg.json"
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as exc:
        raise invalid_sae(f"{cfg_file}: cannot read cfg.json ({exc}).") from None
    if not isinstance(cfg, dict):
        raise invalid_sae(f"{cfg_file}: cfg.json must hold an object.")
    if (directory / SPARSIFY_WEIGHTS).is_file() and not (directory / SAELENS_WEIGHTS).is_file():
        return _sparsify(directory, cfg_file, cfg)
    return _saelens(directory, cfg_file, cfg)


def _positive(cfg: dict, key: str, cfg_file: pathlib.Path) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise invalid_sae(f"{cfg_file}: '{key}' must be a positive integer.")
    return value


def _saelens(directory: pathlib.Path, cfg_file: pathlib.Path, cfg: dict) -> SaeInfo:
    d_in, d_sae = _positive(cfg, "d_in", cfg_file), _positive(cfg, "d_sae", cfg_file)
    architecture = cfg.get("architecture", "standard")
    if architecture not in ARCHITECTURES:
        raise invalid_sae(f"{cfg_file}: architecture {architecture!r} is not supported "
                          f"(supported: {', '.join(ARCHITECTURES)}).")
    metadata = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    normalize = cfg.get("normalize_activations", "none")
    if normalize not in (None, "none", False):
        raise invalid_sae(f"{cfg_file}: normalize_activations {normalize!r} is not supported "
                          "(only 'none': fold the scaling into the weights first).")
    k = 0
    if architecture == "topk":
        k = cfg.get("k")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= d_sae:
            raise invalid_sae(f"{cfg_file}: a topk SAE needs 'k' from 1 to d_sae.")
    hook = str(cfg.get("hook_name") or metadata.get("hook_name") or "")
    model = str(cfg.get("model_name") or metadata.get("model_name") or "")
    if architecture in TRANSCODERS:
        out = str(cfg.get("hook_name_out") or metadata.get("hook_name_out") or "")
        match = _HOOK_OUT.match(out)
        if match is None:
            raise invalid_sae(f"{cfg_file}: a transcoder steers where its MLP's output joins "
                              f"the residual stream; hook_name_out {out!r} is not "
                              "blocks.<L>.hook_mlp_out.")
        if cfg.get("d_out", d_in) != d_in:
            raise invalid_sae(f"{cfg_file}: d_out {cfg.get('d_out')} differs from d_in {d_in}: "
                              "its decoder rows are not residual-stream directions.")
        return SaeInfo(sae_id_for(directory), directory, d_in, d_sae, architecture, hook,
                       int(match.group(1)), model, False, transcoder=True)
    match = _HOOK.match(hook)
    if match is None:
        raise invalid_sae(f"{cfg_file}: hook_name {hook!r} is not supported; steering hooks "
                          "the residual stream after a block: blocks.<L>.hook_resid_post.")
    return SaeInfo(
        id=sae_id_for(directory), path=directory, d_in=d_in, d_sae=d_sae,
        architecture=architecture, hook_name=hook, layer=int(match.group(1)), model_name=model,
        apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", architecture == "standard")),
        k=k, rescale_by_decoder_norm=bool(cfg.get("rescale_acts_by_decoder_norm", False)),
    )


def _sparsify(directory: pathlib.Path, cfg_file: pathlib.Path, cfg: dict) -> SaeInfo:
    d_in = _positive(cfg, "d_in", cfg_file)
    if cfg.get("activation", "topk") != "topk":
        raise invalid_sae(f"{cfg_file}: sparsify activation {cfg.get('activation')!r} is not "
                          "supported (only topk).")
    if cfg.get("signed"):
        raise invalid_sae(f"{cfg_file}: signed sparsify coders (top k by magnitude, no relu) "
                          "are not supported.")
    latents = cfg.get("num_latents") or d_in * cfg.get("expansion_factor", 32)
    k = cfg.get("k", 32)
    if not isinstance(latents, int) or latents < 1 or not isinstance(k, int) or not (
            1 <= k <= latents):
        raise invalid_sae(f"{cfg_file}: num_latents (or d_in times expansion_factor) and k "
                          "must be positive integers, k at most the latents.")
    transcode = bool(cfg.get("transcode", False))
    match = _HOOKPOINT.search(directory.name)
    if match is None or bool(match.group(2)) != transcode:
        want = "layers.<N>.mlp (a transcoder)" if transcode else "layers.<N> (block N's output)"
        raise invalid_sae(f"{directory}: a sparsify folder is named after its hookpoint; "
                          f"'{directory.name}' does not end in {want}.")
    layer = int(match.group(1))
    model = ""
    run = directory.parent / "config.json"
    if run.is_file():
        try:
            model = str(json.loads(run.read_text()).get("model", ""))
        except (OSError, ValueError, AttributeError):
            model = ""
    hook = f"blocks.{layer}.hook_mlp_in" if transcode else f"blocks.{layer}.hook_resid_post"
    return SaeInfo(sae_id_for(directory), directory, d_in, latents,
                   "transcoder" if transcode else "topk", hook, layer, model,
                   apply_b_dec_to_input=not transcode, k=k,
                   layout="sparsify", transcoder=transcode)


def tensors_of(info: SaeInfo) -> dict:
    """The SAE's tensors under SAELens's names, checked against cfg.json
    (float32 on the CPU; sae.py moves them)."""
    from safetensors.torch import load_file

    try:
        raw = load_file(str(info.weights_file), device="cpu")
    except Exception as exc:  # a missing or corrupt file: the operator's to fix
        raise invalid_sae(f"{info.path}: cannot read {info.weights_file.name} "
                          f"({type(exc).__name__}: {exc}).") from None
    if info.layout == "sparsify":
        for name in ("encoder.weight", "encoder.bias", "W_dec", "b_dec"):
            if name not in raw:
                raise invalid_sae(f"{info.path}: {info.weights_file.name} lacks {name}.")
        raw = {"W_enc": raw["encoder.weight"].T, "b_enc": raw["encoder.bias"],
               "W_dec": raw["W_dec"], "b_dec": raw["b_dec"]}
    shapes = {"W_enc": (info.d_in, info.d_sae), "W_dec": (info.d_sae, info.d_in),
              "b_enc": (info.d_sae,), "b_dec": (info.d_in,)}
    if info.architecture.startswith("jumprelu"):
        shapes["threshold"] = (info.d_sae,)
    for name, shape in shapes.items():
        if name not in raw:
            raise invalid_sae(f"{info.path}: {info.weights_file.name} lacks {name}.")
        if tuple(raw[name].shape) != shape:
            raise invalid_sae(f"{info.path}: {name} has shape {tuple(raw[name].shape)}, "
                              f"expected {shape} from cfg.json.")
    tensors = {name: raw[name].float() for name in shapes}
    if info.rescale_by_decoder_norm:
        # SAELens's own fold (exact): the rows steering reads become unit ones.
        norms = tensors["W_dec"].norm(dim=1).clamp(min=1e-8)
        tensors.update(W_enc=tensors["W_enc"] * norms, b_enc=tensors["b_enc"] * norms,
                       W_dec=tensors["W_dec"] / norms[:, None])
    return tensors
