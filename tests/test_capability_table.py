"""The capability table is a promise: every FieldSupport row that
GetCapabilities reports is checked against what the REST bridge really does
(and for some honoured fields, what they do: logit_bias).

For both engines (millm-tiny on transformers, millm-tiny-gguf:F32 on
llama.cpp), each row (field, route) is sent with a value that asks for a
change (never a no-op such as null, false, [], n=1) in an otherwise valid,
small, greedy request to its route:

- honoured: the answer is 200 and the field is not in X-miLLM-Ignored-Fields
  (the bridge's only ignored-fields report; rest_bridge/serving/ignored_fields.py),
  and, for the fields in BEHAVIOUR, the answer does what the field asks (n
  choices for n, a choice out of `choice`, a match of a regex, yes or no
  under a yes|no grammar).
  Companion fields make the value servable (allowed_token_ids needs
  scoring mode, max_tokens 1; top_logprobs needs
  logprobs: true; return_tokens_as_token_ids needs log-probabilities to act on).
- reported: the field means nothing on that route: 200, and the field is
  named in X-miLLM-Ignored-Fields;
- refused: 400 with error.code == the row's refusal_code and error.param == field
  (on the messages route, Anthropic's envelope carries neither: 400
  invalid_request_error whose message names the field as not honoured).

The messages route (Anthropic's /v1/messages) gets Anthropic-shaped values
where its body has its own shape (tools, tool_choice) and keeps max_tokens,
which it requires.

`profile` is sent with a profile that exists: the transformers stack attaches
the demo SAE and saves one, so an honoured profile must answer 200 (a 404
profile_not_found would fail the cell). That stack is its own, not the session
stack, so the attached SAE does not leak into test_capabilities.

A field in the table without an entry in VALUES
fails test_every_reported_field_has_a_value (against the served table) and
its own cells (ids come from VALUES and service/requests/fields.RULES),
so new rows are covered.
"""

from __future__ import annotations

import itertools
import json
import re

import grpc
import pytest

from millm.v1 import server_service_pb2, server_service_pb2_grpc
from service.requests import fields
from tests import harness
from tests.http_helpers import call

TRANSFORMERS, GGUF = "millm-tiny", "millm-tiny-gguf:F32"
ROUTES = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
          "embeddings": "/v1/embeddings", "messages": "/v1/messages"}
IGNORED_HEADER = "x-millm-ignored-fields"
SAE = "sae_millm-tiny-res-l1"
PROFILE = "captable"
DROP = object()  # a fragment value that removes the key from the base body

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
ANTHROPIC_TOOL = {"name": "f", "input_schema": {"type": "object"}}

