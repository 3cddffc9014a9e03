"""Scoring, logprobs, echo and embeddings, checked against the demo model
computed directly with torch in this process (within 1e-5)."""

from __future__ import annotations

import base64
import json
import math
import struct

import openai
import pytest
import torch

from millm.v1 import generation_pb2, scoring_service_pb2
from tests import harness
from tests.conftest import MODEL
from tests.grpc_helpers import error_info
from tests.http_helpers import post

TOL = 1e-5
PROMPT = "The river ran past the mill and"
HELLO = [{"role": "user", "content": "Hello!"}]


@pytest.fixture(scope="module")
def direct():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = harness.models_dir() / MODEL
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, tokenizer


def logits_of(direct, ids: list[int]) -> torch.Tensor:
    model, _ = direct
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()


def ids_of(direct, text: str, add_special: bool = True) -> list[int]:
    return direct[1](text, add_special_tokens=add_special, split_special_tokens=True)["input_ids"]


# -- completion scoring --


def test_allowed_tokens_are_normalised_over_the_set(client, direct):
    ids = ids_of(direct, PROMPT)
    expected = torch.log_softmax(logits_of(direct, ids)[-1], dim=-1)
    a, b = int(torch.topk(expected, 9).indices[3]), int(torch.topk(expected, 9).indices[8])
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, logprobs=2,
                                      extra_body={"allowed_token_ids": [a, b],
                                                  "return_tokens_as_token_ids": True})
    choice = reply.choices[0]
    top = choice.logprobs.top_logprobs[0]
    assert set(top) == {f"token_id:{a}", f"token_id:{b}"}
    assert abs(math.exp(top[f"token_id:{a}"]) + math.exp(top[f"token_id:{b}"]) - 1) < 1e-6
    restricted = torch.log_softmax(logits_of(direct, ids)[-1][[a, b]], dim=-1)
    assert abs(top[f"token_id:{a}"] - float(restricted[0])) < TOL
    assert abs(top[f"token_id:{b}"] - float(restricted[1])) < TOL
    # The answer is the more probable allowed token, and it is what the logprobs report.
    assert choice.logprobs.tokens == [f"token_id:{a}"]
    assert choice.text == direct[1].decode([a])
    assert choice.finish_reason == "length"
    assert choice.logprobs.text_offset == [len(PROMPT)]
    assert reply.usage.completion_tokens == 1


def test_unrestricted_scoring_matches_log_softmax(client, direct):
    ids = ids_of(direct, PROMPT)
    expected = torch.log_softmax(logits_of(direct, ids)[-1], dim=-1)
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, logprobs=5,
                                      temperature=0.7,
                                      extra_body={"return_tokens_as_token_ids": True})
    lp = reply.choices[0].logprobs
    # Scoring reads the distribution: temperature divides the logits first.
    scaled = torch.log_softmax(logits_of(direct, ids)[-1] / 0.7, dim=-1)
    best = torch.topk(scaled, 5)
    assert list(lp.top_logprobs[0]) == [f"token_id:{int(i)}" for i in best.indices]
    for value, index in zip(best.values, best.indices, strict=True):
        assert abs(lp.top_logprobs[0][f"token_id:{int(index)}"] - float(value)) < TOL
    assert lp.tokens[0] == f"token_id:{int(torch.argmax(expected))}"
    assert abs(lp.token_logprobs[0] - float(scaled.max())) < TOL


def test_text_keys_merge_ids_that_decode_alike(stack):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1, "logprobs": 20}
    reply, content = post(stack.http_port, "/v1/completions", body)
    top = json.loads(content)["choices"][0]["logprobs"]["top_logprobs"][0]
    assert 0 < len(top) <= 20
    assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-6


def test_allowed_ids_without_logprobs_constrain_and_report_nothing(client, direct):
    ids = ids_of(direct, PROMPT)
    last = logits_of(direct, ids)[-1]
    allowed = [40, 41, 42, 43]
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1,
                                      extra_body={"allowed_token_ids": allowed})
    assert reply.choices[0].logprobs is None
    assert reply.choices[0].text == direct[1].decode([allowed[int(torch.argmax(last[allowed]))]])


