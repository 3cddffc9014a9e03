"""The engine's generation stream folded into Responses API output items.

One fold for both answers: `feed` takes each GenerateResponse, grows the
response's output items (a reasoning item for what a reasoning model thought,
a message for text, a function_call item per call)
and returns the events that growth is, in OpenAI's order; a streamed
response sends those events, a whole one keeps only the items. So the two can
never disagree about what was generated.

An event is (type, payload) without its sequence number, which the stream
adds as it writes.
"""

from __future__ import annotations

from millm.v1 import generation_pb2
from millm.v1 import response_service_pb2 as rpb
from rest_bridge.serving import responses_tools
from rest_bridge.serving.responses_input import new_id
from rest_bridge.serving.responses_json import item_json, part_json

Event = tuple[str, dict]
MESSAGE, CALL, CUSTOM, REASONING = "message", "call", "custom", "reasoning"


class OutputBuilder:
    def __init__(self, response: rpb.StoredResponse,
                 tools: responses_tools.ToolMap | None = None):
        self.response = response
        # What the offered tool names stand for (namespace members, custom tools).
        self.tools = tools or responses_tools.ToolMap()
        settings = response.settings
        self._summary = settings.HasField("reasoning_summary")
        self.finish_reason = generation_pb2.FINISH_REASON_UNSPECIFIED
        self._open: str | None = None  # the kind of the last item, while it grows
        self._calls: dict[int, int] = {}  # the engine's call index -> output index
        # Text and arguments by output index, joined into the item once when it
        # closes (appending to a protobuf string per token would be quadratic).
        self._pending: dict[int, list[str]] = {}

    @property
    def _last(self) -> tuple[int, rpb.ResponseItem]:
        return len(self.response.output) - 1, self.response.output[-1]

    def feed(self, message) -> list[Event]:
        events: list[Event] = []
        for delta in message.choices:
            # A response has one choice (n stays 1: the engine refuses it unmapped).
            if delta.reasoning:
                events += self._reasoning(delta.reasoning)
            if delta.text:
                events += self._text(delta.text)
            for fragment in delta.tool_calls:
                events += self._call(fragment)
            if delta.finish_reason:
                self.finish_reason = delta.finish_reason
        if message.HasField("usage"):
            self.response.usage.CopyFrom(message.usage)
        return events

    def _item(self, item: rpb.ResponseItem, status: str | None = None) -> dict:
        return item_json(item, status, self.response.settings)

    def _added(self, kind: str, item: rpb.ResponseItem) -> list[Event]:
        self._open = kind
        index = len(self.response.output) - 1
        shown = self._item(item, "in_progress")
        if kind in (MESSAGE, REASONING):
            shown["content"] = []
            if kind == REASONING:
                shown["summary"], shown["encrypted_content"] = [], None
        elif kind == CUSTOM:
            shown["input"] = ""
        else:
            shown["arguments"] = ""
        events = [("response.output_item.added", {"output_index": index, "item": shown})]
        if kind == REASONING and self._summary:
            events.append(("response.reasoning_summary_part.added", {
                "item_id": item.id, "output_index": index, "summary_index": 0,
                "part": {"type": "summary_text", "text": ""}}))
        return events

    def _text(self, text: str) -> list[Event]:
        events = []
        if self._open != MESSAGE:
            events += self._close(rpb.ITEM_STATUS_COMPLETED)
            item = self.response.output.add(id=new_id("msg"), message=rpb.MessageItem(
                role=generation_pb2.ROLE_ASSISTANT,
                content=[rpb.ContentPart(type=rpb.CONTENT_PART_TYPE_OUTPUT_TEXT)]))
            events += self._added(MESSAGE, item)
            events.append(("response.content_part.added", {
                "item_id": item.id, "output_index": len(self.response.output) - 1,
                "content_index": 0, "part": part_json(item.message.content[0])}))
        index, item = self._last
        if not text:
            return events
        self._pending.setdefault(index, []).append(text)
        events.append(("response.output_text.delta", {
            "item_id": item.id, "output_index": index, "content_index": 0, "delta": text,
            "logprobs": []}))
        return events

    def _reasoning(self, text: str) -> list[Event]:
        events = []
        if self._open != REASONING:
            events += self._close(rpb.ITEM_STATUS_COMPLETED)
            item = self.response.output.add(id=new_id("rs"), reasoning=rpb.ReasoningItem())
            events += self._added(REASONING, item)
        index, item = self._last
        self._pending.setdefault(index, []).append(text)
        events.append(("response.reasoning_text.delta", {
            "item_id": item.id, "output_index": index, "content_index": 0, "delta": text}))
        if self._summary:  # the summary is the reasoning itself
            events.append(("response.reasoning_summary_text.delta", {
                "item_id": item.id, "output_index": index, "summary_index": 0, "delta": text}))
        return events

    def _call(self, fragment: generation_pb2.ToolCallDelta) -> list[Event]:
        events = []
        if fragment.id:
            events += self._close(rpb.ITEM_STATUS_COMPLETED)
            kind, namespace, name = self.tools.kind(fragment.name)
            if kind == responses_tools.CUSTOM:
                item = self.response.output.add(
                    id=new_id("ctc"), custom_tool_call=rpb.CustomToolCallItem(
                        call_id=fragment.id, name=name))
            else:
                item = self.response.output.add(
                    id=new_id("fc"), function_call=rpb.FunctionCallItem(
                        call_id=fragment.id, name=name, namespace=namespace))
            self._calls[fragment.index] = len(self.response.output) - 1
            events += self._added(CUSTOM if kind == responses_tools.CUSTOM else CALL, item)
        index = self._calls.get(fragment.index)
        if index is None or not fragment.arguments:
            return events
        item = self.response.output[index]
        self._pending.setdefault(index, []).append(fragment.arguments)
        if item.HasField("custom_tool_call"):
            return events  # its input is known once its arguments are whole
        events.append(("response.function_call_arguments.delta", {
            "item_id": item.id, "output_index": index, "delta": fragment.arguments}))
        return events

    def _close(self, status: int) -> list[Event]:
        if self._open is None:
            return []
        index, item = self._last
        self._flush(index)
        item.status = status
        events = []
        if self._open == REASONING:
            events.append(("response.reasoning_text.done", {
                "item_id": item.id, "output_index": index, "content_index": 0,
                "text": item.reasoning.text}))
            if self._summary:
                part = {"type": "summary_text", "text": item.reasoning.text}
                events += [
                    ("response.reasoning_summary_text.done", {
                        "item_id": item.id, "output_index": index, "summary_index": 0,
                        "text": item.reasoning.text}),
                    ("response.reasoning_summary_part.done", {
                        "item_id": item.id, "output_index": index, "summary_index": 0,
                        "part": part})]
        elif self._open == CUSTOM:
            text = item.custom_tool_call.input
            events += [
                ("response.custom_tool_call_input.delta", {
                    "item_id": item.id, "output_index": index, "delta": text}),
                ("response.custom_tool_call_input.done", {
                    "item_id": item.id, "output_index": index, "input": text})]
        elif self._open == MESSAGE:
            part = item.message.content[0]
            events += [
                ("response.output_text.done", {"item_id": item.id, "output_index": index,
                                               "content_index": 0, "text": part.text,
                                               "logprobs": []}),
                ("response.content_part.done", {"item_id": item.id, "output_index": index,
                                                "content_index": 0, "part": part_json(part)})]
        else:
            call = item.function_call
            events.append(("response.function_call_arguments.done", {
                "item_id": item.id, "output_index": index, "name": call.name,
                "arguments": call.arguments_json}))
        events.append(("response.output_item.done", {"output_index": index,
                                                     "item": self._item(item)}))
        self._open = None
        return events

    def _flush(self, index: int) -> None:
        pieces = self._pending.pop(index, None)
        if not pieces:
            return
        item = self.response.output[index]
        if item.HasField("message"):
            item.message.content[0].text += "".join(pieces)
        elif item.HasField("reasoning"):
            item.reasoning.text += "".join(pieces)
        elif item.HasField("custom_tool_call"):
            item.custom_tool_call.input = responses_tools.custom_input("".join(pieces))
        else:
            item.function_call.arguments_json += "".join(pieces)

    def _flush_all(self) -> None:
        """Fragments for an item that closed earlier (a parallel call's)."""
        for index in list(self._pending):
            self._flush(index)

    def finish(self) -> list[Event]:
        """The last item's closing events; sets the response's status. A
        response that generated nothing still has its (empty) message."""
        cut = self.finish_reason in (generation_pb2.FINISH_REASON_LENGTH,
                                     generation_pb2.FINISH_REASON_CONTENT_FILTER)
        events = []
        if not any(item.HasField("message") or item.HasField("function_call")
                   or item.HasField("custom_tool_call") for item in self.response.output):
            events += self._text("")
        events += self._close(rpb.ITEM_STATUS_INCOMPLETE if cut else rpb.ITEM_STATUS_COMPLETED)
        self._flush_all()
        if cut:
            self.response.status = rpb.RESPONSE_STATUS_INCOMPLETE
            self.response.incomplete_reason = (
                rpb.INCOMPLETE_REASON_CONTENT_FILTER
                if self.finish_reason == generation_pb2.FINISH_REASON_CONTENT_FILTER
                else rpb.INCOMPLETE_REASON_MAX_OUTPUT_TOKENS)
        else:
            self.response.status = rpb.RESPONSE_STATUS_COMPLETED
        return events

    def fail(self, code: str, message: str) -> list[Event]:
        events = self._close(rpb.ITEM_STATUS_INCOMPLETE)
        self._flush_all()
        self.response.status = rpb.RESPONSE_STATUS_FAILED
        self.response.error.code = code or "internal_error"
        self.response.error.message = message
        return events