# field -> {route, or "*" for every route: keys added to (or DROPped from) the
# base body}. Each value asks for a change; companions make it servable.
VALUES: dict[str, dict[str, dict]] = {
    "n": {"*": {"n": 2}},
    "seed": {"*": {"seed": 7}},
    "stream_interval": {"*": {"stream_interval": 4}},
    "priority": {"*": {"priority": 1}},
    "max_completion_tokens": {"messages": {"max_completion_tokens": 2},
                              "*": {"max_completion_tokens": 2, "max_tokens": DROP}},
    "logprobs": {"chat": {"logprobs": True, "max_tokens": 1},
                 "*": {"logprobs": 2, "max_tokens": 1}},
    "allowed_token_ids": {"*": {"allowed_token_ids": [5, 6], "max_tokens": 1}},
    "echo": {"*": {"echo": True}},
    "extra_messages": {"*": {"extra_messages": [[{"role": "user", "content": "Hi"}]]}},
    "response_format": {"*": {"response_format": {"type": "json_object"}}},
    # Room for the longest choice: constrained tokens can be shorter than free ones.
    "structured_outputs": {"*": {"structured_outputs": {"choice": ["red", "green", "blue"]},
                                 "max_tokens": 8},
                           "completions": {"structured_outputs": {"regex": "[0-9]{3}-[0-9]{4}"},
                                           "max_tokens": 12}},
    "grammar": {"*": {"grammar": 'root ::= "yes" | "no"'}},
    "profile": {"*": {"profile": PROFILE}},
    "steering_intensity": {"*": {"steering_intensity": 0.5}},
    "return_sae_activations": {"*": {"return_sae_activations": {"sae_id": SAE, "top_k": 2}}},
    "steering_compare": {"*": {"steering_compare": True}},
    "top_logprobs": {"chat": {"top_logprobs": 2, "logprobs": True, "max_tokens": 1},
                     "*": {"top_logprobs": 2}},
    "return_tokens_as_token_ids": {
        "chat": {"return_tokens_as_token_ids": True, "logprobs": True, "max_tokens": 1},
        "completions": {"return_tokens_as_token_ids": True, "logprobs": 2, "max_tokens": 1},
        "*": {"return_tokens_as_token_ids": True}},
    "add_special_tokens": {"*": {"add_special_tokens": False}},
    "steering": {"*": {"steering": [{"layer": 1, "feature": 3, "strength": 6}]}},
    "dimensions": {"*": {"dimensions": 8}},
    "tools": {"messages": {"tools": [ANTHROPIC_TOOL]}, "*": {"tools": [TOOL]}},
    # tool_choice and parallel_tool_calls act on tools (alone they are reported).
    "tool_choice": {"chat": {"tool_choice": "auto", "tools": [TOOL]},
                    "messages": {"tool_choice": {"type": "auto"}, "tools": [ANTHROPIC_TOOL]},
                    "*": {"tool_choice": "auto"}},
    "parallel_tool_calls": {"chat": {"parallel_tool_calls": False, "tools": [TOOL]},
                            "*": {"parallel_tool_calls": False}},
    "functions": {"*": {"functions": [TOOL["function"]]}},
    "function_call": {"*": {"function_call": "auto"}},
    "logit_bias": {"*": {"logit_bias": {"5": 10}}},
    "best_of": {"*": {"best_of": 2}},
    "suffix": {"*": {"suffix": " the end"}},
    "audio": {"*": {"audio": {"voice": "alloy", "format": "wav"}}},
    "modalities": {"*": {"modalities": ["text", "audio"]}},
    "background": {"*": {"background": True}},
    "truncation": {"*": {"truncation": "auto"}},
    "conversation": {"*": {"conversation": "conv_1"}},
    "max_tool_calls": {"*": {"max_tool_calls": 2}},
    "prompt_cache_key": {"*": {"prompt_cache_key": "k1"}},
    "client_metadata": {"*": {"client_metadata": {"originator": "codex_exec"}}},
    "include": {"*": {"include": ["message.output_text.logprobs"]}},
    "thinking": {"*": {"thinking": {"type": "enabled", "budget_tokens": 2}}},
    "output_config": {"*": {"output_config": {"effort": "low"}}},
    "output_format": {"*": {"output_format": {"type": "json_schema", "schema": {
        "type": "object"}}}},
    "mcp_servers": {"*": {"mcp_servers": [{"type": "url", "url": "http://127.0.0.1:9/",
                                           "name": "x"}]}},
    "container": {"*": {"container": "container_1"}},
    "context_management": {"*": {"context_management": {"edits": [
        {"type": "clear_tool_uses_20250919"}]}}},
    # The demo model has no reasoning format: reported on chat too
    # (tests/test_model_formats.py serves models that have one).
    "reasoning_effort": {"*": {"reasoning_effort": "low"}},
    "thinking_token_budget": {"*": {"thinking_token_budget": 2}},
    "chat_template_kwargs": {"*": {"chat_template_kwargs": {"enable_thinking": False}}},
}


def _texts(body: dict) -> list[str]:
    if body.get("type") == "message":  # Anthropic's Message: its text blocks
        return ["".join(b["text"] for b in body["content"] if b["type"] == "text")]
    return [c["message"]["content"] if "message" in c else c["text"] for c in body["choices"]]


# field -> what an honoured answer (its JSON body) must show, whatever the route.
BEHAVIOUR = {
    "n": lambda body: len(body["choices"]) == 2,
    "structured_outputs": lambda body: all(
        t in ("red", "green", "blue") or re.fullmatch("[0-9]{3}-[0-9]{4}", t)
        for t in _texts(body)),
    "grammar": lambda body: _texts(body) == ["yes"] or _texts(body) == ["no"],
}


