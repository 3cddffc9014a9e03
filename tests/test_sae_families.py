"""SAE families beyond SAELens standard and jumprelu (issue 44 item 3), each
checked against a reference forward written here from the format's own
definition (SAELens's TopKSAE: the k largest pre-activations, then ReLU;
`rescale_acts_by_decoder_norm` scaling pre by the decoder row norms before
choosing and dividing them out when decoding) on tiny random weights, with
SAELens 6's cfg layout (model keys under "metadata").

Then end to end on both engines: the demo's layer-1 weights saved as a TopK
SAE attach, read exactly the k largest of what the standard SAE reads at
each position, and steer.
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


# -- end to end: a TopK SAE attaches, reads and steers on both engines ----------------------------

TINY, F32 = "millm-tiny", "millm-tiny-gguf:F32"


@pytest.fixture(scope="module")
def topk_stack(tmp_path_factory):
    """A stack whose SAE folder holds the demo's layer-1 SAE and the same
    weights as a SAELens 6 TopK SAE (k 8)."""
    import shutil

    from safetensors.torch import load_file

    from tests import harness

    tmp = tmp_path_factory.mktemp("topk")
    saes = tmp / "saes"
    shutil.copytree(harness.models_dir() / "saes" / "millm-tiny-res-l1", saes / "standard")
    weights = load_file(str(saes / "standard" / "sae_weights.safetensors"))
    write_sae(saes / "topk", {**topk_cfg(8, False), "d_in": 64, "d_sae": 256}, weights)
    stack = harness.OwnStack(tmp, MILLM_SAES_DIR=str(saes))
    try:
        yield stack
    finally:
        stack.stop()


def _call(stack, method, path, body=None):
    from tests.http_helpers import call

    reply = call(stack.http_port, method, path, body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _read(stack, model: str, sae_id: str) -> list[dict]:
    body = _call(stack, "POST", "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": "Tell me about the sea."}],
        "max_tokens": 6, "temperature": 0, "return_sae_activations": {
            "sae_id": sae_id, "positions": "all", "top_k": 64}})
    return body["millm"]["sae_activations"]["positions"]


@pytest.mark.parametrize("model", [TINY, F32])
def test_a_topk_sae_attaches_reads_its_k_best_and_steers(topk_stack, model):
    listed = {s["id"]: s for s in _call(topk_stack, "GET", "/api/saes")["saes"]}
    assert listed["sae_topk"]["architecture"] == "topk" and listed["sae_topk"]["layer"] == 1
    _call(topk_stack, "POST", "/api/saes/sae_standard/attach")
    standard = _read(topk_stack, model, "sae_standard")
    _call(topk_stack, "POST", "/api/saes/sae_standard/detach")
    _call(topk_stack, "POST", "/api/saes/sae_topk/attach")
    topk = _read(topk_stack, model, "sae_topk")
    # The same pre-activations: at each position the TopK SAE reads the k
    # largest of what the standard one reads (those above zero).
    assert [p["position"] for p in topk] == [p["position"] for p in standard]
    for mine, full in zip(topk, standard, strict=True):
        want = sorted(full["features"], key=lambda f: -f["value"])[:8]
        got = sorted(mine["features"], key=lambda f: -f["value"])
        assert len(got) <= 8
        assert [f["index"] for f in got] == [f["index"] for f in want if f["value"] > 0]
        assert [f["value"] for f in got] == pytest.approx(
            [f["value"] for f in want if f["value"] > 0], rel=1e-4, abs=1e-4)
    # It steers on this engine: some feature's direction changes the greedy text.
    def text(**extra) -> str:
        return _call(topk_stack, "POST", "/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": "Tell me about the sea."}],
            "max_tokens": 8, "temperature": 0, **extra})["choices"][0]["message"]["content"]

    plain = text()
    changed = False
    for feature in range(256):
        _call(topk_stack, "POST", "/api/profiles", {"name": "topk-steer", "entries": [
            {"layer": 1, "feature": feature, "strength": 8.0, "sae_id": "sae_topk"}]})
        try:
            changed = text(profile="topk-steer") != plain
        finally:
            _call(topk_stack, "DELETE", "/api/profiles/topk-steer")
        if changed:
            break
    assert changed, "no feature of the TopK SAE changes the greedy text"
    _call(topk_stack, "POST", "/api/saes/sae_topk/detach")