def test_add_special_tokens_false_and_token_id_prompts(client, direct):
    ids = ids_of(direct, PROMPT, add_special=False)
    as_text = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, logprobs=0,
                                        extra_body={"add_special_tokens": False})
    as_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=1, logprobs=0)
    assert as_text.usage.prompt_tokens == as_ids.usage.prompt_tokens == len(ids)
    assert as_text.choices[0].logprobs.token_logprobs == pytest.approx(
        as_ids.choices[0].logprobs.token_logprobs, abs=TOL)
    assert as_text.choices[0].logprobs.top_logprobs == [{}]  # logprobs 0: no alternatives


# -- chat scoring --


def test_chat_scoring_equals_completion_scoring_of_the_rendered_prompt(client, direct):
    _, tokenizer = direct
    rendered = tokenizer.apply_chat_template(HELLO, add_generation_prompt=True, tokenize=False)
    chat = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1,
                                          logprobs=True, top_logprobs=3)
    text = client.completions.create(model=MODEL, prompt=rendered, max_tokens=1, logprobs=3,
                                     extra_body={"add_special_tokens": False,
                                                 "parse_special_tokens": True})
    entry = chat.choices[0].logprobs.content[0]
    assert chat.choices[0].message.content == text.choices[0].text == entry.token
    assert abs(entry.logprob - text.choices[0].logprobs.token_logprobs[0]) < TOL
    assert entry.bytes == list(entry.token.encode())
    assert [t.token for t in entry.top_logprobs] == list(text.choices[0].logprobs.top_logprobs[0])
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    expected = torch.log_softmax(logits_of(direct, ids)[-1], dim=-1)
    assert abs(entry.logprob - float(expected.max())) < TOL
    assert chat.usage.prompt_tokens == len(ids)


def test_chat_top_logprobs_range_is_named(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1, logprobs=True,
                                       top_logprobs=21)
    assert caught.value.body["param"] == "top_logprobs"


def test_extra_messages_are_choices_in_input_order(client):
    second = [{"role": "user", "content": "Tell me about the sea."}]
    both = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8,
                                          temperature=0, extra_body={"extra_messages": [second]})
    first_alone = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8,
                                                 temperature=0)
    second_alone = client.chat.completions.create(model=MODEL, messages=second, max_tokens=8,
                                                  temperature=0)
    assert [c.index for c in both.choices] == [0, 1]
    assert both.choices[0].message.content == first_alone.choices[0].message.content
    assert both.choices[1].message.content == second_alone.choices[0].message.content
    scored = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1,
                                            logprobs=True, extra_body={"extra_messages": [second]})
    assert [c.index for c in scored.choices] == [0, 1]
    assert all(len(c.logprobs.content) == 1 for c in scored.choices)


# -- generation logprobs and echo --


def test_generation_logprobs_for_every_token(client):
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=100, logprobs=5,
                                      extra_body={"ignore_eos": True,
                                                  "return_tokens_as_token_ids": True})
    lp = reply.choices[0].logprobs
    assert reply.usage.completion_tokens == 100
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 100
    # Keyed by id nothing merges: exactly five alternatives, most likely first, none
    # above the distribution's total.
    for top in lp.top_logprobs:
        values = list(top.values())
        assert len(top) == 5 and values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-6
    assert all(v <= 0 for v in lp.token_logprobs)
    # Offsets walk through the completion from the end of the prompt.
    assert lp.text_offset[0] == len(PROMPT)
    assert lp.text_offset == sorted(lp.text_offset)


def test_greedy_generation_logprobs_match_teacher_forcing(client, direct):
    _, tokenizer = direct
    ids = ids_of(direct, PROMPT)
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                                      logprobs=2, extra_body={"ignore_eos": True,
                                                              "return_tokens_as_token_ids": True})
    lp = reply.choices[0].logprobs
    generated = [int(t.removeprefix("token_id:")) for t in lp.tokens]
    logits = logits_of(direct, ids + generated)
    banned = [i for i in tokenizer.all_special_ids]  # masked for every row; eos too here
    for step, token in enumerate(generated):
        row = logits[len(ids) - 1 + step].clone()
        row[banned] = float("-inf")
        expected = torch.log_softmax(row, dim=-1)
        assert token == int(torch.argmax(expected))
        assert abs(lp.token_logprobs[step] - float(expected[token])) < 1e-4


