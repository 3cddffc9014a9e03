"""Short coding-agent sessions for the demo model's training (issue 42).

Claude Code, Codex CLI and Qwen Code send a first request of 11,000 to
19,000 tokens: a long system prompt, a dozen tools with long descriptions,
environment notes and reminders, sometimes a system turn after the user's
question, and only then the question. A model trained on short chats reads
that as noise and never calls a tool. These sessions teach the demo model the
loop those clients run: offered file and shell tools in each client's shape,
asked about a file, it calls the fitting tool (Read, read_file, or
exec_command with `cat`), reads the result and answers in words.

The length is what matters, and is the part made up: each session buries the
task in text drawn from vocabulary.txt (the project's own docs: instructions,
markdown and JSON, as agent prompts are), at lengths from none to a few
thousand tokens, in the places the clients put theirs. Only the assistant
turns are learned (`learned_spans`): the filler is read, never written, and
its words the model never writes read as one average token (unused_tokens.py),
as they will in a real prompt. The sessions come from a seeded generator of
their own, so the build stays deterministic.

What it cannot learn at this size: what a file says. Its answers are one of
the sentences below, seldom the right one; the call is what the session needs.
"""

from __future__ import annotations

import random
import re

from service.chat_template import render
from service.demo_model.corpus import VOCABULARY_TEXT

# Files a session asks about: name, content, and an answer about it.
FILES = [
    ("calc.py", '"""A small calculator."""\n\n\ndef add(a, b):\n    return a + b\n\n\n'
     'def multiply(a, b):\n    return a * b\n',
     "calc.py is a small calculator. It defines add and multiply, and prints a sum "
     "and a product when it is run."),
    ("greet.py", 'def greet(name):\n    return f"Hello, {name}!"\n\n\nprint(greet("world"))\n',
     "greet.py defines greet, which says hello to a name, and prints a greeting to the world."),
    ("server.js", 'const http = require("http");\nhttp.createServer((req, res) => '
     'res.end("ok")).listen(8080);\n',
     "server.js starts a small web server on port 8080 that answers every request with ok."),
    ("notes.md", "# Notes\n\n- water the garden\n- buy bread\n- call the library\n",
     "notes.md is a short list of things to do: water the garden, buy bread and call the "
     "library."),
    ("config.toml", '[server]\nport = 8000\nhost = "127.0.0.1"\n',
     "config.toml sets the server's port to 8000 and its host to 127.0.0.1."),
    ("shapes.py", "import math\n\n\ndef circle_area(r):\n    return math.pi * r * r\n",
     "shapes.py computes the area of a circle from its radius."),
    ("clock.js", "setInterval(() => console.log(new Date().toISOString()), 1000);\n",
     "clock.js prints the current time once a second."),
    ("README.md", "# Weather\n\nA tool that prints the weather in a city.\n",
     "The README says this project is a tool that prints the weather in a city."),
    ("count.py", "for n in range(1, 11):\n    print(n)\n",
     "count.py counts from one to ten and prints each number."),
    ("main.go", 'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("hi")\n}\n',
     "main.go is a Go program that prints hi."),
]
QUESTIONS = ["What does {} do?", "What is in {}?", "Explain {}.", "What is {} for?",
             "Read {} and tell me what it does.", "Summarize {}.", "Can you explain what {} does?",
             "Look at {} and describe it."]
# Other files: a name made of these, and a stretch of the docs as content, so
# that what ends a tool's result is not a handful of memorized texts.
STEMS = ["app", "utils", "main", "test_api", "models", "index", "setup", "parser", "cli",
         "report", "data", "helpers", "routes", "schema", "build", "tasks", "client", "db"]
KINDS = {"py": "Python", "js": "JavaScript", "ts": "TypeScript", "md": "Markdown",
         "txt": "text", "toml": "TOML", "go": "Go", "rs": "Rust", "json": "JSON",
         "sh": "shell", "yaml": "YAML", "c": "C"}
MISSING = "Error: the file does not exist."


def schema(**properties: str) -> dict:
    return {"type": "object", "properties": {k: {"type": t, "description": ""}
                                             for k, t in properties.items()},
            "required": list(properties)[:1]}


# Each client's tools: (name, parameters) and which is called for what.
CLIENTS = {
    "claude": {
        "tools": [("Agent", schema(description="string", prompt="string")),
                  ("Bash", schema(command="string", timeout="number")),
                  ("Edit", schema(file_path="string", old_string="string", new_string="string")),
                  ("Glob", schema(pattern="string", path="string")),
                  ("Grep", schema(pattern="string", path="string", glob="string")),
                  ("Read", schema(file_path="string", offset="integer", limit="integer")),
                  ("Skill", schema(skill="string", args="string")),
                  ("ToolSearch", schema(query="string", max_results="number")),
                  ("Write", schema(file_path="string", content="string"))],
        "read": lambda f: ("Read", {"file_path": f}),
        "result": lambda text: "\n".join(f"{i:6}\t{line}"
                                         for i, line in enumerate(text.splitlines(), 1)),
    },
    "qwen": {
        "tools": [("agent", schema(description="string", prompt="string")),
                  ("get_goal", schema()), ("glob", schema(pattern="string", path="string")),
                  ("grep_search", schema(pattern="string", glob="string", path="string")),
                  ("read_file", schema(file_path="string", offset="number", limit="number")),
                  ("run_shell_command", schema(command="string", description="string")),
                  ("skill", schema(skill="string")), ("tool_search", schema(query="string")),
                  ("write_file", schema(file_path="string", content="string"))],
        "read": lambda f: ("read_file", {"file_path": f}),
        "result": lambda text: text,
    },
    "codex": {
        "tools": [("exec_command", schema(cmd="string", justification="string", tty="boolean")),
                  ("write_stdin", schema(session_id="number", chars="string")),
                  ("request_user_input", schema(questions="array")),
                  ("view_image", schema(path="string")), ("get_goal", schema()),
                  ("create_goal", schema(objective="string")),
                  ("multi_agent_v1__spawn_agent", schema(message="string"))],
        "read": lambda f: ("exec_command", {"cmd": f"cat {f}"}),
        "result": lambda text: f"Process exited with code 0\nOutput:\n{text}",
    },
}
# Filler sizes, in characters (about 3.4 a token): a session's extra text is
# drawn between these (short sessions, learned whole; long ones, learned from
# a prefix read without gradient: build.agent_examples), each part from it.
SHORT_FILLER_CHARS = (0, 9000)
LONG_FILLER_CHARS = (9000, 70000)


