"""The Responses API's JSON objects, rendered from the contract's messages.

One rendering for every path: a response just generated and one read back
from the engine's store are both a StoredResponse, so `POST` and `GET
/v1/responses/{id}` (and the streamed events' snapshots) cannot drift apart.

The engine refuses to store what cannot be rendered (unknown enum numbers,
non-finite numbers, JSON fields that do not parse), but a stored response
may come from an engine of a newer contract: what this bridge cannot name
is shown as the nearest thing it can (an unknown status as "incomplete", an
unreadable schema as none), so reading a stored response never fails.
"""

from __future__ import annotations

import base64
import json
import math

from millm.v1 import generation_pb2
from millm.v1 import response_service_pb2 as rpb
from rest_bridge.protocol.base import MAX_BODY_DEPTH, json_depth

_ROLES = {generation_pb2.ROLE_USER: "user", generation_pb2.ROLE_SYSTEM: "system",
          generation_pb2.ROLE_DEVELOPER: "developer", generation_pb2.ROLE_ASSISTANT: "assistant"}
_PARTS = {rpb.CONTENT_PART_TYPE_INPUT_TEXT: "input_text",
          rpb.CONTENT_PART_TYPE_OUTPUT_TEXT: "output_text"}
ITEM_STATUS = {rpb.ITEM_STATUS_COMPLETED: "completed", rpb.ITEM_STATUS_INCOMPLETE: "incomplete",
               rpb.ITEM_STATUS_UNSPECIFIED: "completed"}
STATUS = {rpb.RESPONSE_STATUS_COMPLETED: "completed",
          rpb.RESPONSE_STATUS_INCOMPLETE: "incomplete", rpb.RESPONSE_STATUS_FAILED: "failed",
          rpb.RESPONSE_STATUS_UNSPECIFIED: "in_progress"}
_MODES = {generation_pb2.TOOL_CHOICE_MODE_NONE: "none",
          generation_pb2.TOOL_CHOICE_MODE_AUTO: "auto",
          generation_pb2.TOOL_CHOICE_MODE_REQUIRED: "required"}


def _json(text: str, default):
    """A stored JSON field, or `default` when it is not standard JSON this
    bridge could write back (too deep for a body is too deep here)."""
    try:
        value = json.loads(text, parse_constant=_reject_constant) if text else default
    except (ValueError, RecursionError):
        return default
    return default if json_depth(value) > MAX_BODY_DEPTH else value


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def part_json(part: rpb.ContentPart) -> dict:
    if part.type == rpb.CONTENT_PART_TYPE_OUTPUT_TEXT:
        return {"type": "output_text", "text": part.text, "annotations": [], "logprobs": []}
    return {"type": _PARTS.get(part.type, "input_text"), "text": part.text}


ENCRYPTED_PREFIX = b"millm-reasoning:"
_SYNTAXES = {generation_pb2.CUSTOM_TOOL_SYNTAX_LARK: "lark",
             generation_pb2.CUSTOM_TOOL_SYNTAX_REGEX: "regex"}


def encrypted_reasoning(text: str) -> str:
    """Reasoning as `encrypted_content`: base64 of a marker and the text.
    Not encrypted (the client was shown the reasoning); a stateless client
    sends it back with the next input so the reasoning is not lost."""
    return base64.b64encode(ENCRYPTED_PREFIX + text.encode()).decode()


def decrypted_reasoning(content: str) -> str | None:
    """The text of an `encrypted_content` this bridge wrote; None for any
    other (another server's opaque reasoning)."""
    try:
        raw = base64.b64decode(content, validate=True)
        return raw.removeprefix(ENCRYPTED_PREFIX).decode() if raw.startswith(
            ENCRYPTED_PREFIX) else None
    except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors
        return None


