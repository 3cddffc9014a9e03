"""Open WebUI's default chat request on the demo model (issue 27).

Open WebUI sends its built-in tools with every chat request (36 definitions,
some 26,000 characters of JSON) and asks for up to 1,000 tokens; a model with
a 1,024-token window refused it before answering anything. The fixture
tests/data/open_webui_tools.json is written in the project's own words after
the shape of those tools: the same number, names like Open WebUI's, and about
the same size. The demo model has to take the whole request and answer 200,
and its tokenizer has to keep such JSON to about 3 characters a token."""

from __future__ import annotations

import json
import pathlib

import openai
import pytest

from service.chat_template import render
from tests import harness
from tests.conftest import MODEL
from tests.http_helpers import request

TOOLS = json.loads((pathlib.Path(__file__).parent / "data" / "open_webui_tools.json")
                   .read_text(encoding="utf-8"))
# English the tokenizer never saw (the tools' JSON is not in its text either).
PROSE = ("The old bridge over the canal was built of grey stone a long time ago. Every spring "
         "the council talks about painting the railings, and every autumn the railings are "
         "still the same dull green. When you plan a long walk, pack less than you think you "
         "need: a bottle of water, something to eat, a map and a warm layer will cover most "
         "days. Please summarise the following meeting notes in three bullet points.")


def test_the_fixture_is_the_size_of_open_webuis_tools():
    assert len(TOOLS) == 36
    assert 24_000 < len(json.dumps(TOOLS)) < 28_000


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(harness.models_dir() / MODEL)


@pytest.mark.parametrize("name", ["tools JSON", "prose"])
def test_the_tokenizer_gives_about_three_characters_a_token(tokenizer, name):
    if name == "prose":
        text = PROSE
    else:
        rendered = render([{"role": "user", "content": "Hi"}], TOOLS)
        text = rendered[rendered.index("<tools>\n"):rendered.index("\n</tools>")]
    tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert len(text) / tokens >= 3.0, (name, len(text) / tokens)


def test_capabilities_report_a_real_window(stack):
    reply, content = request(stack.http_port, "GET", "/api/capabilities")
    assert reply.status == 200
    assert int(json.loads(content)["context_window"]) >= 32_768


def test_a_chat_with_open_webuis_tools_and_1000_tokens_answers(stack):
    client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0,
                           timeout=110)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What time is it?"}],
        tools=TOOLS, max_tokens=1000, temperature=0)
    assert reply.usage.prompt_tokens > 5_000  # the tools reached the model
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
