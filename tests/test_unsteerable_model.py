"""Steering reaches a model's decoder layers wherever its family keeps them,
and a model whose layers cannot be told apart is served unsteered, refusing
every steering field with steering_unavailable instead of ignoring it.

GPT-2 keeps its layers in `transformer.h`, not `model.layers`: it steers, over
the bridge, like the demo model (the conformance suite checks the steered
text itself, tests/test_model_families.py). A layout with no single list of
decoder layers is made here from a real checkpoint loaded by the real engine,
its list replaced by a `Sequential` (the model still runs); its capabilities
then say it cannot steer, and the field table refuses steering fields for it.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from torch import nn

from service.demo_model import families
from service.engines.transformers.architecture import LayersNotFound, decoder_layers
from service.engines.transformers.engine import TransformersEngine
from service.errors import EngineError
from service.models.registry import ModelRegistry
from service.requests import fields
from tests import harness
from tests.http_helpers import call

GPT2 = families.by_name("gpt2")
L1 = "sae_millm-tiny-res-l1"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    import shutil

    target = tmp_path_factory.mktemp("gpt2-models")
    demo = harness.models_dir()
    families.build(GPT2, demo / "millm-tiny", target)
    families.build(families.by_name("llama"), demo / "millm-tiny", target)
    shutil.copytree(demo / "saes", target / "saes")
    return target


@pytest.fixture(scope="module")
def gpt2(models, tmp_path_factory):
    stack = harness.OwnStack(tmp_path_factory.mktemp("gpt2"), MILLM_MODELS_DIR=str(models),
                             MILLM_MODEL=GPT2.model_id)
    try:
        assert call(stack.http_port, "POST", f"/api/saes/{L1}/attach").status_code == 200
        assert call(stack.http_port, "POST", "/api/profiles", {
            "name": "push", "entries": [{"layer": 1, "feature": 3, "strength": 12}]},
        ).status_code == 200
        yield stack
    finally:
        stack.stop()


def body(**extra) -> dict:
    return {"model": GPT2.model_id, "messages": [{"role": "user", "content": "Hi there"}],
            "max_tokens": 6, "temperature": 0, "ignore_eos": True, **extra}


def test_gpt2_layers_in_transformer_h_are_steered(gpt2):
    plain = call(gpt2.http_port, "POST", "/v1/chat/completions", body())
    steered = call(gpt2.http_port, "POST", "/v1/chat/completions",
                   body(profile="push", steering_intensity=1.0))
    assert plain.status_code == steered.status_code == 200
    assert float(steered.headers["x-millm-steering-intensity"]) == 1.0
    assert steered.json()["choices"][0]["message"]["content"] != \
        plain.json()["choices"][0]["message"]["content"]


def test_gpt2_reads_sae_activations(gpt2):
    reply = call(gpt2.http_port, "POST", "/v1/chat/completions",
                 body(return_sae_activations={"sae_id": L1, "top_k": 2, "positions": "prompt"}))
    assert reply.status_code == 200
    read = reply.json()["millm"]["sae_activations"]
    assert read["layer"] == 1 and len(read["positions"]) == reply.json()["usage"]["prompt_tokens"]


def test_the_capability_table_says_gpt2_steers(gpt2):
    caps = call(gpt2.http_port, "GET", "/api/capabilities").json()
    assert caps["features"]["steering"] is True
    rows = {(r["field"], r["route"]): r for r in caps["fields"]}
    assert rows[("profile", "chat")]["honoured"] is True


@pytest.mark.parametrize(("family", "path"), [(f.name, f.layers_path) for f in families.FAMILIES])
def test_decoder_layers_are_found_by_shape(family, path):
    from transformers import AutoConfig, AutoModelForCausalLM

    fam = families.by_name(family)
    config = AutoConfig.for_model(fam.name, vocab_size=64, pad_token_id=0, eos_token_id=2,
                                  **fam.config)
    found = decoder_layers(AutoModelForCausalLM.from_config(config))
    assert found.path == path and len(found.modules) == config.num_hidden_layers


def test_a_model_without_one_list_of_decoder_layers_cannot_steer(models):
    entry = ModelRegistry(models).resolve(families.by_name("llama").model_id)
    engine = TransformersEngine(entry, device="cpu")
    engine.load()
    inner = engine.model.model
    inner.layers = nn.Sequential(*inner.layers)  # still runs, but is no list
    with pytest.raises(LayersNotFound, match="no list of 2 decoder layers"):
        decoder_layers(engine.model)

    async def started():
        engine.start(asyncio.get_running_loop())
        try:
            ids = [[5, 6, 7, 8]]
            return await engine.embed(ids)
        finally:
            engine.shutdown()

    vectors = asyncio.run(started())
    assert len(vectors[0]) == 64 and all(torch.isfinite(torch.tensor(vectors[0])))
    assert engine.steering is None and engine.capabilities.steer is False
    for name, value in (("profile", "push"), ("steering_intensity", 0.5),
                        ("return_sae_activations", {"top_k": 2})):
        with pytest.raises(EngineError) as caught:
            fields.check({name: value}, fields.CHAT, engine.kind_capabilities,
                         engine.capabilities)
        assert (caught.value.code, caught.value.param) == ("steering_unavailable", name)


def test_two_lists_that_could_be_the_decoder_are_not_guessed(models):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(models / families.by_name("llama").model_id)
    model.model.twins = nn.ModuleList([nn.Identity(), nn.Identity()])
    with pytest.raises(LayersNotFound, match="several lists of 2 layers"):
        decoder_layers(model)
