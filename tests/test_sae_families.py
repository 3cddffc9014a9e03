"""SAE families beyond SAELens standard and jumprelu (issue 44 item 3), each
checked against a reference forward written here from the format's own
definition (SAELens's TopKSAE: the k largest pre-activations, then ReLU;
`rescale_acts_by_decoder_norm` scaling pre by the decoder row norms before
choosing and dividing them out when decoding) on tiny random weights, with
SAELens 6's cfg layout (model keys under "metadata").

Unit level: no engine. (The end-to-end attach-and-steer check on both
engines belongs with the rest of issue 44.)
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
from safetensors.torch import save_file

from service.errors import EngineError
from service.steering.sae import SaeWeights, read_info

D_IN, D_SAE = 8, 32


def write_sae(directory: pathlib.Path, cfg: dict, tensors: dict) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cfg.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in tensors.items()},
              str(directory / "sae_weights.safetensors"))
    return directory


def random_weights(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"W_enc": torch.randn(D_IN, D_SAE, generator=g),
            "b_enc": torch.randn(D_SAE, generator=g) * 0.1,
            "W_dec": torch.randn(D_SAE, D_IN, generator=g) * 0.5,
            "b_dec": torch.randn(D_IN, generator=g) * 0.1}


def topk_cfg(k: int, rescale: bool, **extra) -> dict:
    return {"architecture": "topk", "d_in": D_IN, "d_sae": D_SAE, "k": k,
            "apply_b_dec_to_input": True, "normalize_activations": "none",
            "rescale_acts_by_decoder_norm": rescale, "metadata": {
                "hook_name": "blocks.1.hook_resid_post", "model_name": "millm-tiny",
                "sae_lens_version": "6.18.0"}, **extra}


def reference_topk(w: dict, x: torch.Tensor, k: int, rescale: bool) -> torch.Tensor:
    """SAELens TopKSAE.encode, from its definition."""
    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    if rescale:
        pre = pre * w["W_dec"].norm(dim=1)
    out = torch.zeros_like(pre)
    for row in range(pre.shape[0]):
        order = sorted(range(D_SAE), key=lambda i: -float(pre[row, i]))[:k]
        for i in order:
            out[row, i] = max(float(pre[row, i]), 0.0)
    return out


def reference_decode(w: dict, z: torch.Tensor, rescale: bool) -> torch.Tensor:
    if rescale:
        z = z / w["W_dec"].norm(dim=1)
    return z @ w["W_dec"] + w["b_dec"]


@pytest.mark.parametrize("rescale", [False, True])
def test_topk_encodes_and_decodes_as_saelens_defines_it(tmp_path, rescale):
    w = random_weights(3)
    directory = write_sae(tmp_path / "topk", topk_cfg(5, rescale), w)
    info = read_info(directory)
    assert (info.architecture, info.k, info.layer, info.model_name) == (
        "topk", 5, 1, "millm-tiny")
    sae = SaeWeights(info, torch.device("cpu"), torch.float32)
    x = torch.randn(16, D_IN, generator=torch.Generator().manual_seed(9))
    z = sae.encode(x)
    want = reference_topk(w, x, 5, rescale)
    assert torch.allclose(z, want, atol=1e-5)
    assert int((z > 0).sum(dim=1).max()) <= 5
    # Decoding with the loaded rows gives SAELens's reconstruction.
    mine = z @ sae.W_dec + sae.b_dec
    assert torch.allclose(mine, reference_decode(w, want, rescale), atol=1e-5)
    # A steering direction is a loaded decoder row: unit length after the fold.
    if rescale:
        assert torch.allclose(sae.W_dec.norm(dim=1), torch.ones(D_SAE), atol=1e-5)


def test_jumprelu_is_relu_above_the_threshold_even_for_a_negative_threshold(tmp_path):
    w = random_weights(4)
    w["threshold"] = torch.full((D_SAE,), -0.2)
    cfg = {"architecture": "jumprelu", "d_in": D_IN, "d_sae": D_SAE,
           "hook_name": "blocks.0.hook_resid_post", "apply_b_dec_to_input": False}
    sae = SaeWeights(read_info(write_sae(tmp_path / "j", cfg, w)), torch.device("cpu"),
                     torch.float32)
    x = torch.randn(4, D_IN, generator=torch.Generator().manual_seed(1))
    pre = x @ w["W_enc"] + w["b_enc"]
    assert torch.allclose(sae.encode(x), torch.relu(pre) * (pre > -0.2), atol=1e-6)


@pytest.mark.parametrize("cfg, words", [
    (topk_cfg(0, False), "'k'"),
    (topk_cfg(D_SAE + 1, False), "'k'"),
    ({**topk_cfg(4, False), "k": 2.5}, "'k'"),
    ({**topk_cfg(4, False), "normalize_activations": "constant_norm_rescale"},
     "normalize_activations"),
    ({**topk_cfg(4, False), "architecture": "gated"}, "not supported"),
])
def test_what_cannot_be_served_faithfully_is_refused(tmp_path, cfg, words):
    directory = write_sae(tmp_path / "bad", cfg, random_weights(5))
    with pytest.raises(EngineError) as caught:
        read_info(directory)
    assert caught.value.code == "invalid_sae" and words in caught.value.message
