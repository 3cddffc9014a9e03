"""POST /v1/chat/completions through the real openai SDK, sync and async."""

from __future__ import annotations

import asyncio
import re

import openai
import pytest

from service.demo_model.build import CONTEXT_WINDOW
from tests.conftest import MODEL

HELLO = [{"role": "user", "content": "Hello!"}]
FINGERPRINT = re.compile(r"^millm:millm-tiny@[0-9a-f]{12}:float32/unquantized:transformers$")


def test_non_streaming_shape(client):
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=20)
    assert reply.object == "chat.completion"
    assert reply.id.startswith("chatcmpl-")
    assert reply.model == MODEL
    assert FINGERPRINT.match(reply.system_fingerprint)
    assert len(reply.choices) == 1
    choice = reply.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    usage = reply.usage
    assert usage.prompt_tokens > 0 and 0 < usage.completion_tokens <= 20
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_max_tokens_ends_with_length(client):
    # A prose prompt: the model continues it rather than closing the turn.
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me a story."}],
        max_tokens=3, temperature=0,
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 3


def test_max_completion_tokens_is_max_tokens(client):
    a = client.chat.completions.create(model=MODEL, messages=HELLO, temperature=0,
                                       max_completion_tokens=4)
    b = client.chat.completions.create(model=MODEL, messages=HELLO, temperature=0, max_tokens=4)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.completion_tokens == b.usage.completion_tokens <= 4


def test_system_and_developer_roles_render_alike(client):
    def answer(role):
        return client.chat.completions.create(
            model=MODEL, temperature=0, max_tokens=12,
            messages=[{"role": role, "content": "You are concise."},
                      {"role": "user", "content": "Is fire hot?"}],
        ).choices[0].message.content

    assert answer("developer") == answer("system")


def test_text_content_parts_are_joined(client):
    parts = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=8,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hel"},
                                               {"type": "text", "text": "lo!"}]}],
    )
    plain = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=8,
                                           messages=HELLO)
    assert parts.choices[0].message.content == plain.choices[0].message.content


def test_n_gives_n_choices(client):
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, n=3, max_tokens=10,
                                           seed=42)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    completion = sum(1 for _ in reply.choices)
    assert completion == 3
    # With a seed, choices still differ from each other (each has its own generator)
    # but the whole set is reproducible.
    again = client.chat.completions.create(model=MODEL, messages=HELLO, n=3, max_tokens=10,
                                           seed=42)
    assert [c.message.content for c in again.choices] == [c.message.content for c in reply.choices]


def test_streaming_chunks(client):
    stream = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=15,
                                            stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
    assert len(finishes) == 1 and chunks[-1].choices[0].finish_reason == finishes[0]
    # The final chunk carries the finish and the usage (the miLLM reference's shape).
    usage = chunks[-1].usage
    if finishes[0] == "length":
        assert usage.completion_tokens == 15
    else:
        assert finishes[0] == "stop" and 0 < usage.completion_tokens <= 15
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_streaming_matches_non_streaming(client):
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Tell me a story."}],
                  max_tokens=30, seed=7)
    whole = client.chat.completions.create(**kwargs)
    pieces = client.chat.completions.create(stream=True, **kwargs)
    text, finish = "", None
    for chunk in pieces:
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    assert text == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason


def test_streaming_include_usage(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    last = chunks[-1]
    assert last.choices == []
    assert last.usage.completion_tokens <= 6
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_n_above_one_streams_each_choice(client):
    # Issue 30: the choices' chunks interleave, each naming its index, and
    # each choice finishes once; joined, they equal the unstreamed answer.
    kwargs = dict(model=MODEL, messages=HELLO, n=3, max_tokens=6, seed=11, temperature=1.0)
    whole = client.chat.completions.create(**kwargs)
    texts, finished = {}, {}
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                assert choice.index not in finished
                finished[choice.index] = choice.finish_reason
    assert sorted(texts) == sorted(finished) == [0, 1, 2]
    assert [texts[i] for i in range(3)] == [c.message.content for c in whole.choices]


def test_seed_is_reproducible_and_echoed(client):
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Tell me a story."}],
                  max_tokens=40, temperature=1.0)
    raw = client.chat.completions.with_raw_response.create(seed=1234, **kwargs)
    assert raw.headers["x-millm-seed"] == '1234;scope="request"'
    first = raw.parse().choices[0].message.content
    second = client.chat.completions.create(seed=1234, **kwargs).choices[0].message.content
    assert first == second
    others = {client.chat.completions.create(seed=s, **kwargs).choices[0].message.content
              for s in (1, 2, 3, 4)}
    assert len(others | {first}) > 1, "different seeds should not all give the same text"


