"""The ChatML template with tools (service/chat_template.py), rendered by both
engines' renderers: transformers' apply_chat_template on the demo model's own
tokenizer, and llama-cpp-python's Jinja2ChatFormatter (the GGUF engine's) on
the same template, which the GGUF export carries. And the demo model, greedy,
calls get_weather when asked about the weather with the tool offered."""

from __future__ import annotations

import pytest

from service.chat_template import CHATML, render
from tests import harness
from tests.conftest import MODEL

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {}}}}

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris and in Nice?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        # OpenAI's shape: the arguments as a JSON string, written as is.
        {"id": "call_2", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Nice"}'}},
    ]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18}'},
    {"role": "tool", "tool_call_id": "call_2", "content": '{"temperature": 22}'},
    {"role": "assistant", "content": "18 degrees in Paris, 22 in Nice."},
    {"role": "user", "content": "And the time?"},
    {"role": "assistant", "content": "Let me look.",
     "tool_calls": [{"type": "function", "function": {"name": "get_time", "arguments": {}}}]},
    {"role": "tool", "content": "12:00"},
]

EXPECTED = (
    "<|im_start|>system\n"
    "You are a helpful assistant.\n"
    "\n"
    "# Tools\n"
    "\n"
    "You may call one or more functions to assist with the user query.\n"
    "\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": '
    '"Get the current weather in a city.", "parameters": {"type": "object", '
    '"properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n'
    '{"type": "function", "function": {"name": "get_time", "parameters": '
    '{"type": "object", "properties": {}}}}\n'
    "</tools>\n"
    "\n"
    "For each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "What is the weather in Paris and in Nice?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    "</tool_call>\n"
    "<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Nice"}}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "<tool_response>\n"
    '{"temperature": 18}\n'
    "</tool_response>\n"
    "<tool_response>\n"
    '{"temperature": 22}\n'
    "</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
    "18 degrees in Paris, 22 in Nice.<|im_end|>\n"
    "<|im_start|>user\n"
    "And the time?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "Let me look.\n"
    "<tool_call>\n"
    '{"name": "get_time", "arguments": {}}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "<tool_response>\n"
    "12:00\n"
    "</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
)

PLAIN = [{"role": "user", "content": "Hi"}]
PLAIN_EXPECTED = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def model_path():
    return harness.models_dir() / MODEL


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def llama_cpp_render(messages, tools=None) -> str:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    formatter = Jinja2ChatFormatter(CHATML, eos_token="<|im_end|>", bos_token="<|endoftext|>",
                                    add_generation_prompt=True)
    return formatter(messages=messages, tools=tools).prompt


def test_the_demo_model_and_its_gguf_export_carry_the_template(tokenizer, model_path):
    from gguf import GGUFReader

    from service.demo_model import gguf_export

    assert tokenizer.chat_template == CHATML
    for quant in gguf_export.QUANTIZATIONS:
        path = model_path.parent / gguf_export.REPO_ID / gguf_export.file_name(quant)
        field = GGUFReader(path).fields["tokenizer.chat_template"]
        assert field.contents() == CHATML


def test_tools_tool_calls_and_tool_responses_render_exactly(tokenizer):
    tools = [WEATHER, TIME]
    assert tokenizer.apply_chat_template(CONVERSATION, tools=tools, add_generation_prompt=True,
                                         tokenize=False) == EXPECTED
    assert llama_cpp_render(CONVERSATION, tools) == EXPECTED
    assert render(CONVERSATION, tools, add_generation_prompt=True) == EXPECTED


def test_tools_without_a_system_message_get_a_system_turn_of_their_own(tokenizer):
    rendered = tokenizer.apply_chat_template(PLAIN, tools=[TIME], add_generation_prompt=True,
                                             tokenize=False)
    assert rendered.startswith("<|im_start|>system\n# Tools\n\n")
    assert rendered.endswith("</tool_call><|im_end|>\n" + PLAIN_EXPECTED)
    assert llama_cpp_render(PLAIN, [TIME]) == rendered


def test_a_plain_conversation_renders_as_before(tokenizer):
    assert tokenizer.apply_chat_template(PLAIN, add_generation_prompt=True,
                                         tokenize=False) == PLAIN_EXPECTED
    assert llama_cpp_render(PLAIN) == PLAIN_EXPECTED
    chat = [{"role": "system", "content": "Be brief."}, *PLAIN,
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    expected = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in chat)
    assert tokenizer.apply_chat_template(chat, tokenize=False) == expected
    assert llama_cpp_render(chat) == expected + "<|im_start|>assistant\n"


def test_the_demo_model_calls_the_weather_tool(tokenizer, model_path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    inputs = tokenizer.apply_chat_template(messages, tools=[WEATHER], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=40, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:])
    assert answer.startswith('<tool_call>\n{"name": "get_weather"'), answer


# -- system turns after the first message (service/chat_template.py) ----------------------

# A template that takes a system turn only at the head, as Qwen3's does.
HEAD_ONLY = ("{%- for m in messages %}{%- if m.role == 'system' and not loop.first %}"
             "{{ raise('System message must be at the beginning.') }}{%- endif %}"
             "<{{ m.role }}>{{ m.content }}{%- endfor %}")
# One with no system role at all, as Gemma 2's.
NO_SYSTEM = ("{%- for m in messages %}{%- if m.role == 'system' %}"
             "{{ raise('System role not supported') }}{%- endif %}"
             "<{{ m.role }}>{{ m.content }}{%- endfor %}")


def _renderer(template: str):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def fail(message):
        raise jinja2.TemplateError(message)

    env = ImmutableSandboxedEnvironment()
    env.globals["raise"] = fail
    return lambda messages: env.from_string(template).render(messages=messages)


MID = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
       {"role": "system", "content": "Tools load later."}, {"role": "user", "content": "Go"}]


def test_a_system_turn_mid_conversation_stays_where_the_template_allows():
    from service.chat_template import render_folding_system

    rendered = render_folding_system(lambda m: render(m, add_generation_prompt=True), MID)
    assert rendered.index("Tools load later.") > rendered.index("Hi")


def test_a_later_system_turn_is_merged_into_the_leading_one_where_refused():
    from service.chat_template import render_folding_system

    assert render_folding_system(_renderer(HEAD_ONLY), MID) == (
        "<system>Be brief.\n\nTools load later.<user>Hi<user>Go")
    # No leading system turn: one is made.
    assert render_folding_system(_renderer(HEAD_ONLY), MID[1:]) == (
        "<system>Tools load later.<user>Hi<user>Go")


def test_merged_system_text_is_folded_into_the_first_user_turn_without_a_system_role():
    from service.chat_template import render_folding_system

    assert render_folding_system(_renderer(NO_SYSTEM), MID) == (
        "<user>Be brief.\n\nTools load later.\n\nHi<user>Go")
