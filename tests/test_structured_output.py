"""response_format: every document that ends with "stop" parses and validates."""

from __future__ import annotations

import json
import re

import grpc
import jsonschema
import openai
import pytest

from millm.v1 import generation_pb2
from service import structured_output
from service.errors import EngineError
from service.generation.documents import DocumentCheck
from service.generation.job import ChoiceDelta, StepOutput
from tests.conftest import MODEL
from tests.grpc_helpers import chat_request, error_info, run
from tests.http_helpers import post
from tests.json_prefix import is_json_prefix
from tests.schema_corpus import OPEN, SCHEMAS, UNSUPPORTED

CHAT = "/v1/chat/completions"
ASK = [{"role": "user", "content": "Answer in JSON."}]
SEEDS = (1, 2, 3)


def schema_format(schema: dict, name: str = "s") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "strict": True, "schema": schema}}


def constrained(stack, response_format: dict, **fields):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 120, **fields,
            "response_format": response_format}
    reply, content = post(stack.http_port, CHAT, body)
    return reply, json.loads(content)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_corpus_outputs_parse_and_validate(stack, name):
    schema = SCHEMAS[name]
    jsonschema.Draft202012Validator.check_schema(schema)
    stopped = 0
    for seed in SEEDS:
        reply, body = constrained(stack, schema_format(schema), seed=seed, temperature=1.0)
        assert reply.status == 200, body
        choice = body["choices"][0]
        if choice["finish_reason"] == "stop":
            stopped += 1
            # Formats too: what the engine promises is what its validator checks.
            jsonschema.validate(json.loads(choice["message"]["content"]), schema,
                                format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        else:
            assert choice["finish_reason"] == "length"
    # The corpus bounds its strings: the demo model must finish most documents.
    if name not in OPEN:
        assert stopped >= 2, f"{name}: only {stopped} of {len(SEEDS)} documents finished"


def test_judge_example_for_twenty_seeds(stack):
    schema = SCHEMAS["judge"]
    for seed in range(20):
        reply, body = constrained(stack, schema_format(schema, "judge_v1"), seed=seed)
        assert reply.status == 200
        assert reply.getheader("X-miLLM-Constrained") == 'json_schema;name="judge_v1"'
        assert body["choices"][0]["finish_reason"] == "stop"
        assert json.loads(body["choices"][0]["message"]["content"]) in (
            {"label": "humor"}, {"label": "not_humor"})


def test_json_object_is_an_object(stack):
    for seed in range(6):
        reply, body = constrained(stack, {"type": "json_object"}, seed=seed, max_tokens=40)
        assert reply.status == 200
        assert reply.getheader("X-miLLM-Constrained") == "json_object"
        choice = body["choices"][0]
        text = choice["message"]["content"]
        assert text.startswith("{")
        if choice["finish_reason"] == "stop":
            assert isinstance(json.loads(text), dict)
        else:
            # The demo model rambles inside free keys; cut short, it is still an object's start.
            assert choice["finish_reason"] == "length" and is_json_prefix(text), text


def test_strict_false_is_still_enforced_and_compact(stack):
    fmt = {"type": "json_schema", "json_schema": {"name": "loose", "strict": False,
                                                  "schema": SCHEMAS["object-required"]}}
    reply, body = constrained(stack, fmt, seed=5)
    text = body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(text), SCHEMAS["object-required"])
    # Compact separators: no ", " or ": " outside the string values (the
    # model may write either inside one).
    outside = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    assert ", " not in outside and ": " not in outside


def test_n_choices_each_constrained(stack):
    reply, body = constrained(stack, schema_format(SCHEMAS["array-of-enums"]), n=4, seed=9)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    for choice in body["choices"]:
        assert choice["finish_reason"] == "stop"
        jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMAS["array-of-enums"])


def test_streaming_equals_non_streaming_for_a_seed(client):
    kwargs = dict(model=MODEL, messages=ASK, max_tokens=80, seed=11,
                  response_format=schema_format(SCHEMAS["judge-rich"]))
    whole = client.chat.completions.create(**kwargs).choices[0]
    raw = client.chat.completions.with_raw_response.create(stream=True, **kwargs)
    assert raw.headers["x-millm-constrained"] == 'json_schema;name="s"'
    pieces, finish = [], None
    for chunk in raw.parse():
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == whole.message.content
    assert finish == whole.finish_reason == "stop"


def test_constrained_and_free_rows_share_a_batch_without_interfering(client):
    import concurrent.futures

    free = dict(model=MODEL, messages=[{"role": "user", "content": "Tell me about rivers."}],
                max_tokens=30, temperature=0)
    alone = client.chat.completions.create(**free).choices[0].message.content
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        jobs = [pool.submit(client.chat.completions.create, model=MODEL, messages=ASK,
                            max_tokens=60, response_format=schema_format(SCHEMAS["judge-rich"]))
                for _ in range(4)]
        mixed = pool.submit(client.chat.completions.create, **free)
        for job in jobs:
            choice = job.result().choices[0]
            if choice.finish_reason == "stop":
                jsonschema.validate(json.loads(choice.message.content), SCHEMAS["judge-rich"])
        assert mixed.result().choices[0].message.content == alone