def test_no_seed_header_without_seed(client):
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=HELLO,
                                                           max_tokens=2)
    assert "x-millm-seed" not in raw.headers


def test_greedy_is_deterministic(client):
    kwargs = dict(model=MODEL, messages=HELLO, max_tokens=20, temperature=0)
    texts = {client.chat.completions.create(**kwargs).choices[0].message.content
             for _ in range(3)}
    assert len(texts) == 1


def test_async_client_streaming_and_not(async_client):
    async def main():
        reply = await async_client.chat.completions.create(model=MODEL, messages=HELLO,
                                                           max_tokens=8, seed=3)
        stream = await async_client.chat.completions.create(model=MODEL, messages=HELLO,
                                                            max_tokens=8, seed=3, stream=True)
        text = ""
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
        await async_client.close()
        return reply.choices[0].message.content, text

    whole, streamed = asyncio.run(main())
    assert whole == streamed


def test_concurrent_requests_interleave(async_client):
    """A short request that starts after a long one finishes first: the model
    thread takes turns between requests instead of running them one by one."""

    async def main():
        order = []

        async def go(name, max_tokens, prompt):
            await async_client.completions.create(model=MODEL, prompt=prompt,
                                                  max_tokens=max_tokens, temperature=0,
                                                  extra_body={"ignore_eos": True})
            order.append(name)

        long = asyncio.create_task(go("long", 600, "The river ran"))
        await asyncio.sleep(0.3)
        await go("short", 3, "The market")
        await long
        await async_client.close()
        return order

    assert asyncio.run(main()) == ["short", "long"]


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=HELLO)
    assert err.value.code == "model_not_found"
    assert err.value.body["param"] == "model"


def test_bad_value_is_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=HELLO, temperature=3)
    assert err.value.body["param"] == "temperature"
    assert err.value.code == "invalid_parameter"


def test_context_length_exceeded(client):
    """A prompt past the window is refused; max_tokens past the room the
    prompt leaves is capped instead (tests/test_agent_requests.py), unless
    the caller is strict."""
    too_long = [{"role": "user", "content": "mill " * (CONTEXT_WINDOW + 100)}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=too_long, max_tokens=4)
    assert err.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=CONTEXT_WINDOW,
                                       extra_headers={"X-miLLM-Strict": "1"})
    assert err.value.code == "context_length_exceeded"


def test_stream_refused_before_it_starts(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=HELLO, stream=True)


def test_a_trailing_assistant_message_is_continued_not_restarted(client):
    partial = "Good"
    messages = [*HELLO, {"role": "assistant", "content": partial}]
    continued = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                               temperature=0)
    # What continuing means: the conversation before the partial, rendered with
    # the generation prompt, then the partial as raw text.
    rendered = f"<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n{partial}"
    raw = client.completions.create(model=MODEL, prompt=rendered, max_tokens=8, temperature=0,
                                    extra_body={"parse_special_tokens": True})
    assert continued.choices[0].message.content == raw.choices[0].text
    assert continued.usage.prompt_tokens == raw.usage.prompt_tokens
    # Restarting would close the partial turn and open a new one: a longer prompt.
    closed = (f"<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n{partial}"
              "<|im_end|>\n<|im_start|>assistant\n")
    restarted = client.completions.create(model=MODEL, prompt=closed, max_tokens=1,
                                          extra_body={"parse_special_tokens": True})
    assert restarted.usage.prompt_tokens > continued.usage.prompt_tokens
