"""response_format on the GGUF engine: the transformers engine's grammar
masks on llama.cpp's logits (service/engines/gguf/constraint.py), so the same
schema subset, the same checks and the same answers, streamed or not."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests import harness
from tests.conftest import MODEL
from tests.json_prefix import is_json_prefix
from tests.schema_corpus import SCHEMAS

F32, Q8 = "millm-tiny-gguf:F32", "millm-tiny-gguf:Q8_0"
FORMAT_CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
CHECKED = ("judge-rich", "number-bounded-object", "ref-recursive", "anyof-objects",
           "pydantic-event", "format-date", "format-uuid", "exclusive-bounds",
           "integer-multiple-of", "array-of-enums", "pattern-in-object")
ASK = [{"role": "user", "content": "Describe the river in one JSON document."}]


@pytest.fixture(scope="module")
def gclient(tmp_path_factory):
    stack = harness.OwnStack(tmp_path_factory.mktemp("gguf-so"), MILLM_MODEL=F32)
    try:
        yield openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0,
                            timeout=60)
    finally:
        stack.stop()


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "doc", "schema": schema,
                                                   "strict": True}}


@pytest.mark.parametrize("model", [F32, Q8])
@pytest.mark.parametrize("name", CHECKED)
def test_documents_parse_and_validate(gclient, model, name):
    schema = SCHEMAS[name]
    finished = 0
    for seed in (1, 2, 3):
        reply = gclient.chat.completions.create(
            model=model, messages=ASK, max_tokens=120, temperature=1.0, seed=seed,
            response_format=schema_format(schema))
        choice = reply.choices[0]
        if choice.finish_reason == "stop":
            finished += 1
            jsonschema.validate(json.loads(choice.message.content), schema,
                                format_checker=FORMAT_CHECKER)
        else:
            assert choice.finish_reason == "length"
    assert finished >= 2, f"{name} on {model}: {finished} of 3 finished"


def test_json_object_is_an_object(gclient):
    """The grammar's guarantee, whatever the model writes: an answer that
    stopped is one JSON object, one cut short by max_tokens is the start of
    one (free keys let a small model ramble past any budget)."""
    for seed in range(6):
        reply = gclient.chat.completions.create(model=F32, messages=ASK, max_tokens=200,
                                                seed=seed, response_format={"type": "json_object"})
        text = reply.choices[0].message.content
        if reply.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(text), dict)
        else:
            assert reply.choices[0].finish_reason == "length" and is_json_prefix(text), text


def test_streamed_document_equals_the_whole_one(gclient):
    body = dict(model=Q8, messages=ASK, max_tokens=120, temperature=1.0, seed=5,
                response_format=schema_format(SCHEMAS["judge-rich"]))
    whole = gclient.chat.completions.create(**body).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or ""
                       for c in gclient.chat.completions.create(**body, stream=True)
                       if c.choices)
    assert streamed == whole and json.loads(whole)["verdict"] in ("pass", "fail")


def test_greedy_document_equals_the_transformers_engine(client, gclient):
    """Same masks, same logits (the F32 export equals the checkpoint): the same document."""
    body = dict(messages=ASK, max_tokens=120, temperature=0,
                response_format=schema_format(SCHEMAS["judge-rich"]))
    on_gguf = gclient.chat.completions.create(model=F32, **body).choices[0].message.content
    on_transformers = client.chat.completions.create(model=MODEL, **body)
    assert on_gguf == on_transformers.choices[0].message.content
    jsonschema.validate(json.loads(on_gguf), SCHEMAS["judge-rich"])


def test_the_same_refusals_as_on_transformers(gclient):
    for fields, code in [({"stop": ["}"]}, "response_format_unsupported"),
                         ({"response_format": schema_format({"not": {}})},
                          "response_format_unsupported")]:
        body = {"response_format": {"type": "json_object"}, **fields}
        with pytest.raises(openai.BadRequestError) as caught:
            gclient.chat.completions.create(model=F32, messages=ASK, max_tokens=8,
                                            extra_body=body)
        assert caught.value.code == code
