"""A model whose layers the steering hooks cannot reach (a GPT-2 layout:
transformer.h, no model.layers) is served, and refuses every steering field
with steering_unavailable instead of ignoring it; GetCapabilities says so.
The checkpoint is a tiny random GPT-2 built from its config with the demo
tokenizer."""

from __future__ import annotations

import shutil

import pytest

from tests import harness
from tests.http_helpers import call

NAME = "tiny-gpt2"
STEERING = [({"profile": "any"}, "profile"), ({"steering_intensity": 0.5}, "steering_intensity"),
            ({"return_sae_activations": {"top_k": 2}}, "return_sae_activations")]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    models = tmp_path_factory.mktemp("gpt2-models")
    demo = harness.models_dir() / "millm-tiny"
    target = models / NAME
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=256,
                               vocab_size=768)).save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "chat_template.jinja"):
        if (demo / name).exists():
            shutil.copy(demo / name, target / name)
    stack = harness.OwnStack(tmp_path_factory.mktemp("gpt2"), MILLM_MODELS_DIR=str(models),
                             MILLM_MODEL=NAME)
    try:
        yield stack
    finally:
        stack.stop()


def body(**extra) -> dict:
    return {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
            **extra}


def test_it_serves_plain_chat(gpt2):
    reply = call(gpt2.http_port, "POST", "/v1/chat/completions", body())
    assert reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"]


@pytest.mark.parametrize(("fields", "param"), STEERING)
def test_steering_fields_are_steering_unavailable(gpt2, fields, param):
    reply = call(gpt2.http_port, "POST", "/v1/chat/completions", body(**fields))
    error = reply.json()["error"]
    assert (reply.status_code, error["code"], error["param"]) == (
        400, "steering_unavailable", param)


def test_the_capability_table_says_so(gpt2):
    caps = call(gpt2.http_port, "GET", "/api/capabilities").json()
    assert caps["features"]["steering"] is False
    rows = {(r["field"], r["route"]): r for r in caps["fields"]}
    for _, param in STEERING:
        row = rows[(param, "chat")]
        assert not row["honoured"] and row["refusal_code"] == "steering_unavailable"
