"""vLLM's structured_outputs and llama.cpp's grammar (issue 30), on both
engines, through the real OpenAI SDK and straight over gRPC.

What the issue's bar asks, on millm-tiny and millm-tiny-gguf: a `choice`
answer is one of the choices on ten seeds, a `regex` answer matches, an EBNF
grammar for yes|no answers yes or no. Besides: streamed too, per row beside
free rows (constrained and free requests at once, and n > 1), a header that
names the kind, the gRPC oneof, a structural tag, a schema given as
structured_outputs.json, and the refusals naming the field with the
compiler's message.
"""

from __future__ import annotations

import json
import re
import threading

import grpc
import openai
import pytest

from millm.v1 import generation_pb2, generation_service_pb2_grpc
from tests import harness
from tests.grpc_helpers import chat_request, error_info, prompt_request, run

MODELS = ("millm-tiny", "millm-tiny-gguf:Q8_0")
COLOURS = ["red", "green", "blue"]
PHONE = "[0-9]{3}-[0-9]{4}"
YES_NO = 'root ::= answer\nanswer ::= "yes" | "no"  # llama.cpp GBNF reads the same\n'
ASK = [{"role": "user", "content": "Pick a colour."}]


@pytest.fixture(scope="module", params=MODELS)
def served(request, tmp_path_factory):
    stack = harness.OwnStack(tmp_path_factory.mktemp("structured-outputs"),
                             MILLM_MODEL=request.param)
    try:
        yield request.param, stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[1].base_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def stub(served):
    with grpc.insecure_channel(served[1].grpc_target) as channel:
        yield generation_service_pb2_grpc.GenerationServiceStub(channel)


def test_a_choice_answers_one_of_the_choices_on_ten_seeds(served, client):
    model, _ = served
    answers = []
    for seed in range(10):
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=ASK, seed=seed, temperature=1.0,
            extra_body={"structured_outputs": {"choice": COLOURS}})
        assert raw.headers["x-millm-constrained"] == "choice"
        reply = raw.parse()
        assert reply.choices[0].finish_reason == "stop"
        answers.append(reply.choices[0].message.content)
    assert set(answers) <= set(COLOURS), answers


def test_a_regex_answer_matches_on_both_routes(served, client):
    model, _ = served
    chat = client.chat.completions.create(model=model, messages=ASK, seed=3,
                                          extra_body={"structured_outputs": {"regex": PHONE}})
    text = client.completions.create(model=model, prompt="Call me on", max_tokens=20, seed=4,
                                     extra_body={"structured_outputs": {"regex": PHONE}})
    for answer, finish in ((chat.choices[0].message.content, chat.choices[0].finish_reason),
                           (text.choices[0].text, text.choices[0].finish_reason)):
        assert re.fullmatch(PHONE, answer), answer
        assert finish == "stop"


def test_a_yes_no_grammar_answers_yes_or_no(served, client):
    model, _ = served
    for body in ({"grammar": YES_NO}, {"structured_outputs": {"grammar": YES_NO}}):
        for seed in range(3):
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=[{"role": "user", "content": "Is the river wide?"}],
                seed=seed, temperature=1.0, extra_body=body)
            assert raw.headers["x-millm-constrained"] == "grammar"
            assert raw.parse().choices[0].message.content in ("yes", "no")


def test_a_streamed_constraint_holds_chunk_by_chunk(served, client):
    model, _ = served
    stream = client.completions.create(model=model, prompt="Dial", max_tokens=20, stream=True,
                                       extra_body={"structured_outputs": {"regex": PHONE}})
    pieces, finish = [], None
    for chunk in stream:
        for choice in chunk.choices:
            pieces.append(choice.text)
            finish = choice.finish_reason or finish
    assert re.fullmatch(PHONE, "".join(pieces)) and finish == "stop"


