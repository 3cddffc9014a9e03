"""Generated JSON bodies thrown at every /v1 route, /tokenize and /detokenize:
never a 5xx, always the OpenAI envelope on an error, and the server keeps
answering afterwards.

Bodies mix the fields each route knows (with values of the right type, the
wrong type, or out of range) with keys it has never heard of, so both the
bridge's JSON checks and the engine's rules get exercised; strings are now and
then thousands of characters or odd text, and any field may hold thousands of
keys or deep nesting (tests/fuzz_support.py). A stream is read to its end
and fails on an error event for a fault of the server, even one followed by
[DONE] (tests/sweep_support.py stream_problem). Each run draws new examples
from its own seed, printed when a test fails. Generations are kept short (max_tokens
is always sent, mostly small) so the run stays quick.
"""

from __future__ import annotations

import json

from hypothesis import event, given
from hypothesis import strategies as st

from tests.conftest import MODEL
from tests.fuzz_support import ANY_JSON, KEY, LONG_TEXT, ODD_TEXT, fuzz
from tests.fuzz_support import TEXT as ANY_TEXT
from tests.http_helpers import post
from tests.sweep_support import stream_problem

SPECIAL_TEXT = st.sampled_from(["<|im_start|>", "<|im_end|>", "<|endoftext|>", "", "é", "\x00"])
TEXT = st.one_of(st.text(max_size=30), st.builds(lambda a, b: a + b, st.text(max_size=8),
                                                 SPECIAL_TEXT), ANY_TEXT)
NAME = st.one_of(st.text(max_size=6), ODD_TEXT, LONG_TEXT)


def sometimes(strategy):
    """Mostly the field's plausible values, now and then any JSON at all."""
    return st.integers(0, 11).flatmap(lambda k: ANY_JSON if k == 0 else strategy)


CONTENT_PART = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "audio"])},
    optional={"text": TEXT, "image_url": ANY_JSON},
)


def with_unknown_keys(known: st.SearchStrategy, max_size: int = 2) -> st.SearchStrategy:
    """Known fields plus a few keys nobody declared (the known ones win a clash)."""
    extras = st.dictionaries(KEY, ANY_JSON, max_size=max_size)
    return st.tuples(known, extras).map(lambda pair: {**pair[1], **pair[0]})


MESSAGE = with_unknown_keys(st.fixed_dictionaries(
    {"role": sometimes(st.sampled_from(
        ["system", "developer", "user", "assistant", "tool", "function", "wizard", ""]))},
    optional={"content": sometimes(st.one_of(TEXT, st.lists(CONTENT_PART, max_size=3))),
              "name": sometimes(NAME)},
), max_size=1)
SHARED_FIELDS = {
    "temperature": sometimes(st.floats(-1, 3)),
    "top_p": sometimes(st.floats(-0.5, 1.5)),
    "top_k": sometimes(st.integers(-3, 50)),
    "min_p": sometimes(st.floats(-0.5, 1.5)),
    "max_completion_tokens": sometimes(st.integers(-2, 6)),
    "stop": sometimes(st.one_of(TEXT, st.lists(TEXT, max_size=6))),
    "n": sometimes(st.integers(-1, 4)),
    "seed": sometimes(st.integers(-5, 2**33)),
    "frequency_penalty": sometimes(st.floats(-3, 3)),
    "presence_penalty": sometimes(st.floats(-3, 3)),
    "repetition_penalty": sometimes(st.floats(-1, 3)),
    "stream": sometimes(st.booleans()),
    "stream_options": sometimes(st.fixed_dictionaries({}, optional={
        "include_usage": sometimes(st.booleans())})),
    "user": sometimes(NAME),
    "logprobs": sometimes(st.one_of(st.booleans(), st.integers(0, 5))),
    "tools": sometimes(st.lists(ANY_JSON, max_size=2)),
    "response_format": sometimes(st.sampled_from([{"type": "text"}, {"type": "json_object"}])),
    "logit_bias": sometimes(st.dictionaries(
        st.one_of(KEY, st.integers(-5, 9000).map(str)),
        st.one_of(st.integers(-150, 150), st.floats(-101, 101)), max_size=3)),
    "profile": sometimes(NAME),
    "steering_intensity": sometimes(st.one_of(st.floats(-1, 3), st.sampled_from(
        ["off", "min", "max", "loud"]))),
    "return_sae_activations": sometimes(st.fixed_dictionaries({}, optional={
        "sae_id": sometimes(NAME),
        "features": sometimes(st.lists(st.integers(-2, 300), max_size=3)),
        "top_k": sometimes(st.integers(-1, 70)),
        "positions": sometimes(st.one_of(
            st.sampled_from(["last", "prompt", "completion", "all", "middle"]),
            st.fixed_dictionaries({"start": st.integers(-2, 20), "end": st.integers(-2, 20)}))),
        "read_point": sometimes(st.sampled_from(["post_steering", "pre_steering", "x"]))})),
}


def body(required: dict) -> st.SearchStrategy:
    return with_unknown_keys(st.fixed_dictionaries(
        {"model": sometimes(st.one_of(st.sampled_from([MODEL, MODEL, "other-model", ""]),
                                      NAME)),
         # Always present and mostly small, so a valid body generates quickly.
         "max_tokens": sometimes(st.integers(-2, 6)), **required},
        optional=SHARED_FIELDS,
    ))


