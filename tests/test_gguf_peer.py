"""The peer check: llama-cpp-python's own OpenAI server and miLLM serve the same
GGUF file, and greedy text is the same for the same prompts, on each export.

(bench/gguf_peer.py compares speed, against llama.cpp's C++ llama-server.)
llama_cpp.server's defaults are not OpenAI's: its sampling keeps
repeat_penalty 1.1, top_k 40 and min_p 0.05 even at temperature 0, so the
requests to it set them to neutral values. And miLLM never generates a
control token other than end-of-generation (a forged <|im_start|> would open
a new turn), where llama_cpp.server does: after "Tell me a story about the
river." the demo model's likeliest first token is <|im_start|>. The peer gets
the same ban, as a logit bias, so that the two compare greedy decoding under
the same rule.
"""

from __future__ import annotations

import openai
import pytest

from tests import harness

PROMPTS = ["Tell me a story about the river.", "What does the miller do in the morning?",
           "Hello!", "Where is the lighthouse?"]
NEUTRAL = {"repeat_penalty": 1.0, "top_k": 0, "min_p": 0.0}


def peer_settings() -> dict:
    """NEUTRAL, and <|im_start|> banned as miLLM bans it (the demo model's
    only control token that does not end a generation)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(harness.models_dir() / "millm-tiny" / "tokenizer.json"))
    return {**NEUTRAL, "logit_bias": {str(tokenizer.token_to_id("<|im_start|>")): -100}}


@pytest.fixture(scope="module")
def millm(tmp_path_factory):
    stack = harness.OwnStack(tmp_path_factory.mktemp("peer-millm"),
                             MILLM_MODEL="millm-tiny-gguf:F32")
    yield openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="x", max_retries=0,
                        timeout=60)
    stack.stop()


@pytest.mark.parametrize("model", ["millm-tiny-gguf:F32", "millm-tiny-gguf:Q8_0"])
def test_greedy_text_equals_llama_cpp_server(tmp_path, millm, model):
    peer, port = harness.start_llama_cpp_server(tmp_path, harness.gguf_file(model))
    settings = peer_settings()
    try:
        harness.wait_http(peer, f"http://127.0.0.1:{port}/v1/models", timeout=60)
        theirs = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                               max_retries=0, timeout=60)
        for prompt in PROMPTS:
            messages = [{"role": "user", "content": prompt}]
            ours = millm.chat.completions.create(model=model, messages=messages, temperature=0,
                                                 max_tokens=48)
            peer_reply = theirs.chat.completions.create(model=model, messages=messages,
                                                        temperature=0, max_tokens=48,
                                                        extra_body=settings)
            assert ours.choices[0].message.content == peer_reply.choices[0].message.content
            assert ours.choices[0].message.content.strip()
            assert ours.usage.prompt_tokens == peer_reply.usage.prompt_tokens
        raw = "Once upon a time"
        ours = millm.completions.create(model=model, prompt=raw, max_tokens=32, temperature=0)
        peer_reply = theirs.completions.create(model=model, prompt=raw, max_tokens=32,
                                               temperature=0, extra_body=settings)
        assert ours.choices[0].text == peer_reply.choices[0].text
    finally:
        peer.stop()