def test_streamed_logprobs_cover_the_text(client):
    stream = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12,
                                            logprobs=True, top_logprobs=2, stream=True,
                                            extra_body={"ignore_eos": True})
    entries, text = [], ""
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs:
                entries.extend(choice.logprobs.content)
    assert len(entries) == 12
    assert "".join(e.token for e in entries) == text
    assert all(len(e.top_logprobs) == 2 for e in entries)


def test_a_choice_ended_by_the_end_token_counts_it_once_everywhere(client):
    # Greedy chat on the demo model ends its turn well before 200 tokens.
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=200,
                                           temperature=0, logprobs=True)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    entries = choice.logprobs.content
    assert len(entries) == reply.usage.completion_tokens
    # The end token adds no text, so its entry has none: the entries still spell the content.
    assert entries[-1].token == "" and entries[-1].bytes == []
    assert "".join(e.token for e in entries) == choice.message.content


def test_echo_prompt_logprobs(client, direct):
    ids = ids_of(direct, PROMPT)
    expected = torch.log_softmax(logits_of(direct, ids), dim=-1)
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True,
                                      logprobs=1)
    choice = reply.choices[0]
    assert choice.text == PROMPT
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for p in range(1, len(ids)):
        assert abs(lp.token_logprobs[p] - float(expected[p - 1, ids[p]])) < TOL
    assert lp.text_offset[0] == 0
    assert reply.usage.completion_tokens == 0


def test_lm_eval_loglikelihood_request(client, direct):
    """What lm-evaluation-harness's local-completions model sends for loglikelihood."""
    context = ids_of(direct, "The lighthouse keeper", add_special=False)
    continuation = ids_of(direct, " climbed the stairs", add_special=False)
    reply = client.completions.create(model=MODEL, prompt=context + continuation, max_tokens=1,
                                      echo=True, logprobs=1, temperature=0)
    lp = reply.choices[0].logprobs
    assert len(lp.token_logprobs) == len(context) + len(continuation) + 1
    answer = sum(lp.token_logprobs[len(context):-1])
    logits = torch.log_softmax(logits_of(direct, context + continuation), dim=-1)
    expected = sum(float(logits[len(context) + i - 1, t]) for i, t in enumerate(continuation))
    assert abs(answer - expected) < 1e-4
    # Greedy check the harness also makes: every continuation token is the top one.
    greedy = all(max(top, key=top.get) == tok for top, tok in
                 zip(lp.top_logprobs[len(context):-1], lp.tokens[len(context):-1], strict=True))
    assert greedy == all(int(torch.argmax(logits[len(context) + i - 1])) == t
                         for i, t in enumerate(continuation))


def test_echo_then_generation(client):
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, echo=True,
                                      logprobs=1, extra_body={"ignore_eos": True})
    choice = reply.choices[0]
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    assert len(choice.logprobs.tokens) == reply.usage.prompt_tokens + 5
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, echo=True)
    assert plain.choices[0].text.startswith(PROMPT) and plain.choices[0].logprobs is None


# -- embeddings --


def mean_pooled(direct, text: str) -> torch.Tensor:
    model, tokenizer = direct
    ids = tokenizer(text)["input_ids"]
    with torch.inference_mode():
        hidden = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
    return hidden.float().mean(dim=0)


def test_embeddings_float_and_base64_match_the_model(client, direct):
    texts = ["a", "The river ran past the mill and the wheel turned all day long.", "Cats"]
    floats = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    # Left to choose, the SDK asks for base64 and decodes it itself.
    b64 = client.embeddings.create(model=MODEL, input=texts)
    assert [d.index for d in floats.data] == [0, 1, 2]
    for text, f, b in zip(texts, floats.data, b64.data, strict=True):
        expected = mean_pooled(direct, text)
        assert len(f.embedding) == expected.shape[0]
        assert max(abs(x - float(y)) for x, y in zip(f.embedding, expected, strict=True)) < TOL
        # Both encodings carry the same float32 values.
        assert b.embedding == pytest.approx(f.embedding, abs=TOL)
    explicit = client.embeddings.create(model=MODEL, input=texts[:1], encoding_format="base64")
    raw = base64.b64decode(explicit.data[0].embedding)
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(
        floats.data[0].embedding, abs=TOL)
    assert floats.usage.prompt_tokens == sum(len(direct[1](t)["input_ids"]) for t in texts)