CHAT_BODIES = body({"messages": sometimes(st.lists(MESSAGE, max_size=4))})
COMPLETION_BODIES = body({"prompt": sometimes(st.one_of(
    TEXT, st.lists(TEXT, max_size=3), st.lists(st.integers(-5, 1000), max_size=6)))})
EMBEDDING_BODIES = with_unknown_keys(st.fixed_dictionaries(
    {"model": sometimes(st.one_of(st.sampled_from([MODEL, "other-model", ""]), NAME)),
     "input": sometimes(st.one_of(
         TEXT, st.lists(TEXT, max_size=4), st.lists(st.integers(-5, 1000), max_size=6),
         st.lists(st.lists(st.integers(-5, 1000), max_size=4), max_size=3)))},
    optional={"encoding_format": sometimes(st.sampled_from(["float", "base64", "int8", ""])),
              "dimensions": sometimes(st.integers(-2, 4096)),
              "user": sometimes(NAME)},
))
TOOL = st.fixed_dictionaries({"type": sometimes(st.just("function"))}, optional={
    "function": sometimes(st.fixed_dictionaries({"name": sometimes(NAME)}, optional={
        "parameters": sometimes(st.just({"type": "object"})), "description": TEXT}))})
TOKENIZE_BODIES = with_unknown_keys(st.fixed_dictionaries(
    {"model": sometimes(st.one_of(st.sampled_from([MODEL, MODEL, "other-model", ""]), NAME))},
    optional={"prompt": sometimes(TEXT), "messages": sometimes(st.lists(MESSAGE, max_size=4)),
              "add_generation_prompt": sometimes(st.booleans()),
              "continue_final_message": sometimes(st.booleans()),
              "add_special_tokens": sometimes(st.booleans()),
              "parse_special_tokens": sometimes(st.booleans()),
              "return_token_strs": sometimes(st.booleans()),
              "tools": sometimes(st.lists(TOOL, max_size=2))},
))
DETOKENIZE_BODIES = with_unknown_keys(st.fixed_dictionaries(
    {"model": sometimes(st.sampled_from([MODEL, "other-model", ""])),
     "tokens": sometimes(st.lists(st.integers(-5, 9000), max_size=12))}))
STRICT = st.sampled_from([{}, {"X-miLLM-Strict": "1"}, {"X-miLLM-Strict": "maybe"}])

FUZZ = fuzz(max_examples=200)


def check(stack, path: str, payload: dict, headers: dict) -> None:
    reply, content = post(stack.http_port, path, payload, headers=headers)
    assert reply.status < 500, (reply.status, str(payload)[:2000], content[:500])
    if reply.status >= 400:
        error = json.loads(content)["error"]
        event(f"{reply.status} {error['code']}")  # shown by --hypothesis-show-statistics
        assert set(error) == {"message", "type", "param", "code"}, content
        assert error["message"] and error["type"] == "invalid_request_error"
    else:
        event("200")
    if reply.status < 400 and payload.get("stream") is True:
        # Read to its end: a server fault inside the stream fails too.
        assert content.endswith(b"data: [DONE]\n\n")
        assert stream_problem(content) is None, (stream_problem(content), str(payload)[:2000])
    elif reply.status < 400:
        answer = json.loads(content)
        if path == "/tokenize":
            assert answer["count"] == len(answer["tokens"])
        elif path == "/detokenize":
            assert isinstance(answer["prompt"], str)
        else:
            assert answer["data"] if path == "/v1/embeddings" else answer["choices"]


@FUZZ
@given(payload=CHAT_BODIES, headers=STRICT)
def test_chat_bodies(stack, payload, headers):
    check(stack, "/v1/chat/completions", payload, headers)


@FUZZ
@given(payload=COMPLETION_BODIES, headers=STRICT)
def test_completion_bodies(stack, payload, headers):
    check(stack, "/v1/completions", payload, headers)


@fuzz(max_examples=100)
@given(payload=EMBEDDING_BODIES, headers=STRICT)
def test_embedding_bodies(stack, payload, headers):
    check(stack, "/v1/embeddings", payload, headers)


@fuzz(max_examples=100)
@given(payload=TOKENIZE_BODIES, headers=STRICT)
def test_tokenize_bodies(stack, payload, headers):
    check(stack, "/tokenize", payload, headers)


@fuzz(max_examples=60)
@given(payload=DETOKENIZE_BODIES, headers=STRICT)
def test_detokenize_bodies(stack, payload, headers):
    check(stack, "/detokenize", payload, headers)


@fuzz(max_examples=40)
@given(raw=st.one_of(st.binary(max_size=64), ANY_JSON.map(lambda v: json.dumps(v).encode())),
       path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]))
def test_arbitrary_bytes(stack, raw, path):
    reply, content = post(stack.http_port, path, None, raw=raw)
    assert reply.status == 400, (raw, content)
    assert json.loads(content)["error"]["code"] in (
        "invalid_json", "invalid_type", "missing_required_parameter",
        "invalid_parameter")  # a string that is not Unicode text (an unpaired surrogate)


def test_still_answering_after_the_fuzzing(client):
    reply = client.chat.completions.create(model=MODEL, max_tokens=3,
                                           messages=[{"role": "user", "content": "Hello!"}])
    assert reply.choices[0].finish_reason in ("stop", "length")
