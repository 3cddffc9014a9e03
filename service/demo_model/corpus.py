"""The demo model's training text: corpus.txt parsed into prose, plain chats
and tool conversations, each conversation rendered by the model's own chat
template. The tokenizer and model build (build.py), the SAE build (sae.py)
and bench/demo_model_quality.py read the same documents from here.
"""

from __future__ import annotations

import json
import pathlib

from service.chat_template import render

CORPUS = pathlib.Path(__file__).with_name("corpus.txt")
VOCABULARY_TEXT = pathlib.Path(__file__).with_name("vocabulary.txt")

ROLES = ("system", "user", "assistant", "tool", "call", "tools", "function")

def parse_corpus(text: str) -> tuple[list[str], list[tuple[list[dict] | None, list[dict]]]]:
    """Split the corpus into prose paragraphs and conversations: (tools or
    None, messages), in Hugging Face's shape for apply_chat_template."""
    prose, blocks, functions = [], [], {}
    for block in text.split("\n\n"):
        lines = [ln for ln in block.strip().splitlines() if not ln.startswith("#")]
        if not lines:
            continue
        turns = []
        for line in lines:
            role, sep, content = line.partition(": ")
            if sep and role in ROLES:
                turns.append((role, content))
        if not turns or len(turns) != len(lines):
            prose.append(" ".join(lines))
        elif all(role == "function" for role, _ in turns):
            for _, content in turns:
                function = json.loads(content)
                functions[function["name"]] = function
        else:
            blocks.append(turns)
    return prose, [conversation(turns, functions) for turns in blocks]

def conversation(turns: list[tuple[str, str]],
                 functions: dict[str, dict]) -> tuple[list[dict] | None, list[dict]]:
    tools, messages = None, []
    for role, content in turns:
        if role == "tools":
            tools = [{"type": "function", "function": functions[name.strip()]}
                     for name in content.split(",")]
        elif role == "call":
            name, _, arguments = content.partition(" ")
            call = {"type": "function",
                    "function": {"name": name, "arguments": json.loads(arguments)}}
            if messages and messages[-1].get("tool_calls"):
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            messages.append({"role": role, "content": content})
    return tools, messages

def training_documents() -> tuple[list[str], list[str]]:
    """Prose and plain chats, then the tool conversations, each conversation
    rendered by the model's own template."""
    prose, chats = parse_corpus(CORPUS.read_text(encoding="utf-8"))
    plain = [render(messages) for tools, messages in chats if not tools]
    with_tools = [render(messages, tools) for tools, messages in chats if tools]
    return prose + plain, with_tools


def answer_prompts() -> list[str]:
    """Every question of the corpus's conversations as a prompt for an
    answer: after the conversation so far, and alone."""
    _, chats = parse_corpus(CORPUS.read_text(encoding="utf-8"))
    prompts = set()
    for tools, messages in chats:
        for i, message in enumerate(messages):
            if message["role"] == "user":
                prompts.add(render(messages[: i + 1], tools, add_generation_prompt=True))
                prompts.add(render([message], tools, add_generation_prompt=True))
    return sorted(prompts)