def test_embedding_base64_on_the_wire(stack):
    reply, content = post(stack.http_port, "/v1/embeddings",
                          {"model": MODEL, "input": "a", "encoding_format": "base64"})
    raw = base64.b64decode(json.loads(content)["data"][0]["embedding"])
    values = struct.unpack(f"<{len(raw) // 4}f", raw)
    as_float, content2 = post(stack.http_port, "/v1/embeddings", {"model": MODEL, "input": "a"})
    assert list(values) == pytest.approx(json.loads(content2)["data"][0]["embedding"], abs=TOL)


def test_padding_does_not_change_an_embedding(client):
    alone = client.embeddings.create(model=MODEL, input="a").data[0].embedding
    batched = client.embeddings.create(
        model=MODEL, input=["a", "a much longer input that forces padding " * 4]).data[0]
    assert batched.embedding == pytest.approx(alone, abs=TOL)


def test_embeddings_of_token_ids(client, direct):
    ids = direct[1]("Cats")["input_ids"]
    by_ids = client.embeddings.create(model=MODEL, input=ids).data[0].embedding
    by_text = client.embeddings.create(model=MODEL, input="Cats").data[0].embedding
    assert by_ids == pytest.approx(by_text, abs=TOL)


# -- gRPC --


def test_grpc_score(scoring_stub, direct):
    ids = ids_of(direct, PROMPT)
    request = scoring_service_pb2.ScoreRequest(
        model=MODEL, prompt=generation_pb2.PromptInput(prompts=[generation_pb2.Prompt(
            token_ids=generation_pb2.TokenIds(ids=ids))]),
        allowed_token_ids=[40, 41], top_logprobs=2)
    reply = scoring_stub.Score(request, timeout=30)
    restricted = torch.log_softmax(logits_of(direct, ids)[-1][[40, 41]], dim=-1)
    top = {t.token_id: t.logprob for t in reply.choices[0].next.top}
    assert set(top) == {40, 41}
    assert abs(top[40] - float(restricted[0])) < TOL
    assert reply.prompt_tokens == len(ids) and reply.model == MODEL

    import grpc

    bad = scoring_service_pb2.ScoreRequest(model=MODEL, prompt=request.prompt,
                                           allowed_token_ids=[10**6])
    with pytest.raises(grpc.RpcError) as caught:
        scoring_stub.Score(bad, timeout=30)
    info = error_info(caught.value)
    assert (info.reason, info.metadata["param"]) == ("invalid_scoring_request",
                                                     "allowed_token_ids")


def test_grpc_embed(embedding_stub, direct):
    from millm.v1 import embedding_service_pb2

    reply = embedding_stub.Embed(embedding_service_pb2.EmbedRequest(
        model=MODEL, inputs=[generation_pb2.Prompt(text="Cats")]), timeout=30)
    expected = mean_pooled(direct, "Cats")
    assert list(reply.embeddings[0].values) == pytest.approx(expected.tolist(), abs=TOL)


# -- non-finite logits --


def test_non_finite_logits_where_they_reach_the_answer():
    from service.engines import scores
    from service.errors import EngineError

    ctx = scores.TokenTable(4, [b"a", b"b", b"c", b"d"])
    allowed = torch.tensor([0, 1])
    # -inf outside the allowed set is fine (padded vocabularies look like that).
    fine = scores.score_position(ctx, torch.tensor([1.0, 2.0, float("-inf"), 0.0]), allowed, 2)
    assert fine.token.token_id == 1 and len(fine.top) == 2
    for logits, where in [
        (torch.tensor([float("nan"), 2.0, 0.0, 0.0]), allowed),   # NaN on an allowed token
        (torch.tensor([1.0, float("inf"), 0.0, 0.0]), None),      # +inf, unrestricted
        (torch.tensor([1.0, 2.0, 0.0, float("nan")]), None),      # NaN anywhere, unrestricted
        (torch.tensor([float("-inf"), 2.0, 0.0, 0.0]), allowed),  # a reported token at -inf
    ]:
        with pytest.raises(EngineError) as caught:
            scores.score_position(ctx, logits, where, 2)
        assert caught.value.code == "non_finite_logits"
    # NaN outside the allowed set does not reach the answer.
    ok = scores.score_position(ctx, torch.tensor([1.0, 2.0, float("nan"), 0.0]), allowed, 1)
    assert ok.token.token_id == 1
