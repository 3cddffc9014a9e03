"""A request body shaped as Claude Code 2.1.328's first POST /v1/messages?beta=true
(issue 42): system messages inside `messages`, adaptive thinking with
`display: omitted`, a clear_thinking context edit that keeps everything,
`output_config.effort`, `metadata.user_id`, `cache_control` on system and
message blocks, twelve tools of which three are deferred (its ToolSearch
loads them), and the betas it names. Written for the tests from the field
list in the issue; the tool texts are short stand-ins for Claude Code's own.
"""

from __future__ import annotations

import copy

BETAS = ("claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,"
         "mid-conversation-tool-changes-2026-07-01,thinking-token-count-2026-05-13,"
         "advanced-tool-use-2025-11-20,effort-2025-11-24")
HEADERS = {"anthropic-version": "2023-06-01", "anthropic-beta": BETAS,
           "x-api-key": "unused", "user-agent": "claude-cli/2.1.328 (external, sdk-cli)"}
PATH = "/v1/messages?beta=true"
CACHE = {"type": "ephemeral"}
DEFERRED = ("WebFetch", "WebSearch", "NotebookEdit")


def _tool(name: str, description: str, properties: dict, required: list[str],
          deferred: bool = False) -> dict:
    tool = {"name": name, "description": description, "input_schema": {
        "type": "object", "properties": properties, "required": required,
        "additionalProperties": False}}
    if deferred:
        tool["defer_loading"] = True
    return tool


def _text(description: str) -> dict:
    return {"type": "string", "description": description}


TOOLS = [
    _tool("Task", "Start a sub-agent for a task.", {"description": _text("Short title"),
                                                   "prompt": _text("The task")},
          ["description", "prompt"]),
    _tool("Bash", "Run a shell command.", {"command": _text("The command"),
                                          "timeout": {"type": "number"}}, ["command"]),
    _tool("Glob", "Find files by pattern.", {"pattern": _text("A glob")}, ["pattern"]),
    _tool("Grep", "Search file contents.", {"pattern": _text("A regex"),
                                           "path": _text("Where")}, ["pattern"]),
    _tool("Read", "Read a file.", {"file_path": _text("Absolute path")}, ["file_path"]),
    _tool("Edit", "Replace text in a file.", {"file_path": _text("Path"),
                                             "old_string": _text("Old"),
                                             "new_string": _text("New")},
          ["file_path", "old_string", "new_string"]),
    _tool("Write", "Write a file.", {"file_path": _text("Path"), "content": _text("Text")},
          ["file_path", "content"]),
    _tool("TodoWrite", "Keep a todo list.", {"todos": {"type": "array", "items": {
        "type": "string"}}}, ["todos"]),
    _tool("ToolSearch", "Load deferred tools by name or keyword.",
          {"query": _text("select:Name or keywords")}, ["query"]),
    _tool("WebFetch", "Fetch a URL.", {"url": _text("The URL")}, ["url"], deferred=True),
    _tool("WebSearch", "Search the web.", {"query": _text("Terms")}, ["query"],
          deferred=True),
    _tool("NotebookEdit", "Edit a notebook cell.", {"notebook_path": _text("Path")},
          ["notebook_path"], deferred=True),
]


def first_request(model: str, *, stream: bool, max_tokens: int = 16) -> dict:
    """Claude Code's first request. `max_tokens` is 32000 in the client; the
    tests keep it inside the demo model's window (another item of issue 42
    decides what a larger one does)."""
    body = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": stream,
        "temperature": 0,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328"},
            {"type": "text", "text": "You are a coding agent. Answer briefly.",
             "cache_control": CACHE},
        ],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>Tools may be deferred."
                 "</system-reminder>"},
                {"type": "text", "text": "What does calc.py do?", "cache_control": CACHE}]},
            {"role": "system", "content": "The deferred tools are: WebFetch, WebSearch, "
             "NotebookEdit. Load them with ToolSearch."},
        ],
        "tools": copy.deepcopy(TOOLS),
        "metadata": {"user_id": "user_abc_account_def_session_0"},
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
    }
    return body


def compact_request(model: str, parameters: dict) -> dict:
    """The same kinds of field in a small body, for the sweep's nested values
    (tests/sweep_support.py): a system message inside messages, adaptive
    thinking, effort, context edits, a deferred tool loaded by a tool_reference,
    cache_control."""
    return {
        "model": model, "max_tokens": 1, "stream": True,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": CACHE}]},
            {"role": "system", "content": "Tools load later."},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "t", "signature": "s"},
                {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1",
                 "content": [{"type": "tool_reference", "tool_name": "f"}]}]}],
        "tools": [{"name": "search", "input_schema": {"type": "object"}},
                  {"name": "f", "input_schema": parameters, "defer_loading": True}],
        "thinking": {"type": "adaptive", "display": "omitted"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [
            {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}},
            {"type": "clear_tool_uses_20250919"}]},
    }