def test_constrained_rows_run_beside_free_rows(served, client):
    """Constrained and free requests at once, and n choices each under the
    constraint: every row keeps its own mask (or none)."""
    model, _ = served
    results: dict[str, object] = {}

    def ask(name: str, **kwargs) -> None:
        results[name] = client.chat.completions.create(model=model, messages=ASK,
                                                       max_tokens=12, **kwargs)

    jobs = [threading.Thread(target=ask, args=(name,), kwargs=kwargs) for name, kwargs in (
        ("choice", {"n": 3, "temperature": 1.0,
                    "extra_body": {"structured_outputs": {"choice": COLOURS}}}),
        ("regex", {"extra_body": {"structured_outputs": {"regex": PHONE}}}),
        ("free", {"temperature": 0}),
    )]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join(timeout=120)
    assert [c.message.content in COLOURS for c in results["choice"].choices] == [True] * 3
    assert re.fullmatch(PHONE, results["regex"].choices[0].message.content)
    free = results["free"].choices[0].message.content
    alone = client.chat.completions.create(model=model, messages=ASK, max_tokens=12,
                                           temperature=0).choices[0].message.content
    assert free == alone and free not in COLOURS


def test_a_schema_as_structured_outputs_json(served, client):
    model, _ = served
    schema = {"type": "object", "properties": {"colour": {"enum": COLOURS}},
              "required": ["colour"], "additionalProperties": False}
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=ASK, seed=1, extra_body={"structured_outputs": {
            "json": schema, "disable_any_whitespace": True}})
    assert raw.headers["x-millm-constrained"] == "json_schema"
    # vLLM's tuning options change nothing here, and say so.
    assert '"structured_outputs.disable_any_whitespace"' in raw.headers["x-millm-ignored-fields"]
    assert json.loads(raw.parse().choices[0].message.content)["colour"] in COLOURS


def test_a_structural_tag_constrains_what_follows_its_trigger(served, client):
    model, _ = served
    tag = {"type": "structural_tag", "format": {
        "type": "sequence", "elements": [
            {"type": "const_string", "value": "Answer: "},
            {"type": "tag", "begin": "<c>", "content": {"type": "json_schema", "json_schema": {
                "enum": COLOURS}}, "end": "</c>"}]}}
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=ASK, seed=2, max_tokens=30,
        extra_body={"structured_outputs": {"structural_tag": tag}})
    assert raw.headers["x-millm-constrained"] == "structural_tag"
    answer = raw.parse().choices[0].message.content
    assert re.fullmatch(r'Answer: <c>"(red|green|blue)"</c>', answer), answer


def test_the_grpc_oneof_and_its_metadata(served, stub):
    model, _ = served
    request = prompt_request("Call", model=model, max_tokens=20, seed=5, n=2, temperature=1.0)
    request.structured_outputs.regex = PHONE
    meta, texts, _, finish, _, _ = run(stub, request)
    assert meta.constraint == generation_pb2.OUTPUT_CONSTRAINT_REGEX
    assert sorted(texts) == [0, 1] and all(re.fullmatch(PHONE, t) for t in texts.values())
    assert set(finish.values()) == {generation_pb2.FINISH_REASON_STOP}
    request = chat_request("Pick one.", model=model, max_tokens=8)
    request.structured_outputs.choice.choices.extend(COLOURS)
    meta, texts, *_ = run(stub, request)
    assert meta.constraint == generation_pb2.OUTPUT_CONSTRAINT_CHOICE and texts[0] in COLOURS


def test_a_grammar_the_compiler_refuses_names_the_field(served, client, stub):
    model, _ = served
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=ASK,
                                       extra_body={"grammar": "root ::= answer"})
    body = caught.value.body
    assert (body["code"], body["param"]) == ("invalid_parameter", "grammar")
    assert 'Rule "answer" is not defined' in body["message"]
    assert "/project/" not in body["message"]  # the compiler's log prefix is cut
    request = prompt_request("Call", model=model, max_tokens=4)
    request.structured_outputs.regex = "([0-9]"
    with pytest.raises(grpc.RpcError) as failed:
        run(stub, request)
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(failed.value)
    assert (info.reason, info.metadata["param"]) == ("invalid_parameter",
                                                     "structured_outputs.regex")
