"""A checkpoint without a chat template: generation falls back to ChatML, chat
scoring is refused with no_chat_template (there is no prompt the model was
trained to score)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests import harness
from tests.http_helpers import post

CHAT = {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 1}


@pytest.fixture(scope="module")
def templateless(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("templateless")
    models = tmp / "models"
    source = harness.models_dir() / "millm-tiny"
    shutil.copytree(source, models / "plain-tiny")
    (models / "plain-tiny" / "chat_template.jinja").unlink()
    config = models / "plain-tiny" / "tokenizer_config.json"
    settings = json.loads(config.read_text())
    settings.pop("chat_template", None)
    config.write_text(json.dumps(settings))
    engine, grpc_port = harness.start_engine(tmp, MILLM_MODELS_DIR=str(models),
                                             MILLM_MODEL="plain-tiny")
    bridge = None
    try:
        harness.wait_serving(engine, grpc_port)
        bridge, http_port = harness.start_bridge(tmp, grpc_port)
        harness.wait_http(bridge, f"http://127.0.0.1:{http_port}/readyz")
        yield http_port
    finally:
        if bridge is not None:
            bridge.stop()
        engine.stop()


def test_chat_scoring_needs_a_template(templateless):
    reply, content = post(templateless, "/v1/chat/completions",
                          {"model": "plain-tiny", **CHAT, "logprobs": True})
    error = json.loads(content)["error"]
    assert reply.status == 400 and error["code"] == "no_chat_template"
    assert error["param"] == "messages"


def test_generation_falls_back_to_chatml(templateless):
    reply, content = post(templateless, "/v1/chat/completions", {"model": "plain-tiny", **CHAT})
    assert reply.status == 200, content
    # The fallback renders exactly the demo model's own ChatML.
    assert json.loads(content)["usage"]["prompt_tokens"] == 10