class Filler:
    """Stretches of the docs snapshot, cut at whitespace."""

    def __init__(self, rng: random.Random):
        text = "\n".join(ln for ln in VOCABULARY_TEXT.read_text(encoding="utf-8").splitlines()
                         if not ln.startswith("#"))
        self.text, self.rng = re.sub(r"\n{3,}", "\n\n", text), rng

    def take(self, chars: int) -> str:
        if chars <= 0:
            return ""
        start = self.rng.randrange(0, len(self.text) - chars - 1)
        piece = self.text[start:start + chars]
        return piece[piece.find(" ") + 1:].strip()


def other_file(rng: random.Random, filler: Filler) -> tuple[str, str, str]:
    extension = rng.choice(sorted(KINDS))
    file = f"{rng.choice(STEMS)}.{extension}"
    content = filler.take(rng.randrange(60, 1500)) + "\n"
    lines = content.count("\n")
    answer = rng.choice([f"{file} is a short {KINDS[extension]} file of {lines} lines.",
                         f"It is a {KINDS[extension]} file with {lines} lines.",
                         f"{file} holds {lines} lines of {KINDS[extension]}."])
    return file, content, answer


def tool_list(client: str, filler: Filler, budget: int, rng: random.Random) -> list[dict]:
    tools = []
    for name, parameters in CLIENTS[client]["tools"]:
        description = filler.take(rng.randrange(0, budget // 4 + 2)) or name
        tools.append({"type": "function", "function": {
            "name": name, "description": description, "parameters": parameters}})
    rng.shuffle(tools)
    return tools


def session(rng: random.Random, filler: Filler,
            chars: tuple[int, int]) -> tuple[list[dict], list[dict]]:
    """One session: (messages, tools), in the shape corpus.conversation makes."""
    client = rng.choice(sorted(CLIENTS))
    shape = CLIENTS[client]
    budget = chars[0] + int((chars[1] - chars[0]) * rng.random() ** 2)
    parts = [rng.random() for _ in range(5)]
    share = [int(budget * p / sum(parts)) for p in parts]
    tools = tool_list(client, filler, share[0], rng)
    messages = [{"role": "system", "content": filler.take(share[1]) or "You are a coding agent."}]
    extra = rng.choice([0, 0, 1, 2, 3]) if share[2] > 40 else 0
    for _ in range(extra):  # developer notes, environment context, ...
        messages.append({"role": rng.choice(["system", "user"]),
                         "content": filler.take(share[2] // extra)})
    file, content, answer = other_file(rng, filler) if rng.random() < 0.5 else rng.choice(FILES)
    question, (name, arguments) = rng.choice(QUESTIONS).format(file), shape["read"](file)
    if rng.random() < 0.05:
        content, answer = MISSING, f"I could not read {file}: it does not exist."
    reminder = filler.take(share[3])
    asked = (f"<system-reminder>\n{reminder}\n</system-reminder>\n\n{question}" if reminder
             else question)
    messages.append({"role": "user", "content": asked})
    if share[4] > 40 and rng.random() < 0.4:
        messages.append({"role": "system", "content": filler.take(share[4])})
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    messages.append({"role": "tool", "content": shape["result"](content)})
    messages.append({"role": "assistant", "content": answer})
    return messages, tools


def sessions(count: int, seed: int, chars: tuple[int, int]) -> list[str]:
    """`count` sessions rendered by the model's template (a generator of their
    own), with `chars` of filler between them."""
    rng = random.Random(seed)
    filler = Filler(rng)
    return [render(messages, tools) for messages, tools in
            (session(rng, filler, chars) for _ in range(count))]


ASSISTANT = re.compile(r"<\|im_start\|>assistant\n.*?<\|im_end\|>", re.S)


def learned_spans(document: str) -> list[tuple[int, int]]:
    """The character spans the model learns to write: its own turns (the
    `<|im_start|>assistant\\n` that opens one is read, not written)."""
    return [(m.start() + len("<|im_start|>assistant\n"), m.end())
            for m in ASSISTANT.finditer(document)]


def core_text() -> str:
    """What the sessions write and ask, for the tokenizer's training text."""
    lines = [f"{name}\n{content}\n{answer}" for name, content, answer in FILES]
    return "\n".join(lines + QUESTIONS + [n for c in CLIENTS.values()
                                                    for n, _ in c["tools"]])
