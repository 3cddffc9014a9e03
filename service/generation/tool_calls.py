"""Tool calls parsed out of a choice's text as it streams.

The grammar (requests/tools.py) holds every call to the model's own syntax
(formats/base.py's CallSyntax; Hermes here):

    <tool_call>
    {"name": "<function>", "arguments": <JSON object>}
    </tool_call>

so a small state machine per choice can split the text into content and
call fragments without ever letting half a call into the content: text that
could still become the syntax's opener (`<tool_call>`) is held back until it
cannot (as stop sequences are). After the opener the markup is literal text
the parser expects character by character; a name runs to the first
character no name may hold; the arguments run until their JSON object
closes. A call's first fragment carries its index, id and name; its
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
from service.requests.tools import AUTO, ToolPlan

log = logging.getLogger(__name__)

TEXT, LITERAL, NAME, ARGUMENTS = "text", "literal", "name", "arguments"
CALL_ENDED = "call_ended"  # a literal's target: the call is whole
CUT = "cut"  # max_tokens ended the choice inside markup: nothing more is read
NAME_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


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
        self.syntax = syntax = plan.syntax
        self.opener = syntax.opener
        self.state = TEXT
        self.pending = ""  # text not yet known to be content
        # LITERAL: the texts that may follow, each with the state it leads to.
        self.options: list[tuple[str, str]] = []
        self.calls: list[_Call] = []
        self.depth, self.in_string, self.escaped = 0, False, False
        self.finished_calls = 0
        self.cut = False
        # A call's arguments in a notation other than JSON (XML, Gemma's),
        # while they are read, and what of the call's close follows them.
        self.reader, self.after_reader = None, ""
        self.piece: list[str] = []  # arguments not yet in a fragment

    def feed(self, text: str, cut: bool = False) -> tuple[str, list[ToolCallFragment]]:
        """Content and call fragments of the next text; `cut`: the last text of
        a choice max_tokens ended, whose markup may stop anywhere (even inside a
        character, flushed as U+FFFD), so it is never refused as out of syntax."""
        self.cut = cut
        content, fragments = [], []
        if self.state == TEXT and not self.pending and self.opener[0] not in text:
            ready = text.rstrip()  # plain text: only trailing whitespace is held
            self.pending = text[len(ready):]
            return ready, fragments
        specials = '"\\' if self.in_string else '"{}[]'
        if (self.state == ARGUMENTS and self.reader is None and not self.escaped
                and min(text, default=" ") >= " " and not any(c in text for c in specials)):
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
        keep = next((k for k in range(min(len(self.opener) - 1, len(self.pending)), 0, -1)
                     if self.opener.startswith(self.pending[-k:])), 0)
        ready = self.pending[:len(self.pending) - keep].rstrip()
        self.pending = self.pending[len(ready):]
        return ready

    def _step(self, c: str, content: list[str], fragments: list[ToolCallFragment]) -> None:
        if self.state == TEXT:
            self.pending += c
            if self.pending.endswith(self.opener):
                # Whitespace around calls is not content.
                content.append(self.pending[:-len(self.opener)].rstrip())
                self.pending = ""
                syntax = self.syntax
                rest = (syntax.group_open + syntax.call_open)[len(self.opener):]
                self._expect([(rest, NAME)])
        elif self.state == CUT:
            return
        elif self.state == LITERAL:
            options = [(text[1:], then) for text, then in self.options if text[:1] == c]
            if not options and self.cut:
                self.state = CUT  # the choice ends here, in the middle of its markup
                return
            if not options:
                raise invalid_call(f"Tool call {max(len(self.calls) - 1, 0)} is not in the "
                                   "call syntax.")
            self._expect(options)
        elif self.state == NAME:
            call = self.calls[-1]
            if c in NAME_CHARACTERS:
                call.name += c
                return
            if self.plan.schema_of(call.name) is None:
                raise invalid_call(f"Tool call {len(self.calls) - 1} names '{call.name}', "
                                   "which is not among the tools.")
            fragments.append(ToolCallFragment(len(self.calls) - 1, call.id, call.name, ""))
            self.depth, self.in_string, self.escaped = 0, False, False
            schema = self.plan.schema_of(call.name)
            self.reader, self.after_reader = self.syntax.argument_reader(schema)
            self._expect([(self.syntax.name_close, ARGUMENTS)])
            self._step(c, content, fragments)  # the first character after the name
        else:
            self._argument(c, fragments)

    def _argument(self, c: str, fragments: list[ToolCallFragment]) -> None:
        call = self.calls[-1]
        if self.reader is not None:
            self._read_argument(c, call, fragments)
            return
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
                self._expect([(self.syntax.call_close, CALL_ENDED)])

    def _read_argument(self, c: str, call: _Call, fragments: list[ToolCallFragment]) -> None:
        """Arguments in XML (formats/qwen3_coder.py) or Gemma's notation
        (formats/gemma4.py), written out as JSON."""
        try:
            written = self.reader.feed(c)
        except ValueError:
            raise invalid_call(f"Tool call {len(self.calls) - 1}'s arguments are not in the "
                               "call syntax.") from None
        if written:
            call.arguments += written
            fragments.append(ToolCallFragment(len(self.calls) - 1, arguments=written))
        if self.reader.done:
            self.reader = None
            self._check(call)
            self._expect([(self.after_reader, CALL_ENDED)])

    def _expect(self, options: list[tuple[str, str]]) -> None:
        """Expect one of `options`' texts next; a whole one moves to its state."""
        done = next((then for text, then in options if not text), None)
        if done is None:
            self.state, self.options = LITERAL, options
        elif done == NAME:
            self.state = NAME
            self.calls.append(_Call("call_" + secrets.token_hex(12)))
        elif done == CALL_ENDED:
            self.finished_calls += 1
            syntax = self.syntax
            if syntax.group_open:
                # Another call of the group, or its end.
                self._expect([(syntax.separator + syntax.call_open, NAME),
                              (syntax.group_close, TEXT)])
            else:
                self.state = TEXT
        else:
            self.state = done

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
        if (self.state == LITERAL and reason == FinishReason.STOP
                and any(then == CALL_ENDED for _, then in self.options)):
            # The call's closing marker is the model's end-of-generation token
            # (gpt-oss's <|call|>), whose text no text carries: the end closes it.
            self._expect([("", CALL_ENDED)])
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
            content, fragments = parser.feed(d.text, d.finish_reason in (
                FinishReason.LENGTH, FinishReason.CONTENT_FILTER))
            reason = d.finish_reason
            if reason is not None:
                held, reason = parser.finish(reason)
                content += held
            deltas.append(ChoiceDelta(d.index, content, d.token_ids, reason, d.logprobs,
                                      tuple(fragments), stop_sequence=d.stop_sequence,
                                      reasoning=d.reasoning))
        return StepOutput(tuple(deltas))
