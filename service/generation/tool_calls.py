"""Tool calls parsed out of a choice's text as it streams.

The grammar (requests/tools.py) holds every call to one syntax:

    <tool_call>
    {"name": "<function>", "arguments": <JSON object>}
    </tool_call>

so a small state machine per choice can split the text into content and
call fragments without ever letting half a call into the content: text that
could still become `<tool_call>` is held back until it cannot (as stop
sequences are). A call's first fragment carries its index, id and name; its
arguments follow in pieces as they are generated. Each finished call's
arguments are validated against the tool's schema before the choice may end
with finish_reason "tool_calls" (the rule structured output follows).
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass

from service import json_text
from service.errors import EngineError
from service.generation.job import ChoiceDelta, FinishReason, StepOutput, ToolCallFragment
from service.requests.tools import AUTO, CALL_CLOSE, CALL_OPEN, ToolPlan

log = logging.getLogger(__name__)

TEXT, LITERAL, NAME, ARGUMENTS = "text", "literal", "name", "arguments"
AFTER_OPEN = '\n{"name": "'
BEFORE_ARGUMENTS = ', "arguments": '  # after the name's closing quote
AFTER_ARGUMENTS = "}\n" + CALL_CLOSE


def invalid_call(message: str) -> EngineError:
    return EngineError("constrained_output_invalid", message)


@dataclass
class _Call:
    id: str
    name: str = ""
    arguments: str = ""


class ChoiceCalls:
    """One choice's parser."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.state = TEXT
        self.pending = ""  # text not yet known to be content
        self.literal, self.then = "", TEXT
        self.calls: list[_Call] = []
        self.depth, self.in_string, self.escaped = 0, False, False
        self.finished_calls = 0
        self.piece: list[str] = []  # arguments not yet in a fragment

    def feed(self, text: str) -> tuple[str, list[ToolCallFragment]]:
        content, fragments = [], []
        if self.state == TEXT and not self.pending and "<" not in text:
            ready = text.rstrip()  # plain text: only trailing whitespace is held
            self.pending = text[len(ready):]
            return ready, fragments
        specials = '"\\' if self.in_string else '"{}[]'
        if (self.state == ARGUMENTS and not self.escaped and min(text, default=" ") >= " "
                and not any(c in text for c in specials)):
            # Inside the arguments, nothing that opens or closes: one piece.
            self.calls[-1].arguments += text
            fragments.append(ToolCallFragment(len(self.calls) - 1, arguments=text))
            return "", fragments
        for c in text:
            self._step(c, content, fragments)
        self._flush(fragments)
        if self.state == TEXT:
            content.append(self._release())
        return "".join(content), fragments

    def _flush(self, fragments: list[ToolCallFragment]) -> None:
        """The arguments generated since the last fragment, as one fragment."""
        if self.piece:
            fragments.append(ToolCallFragment(len(self.calls) - 1, arguments="".join(self.piece)))
            self.piece = []

    def _release(self) -> str:
        """Pending text that can no longer start a call. Trailing whitespace
        is held too: whitespace next to a call is not content, and the answer
        must not depend on where the text was cut into steps."""
        keep = next((k for k in range(min(len(CALL_OPEN) - 1, len(self.pending)), 0, -1)
                     if CALL_OPEN.startswith(self.pending[-k:])), 0)
        ready = self.pending[:len(self.pending) - keep].rstrip()
        self.pending = self.pending[len(ready):]
        return ready

    def _step(self, c: str, content: list[str], fragments: list[ToolCallFragment]) -> None:
        if self.state == TEXT:
            self.pending += c
            if self.pending.endswith(CALL_OPEN):
                # Whitespace around calls is not content.
                content.append(self.pending[:-len(CALL_OPEN)].rstrip())
                self.pending = ""
                self.calls.append(_Call("call_" + secrets.token_hex(12)))
                self._expect(AFTER_OPEN, NAME)
        elif self.state == LITERAL:
            if c != self.literal[0]:
                raise invalid_call(f"Tool call {len(self.calls) - 1} is not in the call syntax.")
            self.literal = self.literal[1:]
            if not self.literal:
                self.state = self.then
                if self.then == TEXT:
                    self.finished_calls += 1
        elif self.state == NAME:
            call = self.calls[-1]
            if c != '"':
                call.name += c
                return
            if self.plan.schema_of(call.name) is None:
                raise invalid_call(f"Tool call {len(self.calls) - 1} names '{call.name}', "
                                   "which is not among the tools.")
            fragments.append(ToolCallFragment(len(self.calls) - 1, call.id, call.name, ""))
            self._expect(BEFORE_ARGUMENTS, ARGUMENTS)
            self.depth, self.in_string, self.escaped = 0, False, False
        else:
            self._argument(c, fragments)

    def _argument(self, c: str, fragments: list[ToolCallFragment]) -> None:
        call = self.calls[-1]
        if self.in_string and c < " ":
            # The grammar's strings let a raw control character through; it is
            # written escaped, so the arguments stay JSON that any parser reads.
            c = json.dumps(c)[1:-1]
        call.arguments += c
        self.piece.append(c)
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif c == "\\":
                self.escaped = True
            elif c == '"':
                self.in_string = False
        elif c == '"':
            self.in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            if self.depth == 0:
                self._flush(fragments)
                self._check(call)
                self._expect(AFTER_ARGUMENTS, TEXT)

    def _expect(self, literal: str, then: str) -> None:
        self.state, self.literal, self.then = LITERAL, literal, then

    def _check(self, call: _Call) -> None:
        import jsonschema

        index = len(self.calls) - 1
        try:
            arguments = json_text.loads(call.arguments)
        except ValueError as exc:
            raise invalid_call(f"Tool call {index}'s arguments are not JSON ({exc}).") from None
        validator = jsonschema.Draft202012Validator(
            self.plan.schema_of(call.name),
            format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
        if error is not None:
            # The message can quote the output: it goes to the caller only.
            log.error("tool call arguments failed validation")
            raise invalid_call(f"Tool call {index}'s arguments fail the schema of "
                               f"'{call.name}': {error.message}.")

    def finish(self, reason: str | None) -> tuple[str, str | None]:
        """(content still held, the choice's finish reason)."""
        if self.state != TEXT and reason == FinishReason.STOP:
            raise invalid_call(f"Tool call {len(self.calls) - 1} ended unfinished.")
        held = self.pending if self.state == TEXT else ""
        self.pending = ""
        between = self.state == TEXT and not held.strip()  # not inside a call or its opening
        if self.finished_calls and between:
            held = ""
        if self.plan.mode != AUTO:
            # A forced or required choice's grammar writes nothing but calls:
            # what is held is the opening of a call cut short, never content.
            # Cut by max_tokens between calls or after the last, the answer
            # is whole; cut inside a call, it stays "length".
            held = ""
            if self.finished_calls and between and reason == FinishReason.LENGTH:
                return held, FinishReason.TOOL_CALLS
        if reason == FinishReason.STOP and self.finished_calls:
            return held, FinishReason.TOOL_CALLS
        return held, reason


class ToolCalls:
    """Every choice's parser for one generation, applied to its steps."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.choices: dict[int, ChoiceCalls] = {}

    def apply(self, step: StepOutput) -> StepOutput:
        deltas = []
        for d in step.deltas:
            parser = self.choices.setdefault(d.index, ChoiceCalls(self.plan))
            content, fragments = parser.feed(d.text)
            reason = d.finish_reason
            if reason is not None:
                held, reason = parser.finish(reason)
                content += held
            deltas.append(ChoiceDelta(d.index, content, d.token_ids, reason, d.logprobs,
                                      tuple(fragments), d.stop_sequence))
        return StepOutput(tuple(deltas))