def item_json(item: rpb.ResponseItem, status: str | None = None,
              settings: rpb.ResponseSettings | None = None) -> dict:
    """One item; `settings` (the response's) decide what a reasoning item
    shows besides its text: its summary and its encrypted_content."""
    status = status or ITEM_STATUS.get(item.status, "completed")
    kind = item.WhichOneof("item")
    if kind == "message":
        return {"id": item.id, "type": "message", "status": status,
                "role": _ROLES.get(item.message.role, "user"),
                "content": [part_json(p) for p in item.message.content]}
    if kind == "function_call":
        c = item.function_call
        out = {"id": item.id, "type": "function_call", "status": status, "call_id": c.call_id,
               "name": c.name, "arguments": c.arguments_json}
        if c.namespace:
            out["namespace"] = c.namespace
        return out
    if kind == "custom_tool_call":
        c = item.custom_tool_call
        return {"id": item.id, "type": "custom_tool_call", "status": status,
                "call_id": c.call_id, "name": c.name, "input": c.input}
    if kind == "custom_tool_call_output":
        out = item.custom_tool_call_output
        return {"id": item.id, "type": "custom_tool_call_output", "status": status,
                "call_id": out.call_id, "output": out.output}
    if kind == "reasoning":
        text = item.reasoning.text
        summary = settings is not None and settings.HasField("reasoning_summary")
        encrypted = settings is not None and settings.reasoning_encrypted_content
        return {"id": item.id, "type": "reasoning", "status": status,
                "summary": [{"type": "summary_text", "text": text}] if summary and text else [],
                "content": [{"type": "reasoning_text", "text": text}],
                "encrypted_content": encrypted_reasoning(text) if encrypted else None}
    out = item.function_call_output
    return {"id": item.id, "type": "function_call_output", "status": status,
            "call_id": out.call_id, "output": out.output}


def _opt(message, name: str, default=None):
    value = getattr(message, name) if message.HasField(name) else default
    if isinstance(value, float) and not math.isfinite(value):
        return default  # JSON has no spelling for it
    return value


def _tool_choice(s: rpb.ResponseSettings):
    if not s.HasField("tool_choice") or s.tool_choice.mode == 0:
        return "auto"
    if s.tool_choice.mode == generation_pb2.TOOL_CHOICE_MODE_FUNCTION:
        return {"type": "function", "name": s.tool_choice.function_name}
    return _MODES.get(s.tool_choice.mode, "auto")


def _format(s: rpb.ResponseSettings) -> dict:
    which = s.text_format.WhichOneof("format") if s.HasField("text_format") else None
    if which == "json_object":
        return {"type": "json_object"}
    if which == "json_schema":
        spec = s.text_format.json_schema
        out = {"type": "json_schema", "name": spec.name,
               "schema": _json(spec.schema_json, {}),
               "strict": _opt(spec, "strict")}
        if spec.description:
            out["description"] = spec.description
        return out
    return {"type": "text"}


def _tool(t: generation_pb2.FunctionTool) -> dict:
    if t.HasField("custom"):
        fmt = {"type": "text"}
        if t.custom.syntax in _SYNTAXES:
            fmt = {"type": "grammar", "syntax": _SYNTAXES[t.custom.syntax],
                   "definition": t.custom.definition}
        return {"type": "custom", "name": t.name, "description": t.description or None,
                "format": fmt}
    return {"type": "function", "name": t.name, "description": t.description or None,
            "parameters": _json(t.parameters_json, None),
            "strict": _opt(t, "strict", True)}


def usage_json(usage: generation_pb2.Usage) -> dict:
    return {"input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
            "total_tokens": usage.total_tokens}


def response_json(r: rpb.StoredResponse, *, store: bool, status: str | None = None) -> dict:
    """The response object; `status` overrides the stored one (in_progress
    snapshots while streaming)."""
    s, sampling = r.settings, r.settings.sampling
    status = status or STATUS.get(r.status, "incomplete")
    finished = status not in ("in_progress", "queued")
    error = None
    if r.status == rpb.RESPONSE_STATUS_FAILED:
        error = {"code": r.error.code, "message": r.error.message}
    incomplete = None
    if r.status == rpb.RESPONSE_STATUS_INCOMPLETE and finished:
        incomplete = {"reason": "content_filter"
                      if r.incomplete_reason == rpb.INCOMPLETE_REASON_CONTENT_FILTER
                      else "max_output_tokens"}
    return {
        "id": r.id, "object": "response", "created_at": r.created_at, "status": status,
        "background": False, "error": error, "incomplete_details": incomplete,
        "instructions": _opt(r, "instructions"),
        "max_output_tokens": _opt(sampling, "max_tokens"), "max_tool_calls": None,
        "model": r.model,
        "output": [item_json(i, settings=s) for i in r.output] if finished else [],
        "parallel_tool_calls": _opt(s, "parallel_tool_calls", True),
        "previous_response_id": r.previous_response_id or None,
        "reasoning": {"effort": _opt(s, "reasoning_effort"),
                      "summary": _opt(s, "reasoning_summary")},
        "service_tier": "default",
        "store": store, "temperature": _opt(sampling, "temperature", 1.0),
        "text": {"format": _format(s)}, "tool_choice": _tool_choice(s),
        "tools": [_tool(t) for t in s.tools], "top_p": _opt(sampling, "top_p", 1.0),
        "truncation": "disabled",
        "usage": usage_json(r.usage) if finished and r.HasField("usage") else None,
        "user": _opt(s, "user"), "metadata": dict(r.metadata),
    }
