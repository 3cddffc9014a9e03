"""Stop sequences end generation at once and are cut, even split across tokens."""

from __future__ import annotations

from millm.v1 import generation_pb2
from tests.conftest import MODEL
from tests.grpc_helpers import prompt_request, run

PROMPT = "The lighthouse keeper wrote"


def split_stop(generation_stub):
    """Generate greedily, then pick a stop string that straddles a token boundary.
    Each token's text comes from its log-probability entry, so the split does
    not depend on how many tokens each streamed response happened to carry."""
    responses = list(generation_stub.Generate(
        prompt_request(PROMPT, max_tokens=40, temperature=0, ignore_eos=True, logprobs=0),
        timeout=60))
    pieces = [score.token.text for r in responses for d in r.choices for score in d.logprobs]
    full = "".join(pieces)
    assert full == "".join(d.text for r in responses for d in r.choices)
    # Find two consecutive multi-character pieces after the first few tokens.
    offset = 0
    for k in range(len(pieces) - 1):
        if k >= 3 and len(pieces[k]) >= 2 and len(pieces[k + 1]) >= 2:
            cut = offset + len(pieces[k])
            stop = full[cut - 2: cut + 2]
            if full.find(stop) == cut - 2:
                return full, stop, cut - 2, k + 1
        offset += len(pieces[k])
    raise AssertionError(f"no split point in {pieces!r}")


def test_stop_split_across_tokens_grpc(generation_stub):
    full, stop, at, tokens_before = split_stop(generation_stub)
    _, texts, tokens, finish, usage, _ = run(
        generation_stub,
        prompt_request(PROMPT, max_tokens=40, temperature=0, ignore_eos=True, stop=[stop]),
    )
    assert texts[0] == full[:at]
    assert finish[0] == generation_pb2.FINISH_REASON_STOP
    # Generation ended on the token that completed the stop, not at max_tokens.
    assert usage.completion_tokens == tokens_before + 1
    # The last delta says which stop sequence ended the choice (Anthropic's
    # stop_sequence); the other stop, never written, is not it.
    responses = list(generation_stub.Generate(prompt_request(
        PROMPT, max_tokens=40, temperature=0, ignore_eos=True, stop=["\x01", stop]), timeout=60))
    last = [d for r in responses for d in r.choices][-1]
    assert (last.finish_reason, last.stop_sequence) == (generation_pb2.FINISH_REASON_STOP, stop)


def test_stop_streaming_and_not_agree(client, generation_stub):
    full, stop, at, _ = split_stop(generation_stub)
    kwargs = dict(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stop=[stop, "zzzz"],
                  extra_body={"ignore_eos": True})
    whole = client.completions.create(**kwargs)
    assert whole.choices[0].text == full[:at]
    assert whole.choices[0].finish_reason == "stop"
    streamed, finish = "", None
    for chunk in client.completions.create(stream=True, **kwargs):
        streamed += chunk.choices[0].text
        finish = chunk.choices[0].finish_reason or finish
    assert streamed == full[:at] and finish == "stop"


def test_chat_stop_string(client):
    base = dict(model=MODEL, messages=[{"role": "user", "content": "Tell me a story."}],
                max_tokens=30, temperature=0, extra_body={"ignore_eos": True})
    text = client.chat.completions.create(**base).choices[0].message.content
    word = text.split()[3]
    cut = client.chat.completions.create(stop=word, **base).choices[0]
    assert cut.message.content == text[: text.index(word)]
    assert cut.finish_reason == "stop"