def base_body(route: str, model: str) -> dict:
    if route == "chat":
        return {"model": model, "messages": [{"role": "user", "content": "Hello!"}],
                "max_tokens": 4, "temperature": 0}
    if route == "completions":
        return {"model": model, "prompt": "Once upon a time", "max_tokens": 4,
                "temperature": 0}
    if route == "messages":
        return {"model": model, "messages": [{"role": "user", "content": "Hello!"}],
                "max_tokens": 4, "temperature": 0}
    return {"model": model, "input": "a river"}


def body_for(field: str, route: str, model: str) -> dict:
    fragment = VALUES[field].get(route, VALUES[field].get("*"))
    body = base_body(route, model)
    for key, value in fragment.items():
        if value is DROP:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def ignored(headers: dict) -> list[str]:
    """X-miLLM-Ignored-Fields as a list (RFC 8941 sf-strings)."""
    raw = headers.get(IGNORED_HEADER, "")
    return [re.sub(r"\\(.)", r"\1", s) for s in re.findall(r'"((?:[^"\\]|\\.)*)"', raw)]


# -- the stacks ----------------------------------------------------------------------------


def _steerable(stack) -> None:
    """Attach the demo SAE and save a profile, so profile and
    return_sae_activations can be honoured with 200."""
    reply = call(stack.http_port, "POST", f"/api/saes/{SAE}/attach", {})
    assert reply.status_code < 300, reply.text
    reply = call(stack.http_port, "POST", "/api/profiles", {
        "name": PROFILE, "entries": [{"layer": 1, "feature": 3, "strength": 6}]})
    assert reply.status_code < 300, reply.text


@pytest.fixture(scope="module")
def stacks(tmp_path_factory):
    started = {}
    try:
        started[TRANSFORMERS] = harness.OwnStack(tmp_path_factory.mktemp("captable-tf"))
        _steerable(started[TRANSFORMERS])
        started[GGUF] = harness.OwnStack(tmp_path_factory.mktemp("captable-gguf"),
                                         MILLM_MODEL=GGUF)
        _steerable(started[GGUF])
        yield started
    finally:
        for stack in started.values():
            stack.stop()


@pytest.fixture(scope="module")
def tables(stacks):
    """model -> {(field, route): FieldSupport}, from GetCapabilities."""
    out = {}
    for model, stack in stacks.items():
        with grpc.insecure_channel(stack.grpc_target) as channel:
            stub = server_service_pb2_grpc.ServerServiceStub(channel)
            reply = stub.GetCapabilities(server_service_pb2.GetCapabilitiesRequest(), timeout=10)
        assert reply.model == model
        out[model] = {(row.field, row.route): row for row in reply.fields}
        assert len(out[model]) == len(reply.fields), "a (field, route) pair is reported twice"
    return out


# -- the cells ------------------------------------------------------------------------------


def _fields() -> list[str]:
    # The in-process table gives the test ids; the served one is what is checked.
    return list(dict.fromkeys([*VALUES, *fields.RULES]))


def _cells() -> list:
    cells = []
    for model, field, route in itertools.product((TRANSFORMERS, GGUF), _fields(), ROUTES):
        cells.append(pytest.param(model, field, route, id=f"{model}-{field}-{route}"))
    return cells


def test_every_reported_field_has_a_value(tables):
    for model, table in tables.items():
        missing = sorted({field for field, _ in table} - set(VALUES))
        assert not missing, f"{model} reports fields with no entry in VALUES: {missing}"
        assert {route for _, route in table} == set(ROUTES), model


def test_rest_capabilities_match_grpc(stacks, tables):
    for model, stack in stacks.items():
        reply = call(stack.http_port, "GET", "/api/capabilities")
        assert reply.status_code == 200
        rest = {(r["field"], r["route"]): (r["honoured"], r["reported"], r["refusal_code"])
                for r in reply.json()["fields"]}
        assert rest == {k: (r.honoured, r.reported, r.refusal_code)
                        for k, r in tables[model].items()}


