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
from service.steering.sae_formats import TRANSCODERS

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


def write_sparsify(directory: pathlib.Path, w: dict, k: int, transcode: bool = False,
                   skip: bool = False) -> pathlib.Path:
    """A sparsify checkpoint folder (SparseCoder.save_to_disk's layout)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cfg.json").write_text(json.dumps({
        "activation": "topk", "expansion_factor": D_SAE // D_IN, "normalize_decoder": True,
        "num_latents": 0, "k": k, "multi_topk": False, "skip_connection": skip,
        "transcode": transcode, "d_in": D_IN}))
    tensors = {"encoder.weight": w["W_enc"].T.contiguous(), "encoder.bias": w["b_enc"],
               "W_dec": w["W_dec"], "b_dec": w["b_dec"]}
    if skip:
        tensors["W_skip"] = torch.zeros(D_IN, D_IN)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "sae.safetensors"))
    return directory


def reference_sparsify(w: dict, x: torch.Tensor, k: int, transcode: bool) -> torch.Tensor:
    """sparsify's SparseCoder.encode: relu first, then the k largest, b_dec
    subtracted from the input unless it transcodes."""
    x = x if transcode else x - w["b_dec"]
    pre = torch.relu(x @ w["W_enc"] + w["b_enc"])
    best = pre.topk(k, dim=-1)
    return torch.zeros_like(pre).scatter(-1, best.indices, best.values)


@pytest.mark.parametrize("transcode", [False, True])
def test_sparsify_checkpoints_encode_and_decode_as_sparsify_defines_them(tmp_path, transcode):
    w = random_weights(6)
    w["W_dec"] = w["W_enc"].T * 0.8 + 0.2 * w["W_dec"]  # as trained coders' rows roughly are
    name = "run-layers.1.mlp" if transcode else "run-layers.1"
    (tmp_path / "config.json").write_text(json.dumps({"model": "millm-tiny"}))
    info = read_info(write_sparsify(tmp_path / name, w, 5, transcode, skip=transcode))
    assert (info.layout, info.layer, info.d_sae, info.k, info.transcoder, info.model_name) == (
        "sparsify", 1, D_SAE, 5, transcode, "millm-tiny")
    sae = SaeWeights(info, torch.device("cpu"), torch.float32)
    x = torch.randn(16, D_IN, generator=torch.Generator().manual_seed(2))
    z = sae.encode(x)
    assert torch.allclose(z, reference_sparsify(w, x, 5, transcode), atol=1e-5)
    # decode: Σ activation · W_dec row + b_dec (W_dec is stored row per latent).
    assert torch.allclose(sae.decode(z), z @ w["W_dec"] + w["b_dec"], atol=1e-5)
    assert torch.equal(sae.direction([3], [2.0]), 2.0 * w["W_dec"][3])
    if transcode:  # its features are read from the MLP's input: add only
        with pytest.raises(EngineError) as caught:
            sae.edit(3, 1.0, False, 1.0, "members[0]")
        assert caught.value.code == "invalid_steering_mode"
        return
    # A clamp sets the pre-activation sparsify's encoder reads (whether it is
    # then among the k largest is the coder's own competition).
    for feature in range(D_SAE):
        edit = sae.edit(feature, 40.0, False, 1.0, "e")
        read = torch.from_numpy(edit.read).double()
        moved = x.double() + ((edit.target - (x.double() @ read + edit.bias))[:, None]
                              * torch.from_numpy(edit.move).double())
        pre = (moved - w["b_dec"].double()) @ w["W_enc"].double() + w["b_enc"].double()
        assert pre[:, feature].tolist() == pytest.approx([40.0] * len(x), rel=1e-5)


@pytest.mark.parametrize("architecture", TRANSCODERS)
def test_saelens_transcoders_encode_and_decode_as_saelens_defines_them(tmp_path, architecture):
    w = random_weights(7)
    w["b_dec"] = torch.randn(D_IN, generator=torch.Generator().manual_seed(8))
    if architecture.startswith("jumprelu"):
        w["threshold"] = torch.full((D_SAE,), 0.1)
    if "skip" in architecture:
        w["W_skip"] = torch.zeros(D_IN, D_IN)
    cfg = {"architecture": architecture, "d_in": D_IN, "d_sae": D_SAE, "d_out": D_IN,
           "apply_b_dec_to_input": False, "normalize_activations": "none", "metadata": {
               "hook_name": "blocks.2.ln2.hook_normalized",
               "hook_name_out": "blocks.2.hook_mlp_out"}}
    info = read_info(write_sae(tmp_path / architecture, cfg, w))
    assert (info.layer, info.transcoder, info.architecture) == (2, True, architecture)
    sae = SaeWeights(info, torch.device("cpu"), torch.float32)
    x = torch.randn(8, D_IN, generator=torch.Generator().manual_seed(3))
    pre = x @ w["W_enc"] + w["b_enc"]  # never minus b_dec: that is the output's bias
    want = torch.relu(pre) * (pre > 0.1) if "threshold" in w else torch.relu(pre)
    assert torch.allclose(sae.encode(x), want, atol=1e-5)
    assert torch.allclose(sae.decode(want), want @ w["W_dec"] + w["b_dec"], atol=1e-5)
    wide = write_sae(tmp_path / "wide", {**cfg, "d_out": D_IN + 1}, w)
    with pytest.raises(EngineError):
        read_info(wide)


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
    # The same as an EleutherAI sparsify checkpoint (k 8, block 1's output) and
    # as a SAELens transcoder writing block 1's MLP output.
    save = {"encoder.weight": weights["W_enc"].T.contiguous(), "encoder.bias": weights["b_enc"],
            "W_dec": weights["W_dec"], "b_dec": weights["b_dec"]}
    (saes / "eleuther-layers.1").mkdir()
    (saes / "eleuther-layers.1" / "cfg.json").write_text(json.dumps({
        "activation": "topk", "expansion_factor": 4, "num_latents": 256, "k": 8,
        "transcode": False, "d_in": 64}))
    save_file(save, str(saes / "eleuther-layers.1" / "sae.safetensors"))
    write_sae(saes / "transcoder", {
        "architecture": "transcoder", "d_in": 64, "d_sae": 256, "d_out": 64,
        "apply_b_dec_to_input": False, "metadata": {
            "hook_name": "blocks.1.ln2.hook_normalized",
            "hook_name_out": "blocks.1.hook_mlp_out"}}, weights)
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


@pytest.mark.parametrize("model", [TINY, F32])
def test_a_sparsify_checkpoint_reads_as_the_topk_sae_and_a_transcoder_steers(topk_stack, model):
    stack = topk_stack
    listed = {s["id"]: s for s in _call(stack, "GET", "/api/saes")["saes"]}
    assert listed["sae_eleuther-layers.1"]["layout"] == "sparsify"
    assert listed["sae_transcoder"]["transcoder"] is True
    _call(stack, "POST", "/api/saes/sae_topk/attach")
    topk = _read(stack, model, "sae_topk")
    _call(stack, "POST", "/api/saes/sae_topk/detach")
    _call(stack, "POST", "/api/saes/sae_eleuther-layers.1/attach")
    try:
        sparsify = _read(stack, model, "sae_eleuther-layers.1")
    finally:
        _call(stack, "POST", "/api/saes/sae_eleuther-layers.1/detach")
    # relu then top k (sparsify) reads what top k then relu (SAELens) reads.
    for mine, theirs in zip(sparsify, topk, strict=True):
        assert [f["index"] for f in mine["features"]] == [f["index"] for f in theirs["features"]]
        assert [f["value"] for f in mine["features"]] == pytest.approx(
            [f["value"] for f in theirs["features"]], rel=1e-5, abs=1e-5)

    def steered(sae_id: str) -> str:
        _call(stack, "POST", f"/api/saes/{sae_id}/attach")
        try:
            _call(stack, "POST", "/api/profiles", {"name": "t", "entries": [
                {"layer": 1, "feature": 7, "strength": 10.0, "sae_id": sae_id}]})
            return _call(stack, "POST", "/v1/chat/completions", {
                "model": model, "messages": [{"role": "user", "content": "Tell me a story."}],
                "max_tokens": 12, "temperature": 0, "profile": "t"})["choices"][0]["message"][
                "content"]
        finally:
            _call(stack, "DELETE", "/api/profiles/t")
            _call(stack, "POST", f"/api/saes/{sae_id}/detach")

    # The transcoder's decoder rows are the standard SAE's: the same steering.
    assert steered("sae_transcoder") == steered("sae_standard")
    # Its features are not read here, and it does not clamp.
    _call(stack, "POST", "/api/saes/sae_transcoder/attach")
    try:
        from tests.http_helpers import call

        reply = call(stack.http_port, "POST", "/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            "return_sae_activations": {"sae_id": "sae_transcoder"}})
        assert reply.status_code == 400
        assert reply.json()["error"]["param"] == "return_sae_activations.sae_id"
        reply = call(stack.http_port, "POST", "/api/profiles", {"name": "c", "entries": [
            {"layer": 1, "feature": 7, "mode": "clamp", "value": 2}]})
        assert reply.status_code == 400
        assert reply.json()["error"]["code"] == "invalid_steering_mode"
    finally:
        _call(stack, "POST", "/api/saes/sae_transcoder/detach")
