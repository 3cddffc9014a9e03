"""How `make agents-check` runs each coding agent headless against the bridge.

One place per agent for the three things that differ between them: the files
and environment that point it at miLLM with its telemetry, error reporting
and update checks off; the command line that runs one prompt without asking a
person anything; and where in its output the model's answer is. Each run
gets a home folder of its own, so nothing is read from or written to the
user's real ~/.claude, ~/.codex or ~/.qwen.

Tool permissions are the same in spirit for all three: reading files is
allowed without a prompt, writing and shell commands are not auto-approved
(Codex runs its shell in its read-only sandbox). docs/coding-agents.md
explains each setting.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

BIN = pathlib.Path(__file__).resolve().parent / "node_modules" / ".bin"

# What the agents are asked, in a folder holding only this file.
PROMPT = "What does calc.py do?"
CALC_PY = '''"""A small calculator."""


def add(a, b):
    return a + b


def multiply(a, b):
    return a * b


if __name__ == "__main__":
    print(add(2, 3), multiply(4, 5))
'''

# Off in every agent: Node's and the usual opt-out signals.
COMMON_ENV = {"DO_NOT_TRACK": "1", "NO_UPDATE_NOTIFIER": "1", "NO_COLOR": "1"}


@dataclass
class Run:
    argv: list[str]
    env: dict[str, str]
    answer_file: pathlib.Path | None = None  # where the agent writes its last message


def claude(home: pathlib.Path, work: pathlib.Path, base_url: str, model: str) -> Run:
    """Claude Code speaks Anthropic Messages to ANTHROPIC_BASE_URL (+ /v1/messages)."""
    config = home / ".claude"
    config.mkdir(parents=True)
    env = {
        "CLAUDE_CONFIG_DIR": str(config),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "unused",
        # Every model role (main, the small fast one for titles and such) is ours.
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_BUG_COMMAND": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    }
    argv = [str(BIN / "claude"), "-p", PROMPT, "--output-format", "json",
            "--model", model, "--permission-mode", "default",
            "--allowedTools", "Read,Glob,Grep", "--no-session-persistence"]
    return Run(argv, env)


CODEX_CONFIG = """\
# Written by tests/agents/clients.py for one `make agents-check` run.
model = "{model}"
model_provider = "millm"
approval_policy = "never"
sandbox_mode = "read-only"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"

[model_providers.millm]
name = "miLLM"
base_url = "{base_url}/v1"
env_key = "MILLM_API_KEY"
wire_api = "responses"
"""


def codex(home: pathlib.Path, work: pathlib.Path, base_url: str, model: str) -> Run:
    """Codex CLI speaks the Responses API to a provider from $CODEX_HOME/config.toml."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(CODEX_CONFIG.format(model=model, base_url=base_url))
    answer = home / "codex-last-message.txt"
    env = {"CODEX_HOME": str(codex_home), "MILLM_API_KEY": "unused"}
    argv = [str(BIN / "codex"), "exec", "--skip-git-repo-check", "--strict-config",
            "--ephemeral", "--color", "never", "-C", str(work),
            "--output-last-message", str(answer), PROMPT]
    return Run(argv, env, answer)


def qwen(home: pathlib.Path, work: pathlib.Path, base_url: str, model: str) -> Run:
    """Qwen Code speaks Chat Completions to OPENAI_BASE_URL with --auth-type openai."""
    qwen_home = home / ".qwen"
    qwen_home.mkdir(parents=True)
    settings = {
        "general": {"enableAutoUpdate": False},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "security": {"auth": {"selectedType": "openai"}},
    }
    (qwen_home / "settings.json").write_text(json.dumps(settings, indent=2))
    env = {
        "QWEN_HOME": str(qwen_home),
        "OPENAI_BASE_URL": f"{base_url}/v1",
        "OPENAI_API_KEY": "unused",
        "OPENAI_MODEL": model,
        "QWEN_USAGE_STATISTICS_ENABLED": "0",
        "QWEN_TELEMETRY_ENABLED": "0",
    }
    argv = [str(BIN / "qwen"), PROMPT, "--auth-type", "openai", "--model", model,
            "--approval-mode", "default", "--output-format", "text"]
    return Run(argv, env)


CLIENTS = {"claude-code": claude, "codex": codex, "qwen-code": qwen}


def answer_printed(client: str, stdout: str, run: Run) -> str:
    """The model's answer as the agent printed it ('' when there is none)."""
    if client == "claude-code":
        try:
            result = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {}
        except ValueError:
            return ""
        return "" if result.get("is_error") else str(result.get("result") or "")
    if client == "codex" and run.answer_file is not None and run.answer_file.exists():
        return run.answer_file.read_text().strip() or stdout.strip()
    return stdout.strip()


def versions() -> dict[str, str]:
    """The pinned versions, as installed (package.json holds the pins)."""
    found = {}
    modules = BIN.parent
    for client, package in (("claude-code", "@anthropic-ai/claude-code"),
                            ("codex", "@openai/codex"), ("qwen-code", "@qwen-code/qwen-code")):
        manifest = modules / package / "package.json"
        found[client] = json.loads(manifest.read_text())["version"] if manifest.exists() else "?"
    return found