@pytest.mark.parametrize(("model", "field", "route"), _cells())
def test_capability_row_matches_behaviour(stacks, tables, model, field, route):
    assert field in VALUES, f"'{field}' is in the capability table but not in VALUES"
    row = tables[model].get((field, route))
    assert row is not None, f"GetCapabilities has no row ({field}, {route}): drop it from VALUES?"
    reply = call(stacks[model].http_port, "POST", ROUTES[route], body_for(field, route, model))
    error = reply.json().get("error", {}) if reply.status_code != 200 else {}
    if route == "messages" and not row.honoured and not row.reported:
        # Anthropic's envelope has no code or param: its message names the field.
        assert (reply.status_code, error.get("type")) == (400, "invalid_request_error"), (
            f"table: refused; server: {reply.status_code} {reply.text[:300]}")
        assert error["message"].startswith(f"'{field}' is not honoured"), error
        return
    observed = (f"status {reply.status_code}, code {error.get('code')}, param "
                f"{error.get('param')}, ignored {ignored(reply.headers)}: "
                f"{error.get('message', '')}")
    if row.honoured:
        assert reply.status_code == 200, f"table: honoured; server: {observed}"
        assert field not in ignored(reply.headers), f"table: honoured; server: {observed}"
        if field in BEHAVIOUR:
            assert BEHAVIOUR[field](reply.json()), f"'{field}' did not act: {reply.json()}"
    elif row.reported:
        assert reply.status_code == 200, f"table: reported; server: {observed}"
        assert field in ignored(reply.headers), f"table: reported; server: {observed}"
    else:
        expected = (400, row.refusal_code, field)
        assert (reply.status_code, error.get("code"), error.get("param")) == expected, (
            f"table: refused with {row.refusal_code}; server: {observed}")


# -- honoured fields do what they say -----------------------------------------------------------


@pytest.mark.parametrize("model", (TRANSFORMERS, GGUF))
@pytest.mark.parametrize("route", ("chat", "completions"))
def test_logit_bias_of_100_makes_its_token_the_answer(stacks, model, route):
    """The row's honoured cell, beyond "200 and not ignored": +100 on one
    token id, sampled at temperature 1, gives that token three times."""
    port = stacks[model].http_port
    ids = call(port, "POST", "/tokenize", {"model": model, "prompt": " river",
                                           "add_special_tokens": False}).json()["tokens"]
    assert len(ids) == 1
    body = {**base_body(route, model), "max_tokens": 3, "temperature": 1, "seed": 11,
            "logit_bias": {str(ids[0]): 100}}
    reply = call(port, "POST", ROUTES[route], body)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    text = choice["message"]["content"] if route == "chat" else choice["text"]
    assert (text, reply.json()["usage"]["completion_tokens"]) == (" river" * 3, 3)


# -- several refused fields at once -----------------------------------------------------------

REFUSED_TOGETHER = {"dimensions": 8, "suffix": "x", "best_of": 2,
                    "functions": [TOOL["function"]]}


def test_several_refused_fields_name_one_param(stacks):
    """Every key order, on two engine processes (both engines refuse all four
    fields on chat), names the same param: the first of them in the field
    table's order (requests/fields.py), whatever order a protobuf Struct map
    gives them in."""
    seen = {}
    keys = list(REFUSED_TOGETHER)
    orders = [keys, keys[::-1], keys[1:] + keys[:1], keys[2:] + keys[:2], sorted(keys)]
    for model, stack in stacks.items():
        for order in orders:
            body = {**base_body("chat", model), **{k: REFUSED_TOGETHER[k] for k in order}}
            reply = call(stack.http_port, "POST", ROUTES["chat"], body)
            error = reply.json()["error"]
            assert (reply.status_code, error["code"]) == (400, "field_not_honoured")
            assert error["param"] in REFUSED_TOGETHER
            seen[(model, tuple(order))] = error["param"]
    assert set(seen.values()) == {"dimensions"}, json.dumps(
        {f"{m} {','.join(o)}": p for (m, o), p in seen.items()}, indent=1)
