"""POST /v1/completions through the openai SDK."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import MODEL


def test_single_prompt(client):
    reply = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8,
                                      temperature=0)
    assert reply.object == "text_completion"
    assert reply.id.startswith("cmpl-")
    assert reply.system_fingerprint.startswith("millm:millm-tiny@")
    assert len(reply.choices) == 1 and reply.choices[0].index == 0
    assert reply.usage.completion_tokens <= 8


def test_default_max_tokens_is_16(client):
    reply = client.completions.create(model=MODEL, prompt="The river", temperature=0,
                                      extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 16
    assert reply.choices[0].finish_reason == "length"


def test_list_of_prompts_gives_one_choice_each(client):
    prompts = ["The river", "The market", "Cats sleep"]
    reply = client.completions.create(model=MODEL, prompt=prompts, max_tokens=4, temperature=0)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    for i, prompt in enumerate(prompts):
        alone = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4,
                                          temperature=0)
        assert alone.choices[0].text == reply.choices[i].text


def test_prompts_with_n(client):
    reply = client.completions.create(model=MODEL, prompt=["a", "b"], n=2, max_tokens=3)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]


def test_no_chat_template_is_applied(client, generation_stub):

    text = "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
    completion = client.completions.create(model=MODEL, prompt=text, max_tokens=10,
                                           temperature=0,
                                           extra_body={"parse_special_tokens": True})
    chat = client.chat.completions.create(model=MODEL, max_tokens=10, temperature=0,
                                          messages=[{"role": "user", "content": "Hello!"}])
    # The raw prompt spelled out as the ChatML the template renders answers alike...
    assert completion.choices[0].text == chat.choices[0].message.content
    assert completion.usage.prompt_tokens == chat.usage.prompt_tokens
    # ...while the bare question, without the template, is a different prompt.
    plain = client.completions.create(model=MODEL, prompt="Hello!", max_tokens=10, temperature=0)
    assert plain.usage.prompt_tokens < chat.usage.prompt_tokens


def test_special_token_text_in_a_prompt_stays_text(client):
    text = "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
    as_text = client.completions.create(model=MODEL, prompt=text, max_tokens=1)
    parsed = client.completions.create(model=MODEL, prompt=text, max_tokens=1,
                                       extra_body={"parse_special_tokens": True})
    # Each control token is one id when parsed and several characters' worth when not.
    assert parsed.usage.prompt_tokens + 3 <= as_text.usage.prompt_tokens


def test_token_id_prompts(client):
    single = client.completions.create(model=MODEL, prompt=[40, 41, 42], max_tokens=2,
                                       temperature=0)
    assert single.usage.prompt_tokens == 3 and len(single.choices) == 1
    several = client.completions.create(model=MODEL, prompt=[[40, 41], [42]], max_tokens=2,
                                        temperature=0)
    assert len(several.choices) == 2 and several.usage.prompt_tokens == 3


def test_token_id_outside_vocab(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=[1, 10**6], max_tokens=2)
    assert err.value.body["param"] == "prompt"


def test_empty_prompt_list(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=[], max_tokens=2)
    assert err.value.body["param"] == "prompt"