def test_grpc_metadata_names_the_constraint(generation_stub):
    request = chat_request("Answer in JSON.", max_tokens=40, seed=2)
    request.response_format.json_schema.name = "judge_v1"
    request.response_format.json_schema.schema_json = json.dumps(SCHEMAS["judge"])
    meta, texts, _, finish, *_ = run(generation_stub, request)
    assert meta.constraint == generation_pb2.OUTPUT_CONSTRAINT_JSON_SCHEMA
    assert meta.constraint_name == "judge_v1"
    assert finish[0] == generation_pb2.FINISH_REASON_STOP
    assert json.loads(texts[0]) in ({"label": "humor"}, {"label": "not_humor"})

    request = chat_request("Hi", max_tokens=2)
    request.response_format.text.SetInParent()
    meta, *_ = run(generation_stub, request)
    assert meta.constraint == generation_pb2.OUTPUT_CONSTRAINT_UNSPECIFIED


@pytest.mark.parametrize("keyword", sorted(UNSUPPORTED))
def test_unsupported_keywords_are_refused_with_their_pointer(stack, keyword):
    schema, pointer = UNSUPPORTED[keyword]
    reply, body = constrained(stack, schema_format(schema))
    assert reply.status == 400, body
    error = body["error"]
    assert (error["code"], error["param"]) == ("response_format_unsupported", "response_format")
    assert pointer in error["message"]


def test_every_problem_is_named_at_once(stack):
    schema = {"type": "object", "properties": {"x": {"type": "number", "multipleOf": 3},
                                               "y": {"not": {}}}}
    _, body = constrained(stack, schema_format(schema))
    assert "/properties/x/multipleOf" in body["error"]["message"]
    assert "/properties/y/not" in body["error"]["message"]


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "object", "properties": {"s": {"type": "string",
                                                 "description": "x" * 70_000}}}, "bytes"),
        ({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(257)}},
         "properties"),
        ({"$ref": "#/$defs/missing"}, "no such definition"),
        ({"type": "text"}, "not a JSON type"),
        ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(unclosed"}}},
         "pattern"),
    ],
    ids=["too-large", "too-many-properties", "dangling-ref", "bad-type", "bad-pattern"],
)
def test_schema_limits_and_mistakes(stack, schema, words):
    reply, body = constrained(stack, schema_format(schema))
    assert reply.status == 400
    assert body["error"]["code"] == "response_format_unsupported"
    assert words in body["error"]["message"]


def test_nesting_limit(stack):
    schema: dict = {"type": "integer"}
    for _ in range(33):
        schema = {"type": "array", "items": schema}
    reply, body = constrained(stack, schema_format(schema))
    assert reply.status == 400 and "deeper than 32" in body["error"]["message"]
    for _ in range(2):
        schema = schema["items"]
    reply, _ = constrained(stack, schema_format(schema), max_tokens=4)
    assert reply.status == 200


def test_refusals_before_generation(client):
    judge = schema_format(SCHEMAS["judge"])
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="x", extra_body={"response_format": judge})
    assert caught.value.code == "response_format_unsupported"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=ASK, stop=["}"],
                                       response_format=judge)
    assert (caught.value.code, caught.value.body["param"]) == (
        "response_format_unsupported", "response_format")


def test_grpc_raw_prompt_with_response_format_is_refused(generation_stub):
    from tests.grpc_helpers import prompt_request

    request = prompt_request("x", max_tokens=2)
    request.response_format.json_object.SetInParent()
    with pytest.raises(grpc.RpcError) as caught:
        list(generation_stub.Generate(request, timeout=30))
    assert error_info(caught.value).reason == "response_format_unsupported"


def test_a_finished_document_that_fails_validation_is_refused():
    # The grammar keeps documents valid, so force the check with a forged step.
    check = DocumentCheck(structured_output.Constraint(
        structured_output.JSON_SCHEMA, "s", SCHEMAS["judge"]))
    check.check(StepOutput((ChoiceDelta(0, '{"label":', (1,)),)))
    with pytest.raises(EngineError) as caught:
        check.check(StepOutput((ChoiceDelta(0, '"funny"}', (2,), "stop"),)))
    assert caught.value.code == "constrained_output_invalid"
    assert "/label" in caught.value.message
    # Cut by max_tokens: incomplete by definition, so not checked.
    DocumentCheck(structured_output.Constraint(structured_output.JSON_OBJECT)).check(
        StepOutput((ChoiceDelta(0, '{"a', (1,), "length"),)))
    with pytest.raises(EngineError):
        DocumentCheck(structured_output.Constraint(structured_output.JSON_OBJECT)).check(
            StepOutput((ChoiceDelta(0, "[1]", (1,), "stop"),)))


def test_same_schema_compiles_once(stack, client):
    from tests.conftest import inference_status  # noqa: F401 - shares the session engine

    schema = {"type": "object", "properties": {"only_here_7": {"type": "boolean"}},
              "required": ["only_here_7"]}
    reordered = {"required": ["only_here_7"], "properties": {"only_here_7": {"type": "boolean"}},
                 "type": "object"}
    for s in (schema, reordered, schema):
        reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=20,
                                               response_format=schema_format(s))
        assert json.loads(reply.choices[0].message.content)["only_here_7"] in (True, False)
    assert structured_output.Constraint("json_schema", "a", schema).key == \
        structured_output.Constraint("json_schema", "b", reordered).key
