"""The engine's generation stream folded into an Anthropic Message.

One fold serves both answers: `feed` turns each GenerateResponse into the
stream's events (content_block_start / _delta / _stop) while it builds the
content blocks, and `finish` closes the message; a non-streamed request
keeps only the built message, so the streamed and the whole answer cannot
drift apart. A reasoning model's reasoning is a thinking block (thinking_delta events),
before the text; with `thinking.display: omitted` the block is there with its
text left empty (no thinking_delta), as Anthropic answers it. Text is one
text block; each tool call a tool_use block whose `input` is the call's
arguments parsed (the engine has checked them against the tool's schema),
streamed as input_json_delta pieces. A call that
max_tokens cut before or inside its arguments has no input, and the whole
message leaves it out.
"""

from __future__ import annotations

import json

from millm.v1 import generation_pb2
from rest_bridge.errors import OpenAIError

STOP_REASONS = {
    generation_pb2.FINISH_REASON_STOP: "end_turn",
    generation_pb2.FINISH_REASON_LENGTH: "max_tokens",
    generation_pb2.FINISH_REASON_TOOL_CALLS: "tool_use",
    generation_pb2.FINISH_REASON_CONTENT_FILTER: "refusal",
}
Event = tuple[str, dict]  # (SSE event name, its data)


def tool_use_id(call_id: str) -> str:
    """Anthropic's spelling of the engine's call id (call_<hex> -> toolu_<hex>)."""
    return "toolu_" + call_id.removeprefix("call_")


def usage_json(usage: generation_pb2.Usage | None, prompt_tokens: int) -> dict:
    """Anthropic counts cache reads apart: input_tokens + cache_read_input_tokens
    is the whole prompt. The prefix cache fills itself, so nothing is ever
    counted as written to a cache."""
    cached = usage.cached_tokens if usage is not None else 0
    prompt = usage.prompt_tokens if usage is not None else prompt_tokens
    return {"input_tokens": prompt - cached, "output_tokens":
            usage.completion_tokens if usage is not None else 0,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


# Where a reply was cut short: at max_tokens, or (max_tokens capped to the
# window's room) at the end of the context window.
CUT_SHORT = frozenset({"max_tokens", "model_context_window_exceeded"})


class MessageFold:
    def __init__(self, message_id: str, model: str, prompt_tokens: int, *,
                 window_capped: bool = False, omit_thinking: bool = False,
                 context_management: dict | None = None):
        self.id, self.model, self.prompt_tokens = message_id, model, prompt_tokens
        self.window_capped = window_capped  # a length finish is the window's end
        self.omit_thinking = omit_thinking
        # The request's context edits as applied (None: it sent none).
        self.context_management = context_management
        self.blocks: list[dict] = []
        self._open: dict | None = None  # the block still receiving deltas
        self._arguments: dict[int, str] = {}  # block index -> a call's JSON so far
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self.usage: generation_pb2.Usage | None = None

    def start_event(self) -> Event:
        """message_start: the message with no content yet. Its input count is
        the prompt's; how much of it the prefix cache held is known at the end
        (message_delta's usage)."""
        usage = usage_json(None, self.prompt_tokens)
        usage["input_tokens"] = self.prompt_tokens
        return "message_start", {"type": "message_start", "message": {
            **self._head(), "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": usage}}

    def _head(self) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model}

    def _close(self, events: list[Event]) -> None:
        if self._open is not None:
            events.append(("content_block_stop", {"type": "content_block_stop",
                                                  "index": len(self.blocks) - 1}))
            self._open = None

    def _begin(self, block: dict, events: list[Event]) -> int:
        self._close(events)
        self.blocks.append(block)
        self._open = block
        index = len(self.blocks) - 1
        shown = {**block, "input": {}} if block["type"] == "tool_use" else dict(block)
        events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                               "content_block": shown}))
        return index

    def _delta(self, index: int, delta: dict, events: list[Event]) -> None:
        events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                               "delta": delta}))

    def feed(self, message) -> list[Event]:
        events: list[Event] = []
        for delta in message.choices:  # a Messages request has one choice
            if delta.reasoning:
                if self._open is None or self._open["type"] != "thinking":
                    # Nothing is signed here: the signature stays empty.
                    self._begin({"type": "thinking", "thinking": "", "signature": ""}, events)
                if not self.omit_thinking:
                    self._open["thinking"] += delta.reasoning
                    self._delta(len(self.blocks) - 1, {"type": "thinking_delta",
                                                       "thinking": delta.reasoning}, events)
            if delta.text:
                if self._open is None or self._open["type"] != "text":
                    self._begin({"type": "text", "text": ""}, events)
                self._open["text"] += delta.text
                self._delta(len(self.blocks) - 1, {"type": "text_delta", "text": delta.text},
                            events)
            for fragment in delta.tool_calls:
                if fragment.id:
                    index = self._begin({"type": "tool_use", "id": tool_use_id(fragment.id),
                                         "name": fragment.name, "input": {}}, events)
                    self._arguments[index] = ""
                index = len(self.blocks) - 1
                if fragment.arguments and index in self._arguments:
                    self._arguments[index] += fragment.arguments
                    self._delta(index, {"type": "input_json_delta",
                                        "partial_json": fragment.arguments}, events)
            if delta.finish_reason:
                self.stop_reason = STOP_REASONS.get(delta.finish_reason)
                if self.stop_reason == "max_tokens" and self.window_capped:
                    self.stop_reason = "model_context_window_exceeded"
                if delta.stop_sequence:
                    self.stop_reason, self.stop_sequence = "stop_sequence", delta.stop_sequence
        if message.HasField("usage"):
            self.usage = message.usage
        return events

    def finish(self) -> list[Event]:
        """Close the last block and the message: message_delta carries the stop
        reason and the final usage, message_stop ends it."""
        events: list[Event] = []
        self._close(events)
        cut = []
        for index, arguments in self._arguments.items():
            if not arguments and self.stop_reason in CUT_SHORT:
                cut.append(index)  # ended after its name, before any argument
                continue
            try:
                self.blocks[index]["input"] = json.loads(arguments) if arguments else {}
            except ValueError:
                if self.stop_reason not in CUT_SHORT:
                    raise OpenAIError(500, "The engine returned tool-call arguments that do "
                                      "not parse.", type="server_error",
                                      code="internal_error") from None
                cut.append(index)  # max_tokens ended it inside its arguments
        # A call cut short (inside its arguments, or before the first of them)
        # has no input to give: the whole message leaves it out (stop_reason
        # max_tokens says why); a stream has sent its pieces.
        self.blocks = [b for i, b in enumerate(self.blocks) if i not in cut]
        delta = {"type": "message_delta",
                 "delta": {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence},
                 "usage": usage_json(self.usage, self.prompt_tokens)}
        if self.context_management is not None:
            delta["context_management"] = self.context_management
        events.append(("message_delta", delta))
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    def message(self) -> dict:
        message = {**self._head(), "content": self.blocks, "stop_reason": self.stop_reason,
                   "stop_sequence": self.stop_sequence,
                   "usage": usage_json(self.usage, self.prompt_tokens)}
        if self.context_management is not None:
            message["context_management"] = self.context_management
        return message
