"""/v1/responses as Codex CLI sends it (issue 42 item 3), through the OpenAI
SDK against the real stack, on millm-tiny and on its Q8_0 GGUF export.

A Codex request carries function tools, a namespace of functions, a custom
tool with a Lark grammar (apply_patch), a hosted web_search tool, developer
messages, reasoning.summary, include, store false, prompt_cache_key,
client_metadata and parallel_tool_calls. The demo model is tiny: these tests
assert what the grammars guarantee (a forced call's arguments validate, a
custom tool's input is in its grammar) and what the bridge reports, not what
the model chooses to say.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from xgrammar import Grammar
from xgrammar.testing import _is_grammar_accept_string as accepts

from tests.conftest import MODEL

EXEC = {"type": "object", "properties": {"cmd": {"type": "string", "maxLength": 24}},
        "required": ["cmd"], "additionalProperties": False}
SPAWN = {"type": "object", "properties": {"message": {"type": "string", "maxLength": 24}},
         "required": ["message"], "additionalProperties": False}
# A patch language of our own in Lark, small enough for a tiny model to finish.
PATCH = r'''
start: begin add end
begin: "*** Begin Patch" LF
add: "*** Add File: \"" NAME "\"" LF line line?
line: "+" /[a-z ]{0,12}/ LF
end: "*** End Patch" LF
NAME: /[a-z]{1,8}\.txt/
%import common.LF
'''
TOOLS = [
    {"type": "function", "name": "exec_command", "description": "Run a shell command.",
     "strict": False, "parameters": EXEC},
    {"type": "namespace", "name": "collab", "description": "Sub-agents.",
     "tools": [{"type": "function", "name": "spawn_agent", "description": "Start an agent.",
                "strict": False, "parameters": SPAWN}]},
    {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
     "format": {"type": "grammar", "syntax": "lark", "definition": PATCH}},
    {"type": "web_search", "external_web_access": False},
]
INPUT = [
    {"type": "message", "role": "developer",
     "content": [{"type": "input_text", "text": "You are a coding agent."}]},
    {"type": "message", "role": "user",
     "content": [{"type": "input_text", "text": "What does calc.py do?"}]},
]
CODEX = {"instructions": "Be brief.", "input": INPUT, "tools": TOOLS, "tool_choice": "auto",
         "parallel_tool_calls": True, "reasoning": {"summary": "auto"},
         "include": ["reasoning.encrypted_content"], "store": False,
         "max_output_tokens": 48,
         "extra_body": {"prompt_cache_key": "session-1", "seed": 3,
                        "client_metadata": {"originator": "codex_exec"}}}


@pytest.fixture(scope="module", params=["transformers", "gguf"])
def agent_client(request):
    stack = request.getfixturevalue("stack" if request.param == "transformers"
                                    else "gguf_stack")
    return openai.OpenAI(base_url=f"http://127.0.0.1:{stack.http_port}/v1", api_key="x",
                         max_retries=0)


def _ignored(headers) -> list[str]:
    value = headers.get("x-millm-ignored-fields") or ""
    return [item.strip().strip('"') for item in value.split(",") if item.strip()]


def test_a_codex_request_is_answered_whole(agent_client):
    raw = agent_client.responses.with_raw_response.create(model=MODEL, **CODEX)
    assert raw.status_code == 200
    r = raw.parse()
    assert r.status in ("completed", "incomplete") and r.store is False
    assert r.reasoning.summary == "auto"
    assert [t.type for t in r.tools] == ["function", "function", "custom"]
    ignored = _ignored(raw.headers)
    assert "tools[3]" in ignored and "client_metadata" in ignored
    assert "prompt_cache_key" not in ignored and "include" not in ignored


def test_a_codex_request_streams_valid_events(agent_client):
    with agent_client.responses.with_streaming_response.create(
            model=MODEL, stream=True, **CODEX) as raw:
        assert raw.status_code == 200
        assert "tools[3]" in _ignored(raw.headers)
        events = [json.loads(line[6:]) for line in raw.iter_lines()
                  if line.startswith("data: ")]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    assert all(e["type"] != "response.failed" for e in events)


def test_a_forced_namespace_function_comes_back_for_codex_to_dispatch(agent_client):
    r = agent_client.responses.create(model=MODEL, **{
        **CODEX, "max_output_tokens": 64, "tool_choice": {"type": "function",
                                                          "name": "spawn_agent"}})
    [call] = [item for item in r.output if item.type == "function_call"]
    assert (call.name, call.namespace) == ("spawn_agent", "collab")
    jsonschema.validate(json.loads(call.arguments), SPAWN)
    # The call and its output, sent back as Codex sends them, continue the session.
    history = [*INPUT, {"type": "function_call", "call_id": call.call_id,
                        "name": call.name, "namespace": call.namespace,
                        "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": "started"}]
    again = agent_client.responses.create(model=MODEL, **{**CODEX, "input": history})
    assert again.status in ("completed", "incomplete")


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_custom_tool_writes_input_its_grammar_accepts(agent_client, stream):
    body = {**CODEX, "max_output_tokens": 120, "tool_choice": {"type": "custom",
                                                               "name": "apply_patch"}}
    if stream:
        with agent_client.responses.stream(model=MODEL, **body) as events:
            seen = [e.type for e in events]
            r = events.get_final_response()
        assert "response.custom_tool_call_input.done" in seen
    else:
        r = agent_client.responses.create(model=MODEL, **body)
    [call] = [item for item in r.output if item.type == "custom_tool_call"]
    assert call.name == "apply_patch" and call.call_id
    assert accepts(Grammar.from_lark(PATCH), call.input), call.input
    history = [*INPUT, {"type": "custom_tool_call", "call_id": call.call_id,
                        "name": call.name, "input": call.input},
               {"type": "custom_tool_call_output", "call_id": call.call_id,
                "output": "Done!"}]
    again = agent_client.responses.create(model=MODEL, **{**CODEX, "input": history})
    assert again.status in ("completed", "incomplete")


def test_a_grammar_that_cannot_be_compiled_leaves_the_input_free(agent_client):
    tools = [{"type": "custom", "name": "apply_patch",
              "format": {"type": "grammar", "syntax": "lark", "definition": "start: ???"}}]
    raw = agent_client.responses.with_raw_response.create(
        model=MODEL, input="Patch it.", tools=tools, max_output_tokens=24, store=False,
        tool_choice={"type": "custom", "name": "apply_patch"})
    assert raw.status_code == 200
    assert "tools[0].format" in _ignored(raw.headers)
    assert [item.type for item in raw.parse().output] == ["custom_tool_call"]


def test_hosted_tools_are_kept_from_the_model_and_reported(agent_client):
    hosted = [{"type": "web_search_preview"}, {"type": "file_search", "vector_store_ids": ["v"]},
              {"type": "code_interpreter", "container": {"type": "auto"}},
              {"type": "image_generation"}, {"type": "computer_use_preview",
                                             "display_width": 1, "display_height": 1,
                                             "environment": "linux"},
              {"type": "mcp", "server_label": "x", "server_url": "http://127.0.0.1:9"},
              {"type": "local_shell"}]
    raw = agent_client.responses.with_raw_response.create(
        model=MODEL, input="Hi", tools=hosted, max_output_tokens=8, store=False)
    assert raw.status_code == 200
    assert _ignored(raw.headers)[:len(hosted)] == [f"tools[{i}]" for i in range(len(hosted))]
    assert raw.parse().tools == []
    with pytest.raises(openai.BadRequestError) as refused:
        agent_client.responses.create(model=MODEL, input="Hi", tools=hosted, store=False,
                                      tool_choice={"type": "web_search_preview"})
    assert refused.value.body["param"] == "tool_choice.type"
    # Beside function and namespace tools, a hosted one is named where the
    # client sent it, not by its place among the tools offered to the model.
    fn = {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": False}
    group = {"type": "namespace", "name": "g", "description": "", "tools": [
        {**fn, "name": n} for n in ("a", "b", "c")]}
    raw = agent_client.responses.with_raw_response.create(
        model=MODEL, input="Hi", max_output_tokens=4, store=False,
        tools=[fn, group, {**fn, "name": "h"}, {"type": "web_search"}])
    assert raw.status_code == 200 and "tools[3]" in _ignored(raw.headers), raw.headers
    assert not any(loc.startswith("tools[1].tools") for loc in _ignored(raw.headers))


def test_encrypted_reasoning_is_read_back():
    from rest_bridge.serving.responses_json import decrypted_reasoning, encrypted_reasoning

    assert decrypted_reasoning(encrypted_reasoning("thought é")) == "thought é"
    assert decrypted_reasoning("b3BhcXVl") is None and decrypted_reasoning("%%") is None
