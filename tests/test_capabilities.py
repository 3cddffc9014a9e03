"""ServerService.GetCapabilities and GET /api/capabilities: what the loaded
model honours, read from the same tables the engine enforces."""

from __future__ import annotations

import json

from millm.v1 import generation_pb2, server_service_pb2
from service.demo_model.build import CONTEXT_WINDOW
from tests.conftest import MODEL
from tests.harness import demo_config
from tests.http_helpers import request


def test_grpc_capabilities(server_stub):
    reply = server_stub.GetCapabilities(server_service_pb2.GetCapabilitiesRequest(), timeout=10)
    assert (reply.model, reply.engine) == (MODEL, "transformers")
    assert reply.context_window == CONTEXT_WINDOW
    assert reply.vocab_size == demo_config()["vocab_size"]
    assert reply.system_fingerprint.startswith("millm:millm-tiny@")
    assert reply.versions["torch"].startswith("2.") and reply.versions["millm"] == "0.1.0"
    f = reply.features
    assert f.scoring and f.logprobs and f.structured_output and f.embeddings
    # The shared engine steers; nothing is attached to it.
    assert f.steering and list(f.attached_saes) == []
    assert f.max_logprobs == 20 and f.seed_scope == generation_pb2.SEED_SCOPE_REQUEST
    table = {(s.field, s.route): s for s in reply.fields}
    assert table[("response_format", "chat")].honoured
    # An honoured field's remaining limit is said with it (the bridge's stream rule).
    assert table[("n", "chat")].honoured
    assert table[("structured_outputs", "completions")].honoured and table[("grammar",
                                                                           "chat")].honoured
    refused = table[("response_format", "completions")]
    assert not refused.honoured and refused.refusal_code == "response_format_unsupported"
    assert table[("echo", "completions")].honoured and not table[("echo", "chat")].honoured
    assert table[("tools", "chat")].honoured and not table[("tools", "completions")].honoured
    assert table[("tools", "completions")].refusal_code == "field_not_honoured"
    assert not table[("dimensions", "embeddings")].honoured


def test_rest_capabilities(stack):
    reply, content = request(stack.http_port, "GET", "/api/capabilities")
    assert reply.status == 200
    body = json.loads(content)
    assert body["model"] == MODEL and body["features"]["scoring"] is True
    assert {"field": "best_of", "route": "chat", "honoured": False, "reported": False,
            "refusal_code": "field_not_honoured",
            "reason": "best_of is not supported; use n"} in body["fields"]
    bias = next(f for f in body["fields"] if (f["field"], f["route"]) == ("logit_bias", "chat"))
    assert bias["honoured"] and "scoring" in bias["reason"]
    assert body["features"]["tokenization"] is True
