"""Reasoning split out of a choice's text as it streams.

A model with a reasoning format (formats/base.py's ReasoningSyntax) writes
its thinking between an opening and a closing marker (`<think>` and
`</think>`). Where the generation prompt opened the block already (DeepSeek
R1's templates), the answer starts inside it; where the model may open one
(Qwen3), only at the very start of its answer (whitespace aside). Everything
inside goes to the delta's `reasoning`, everything after to its `text`; the
markers and the whitespace next to them go to neither, nor does markup
around the answer itself (harmony's final channel: `answer_open`,
`answer_close`). Text that could still
be a marker is held back until it cannot, so a marker cut across steps never
leaks. The tokens of a step that wrote reasoning (and no answer) are counted
as reasoning tokens (usage.completion_tokens_details.reasoning_tokens).

The thinking budget is the grammar's (requests/reasoning.py): the engine
masks every token but the closing marker's once the budget is spent, so
this parser sees a closed block like any other. `CloseWatch` tells the
engine's row when its reasoning has closed (JSON's control-character ban
applies only after it).
"""

from __future__ import annotations

from service.formats.base import OPEN, OPTIONAL, ReasoningSyntax
from service.generation.job import ChoiceDelta, StepOutput

START, INSIDE, AFTER, DONE = "start", "inside", "after", "done"


def _held(text: str, marker: str) -> int:
    """How many trailing characters of `text` could begin `marker`."""
    return next((k for k in range(min(len(marker) - 1, len(text)), 0, -1)
                 if marker.startswith(text[-k:])), 0)


class ChoiceReasoning:
    """One choice's splitter."""

    def __init__(self, syntax: ReasoningSyntax, mode: str):
        self.open, self.close = syntax.open, syntax.close
        self.answer_open, self.answer_close = syntax.answer_open, syntax.answer_close
        self.state = INSIDE if mode == OPEN else START if mode == OPTIONAL else AFTER
        self.pending = ""
        self.fresh = True  # no reasoning written yet: its leading whitespace is dropped
        # The answer has not begun: its leading whitespace (and answer_open) go.
        self.trim = True
        self.tokens = 0

    def feed(self, text: str, tokens: int = 0) -> tuple[str, str]:
        """(reasoning, answer) of the next piece of text."""
        reasoning, answer = [], []
        began = self.state
        self.pending += text
        while self.pending:
            if self.state == DONE:
                self.pending = ""  # after the answer's close: neither
            elif self.state == START:
                stripped = self.pending.lstrip()
                if stripped.startswith(self.open):
                    self.state, self.pending = INSIDE, stripped[len(self.open):]
                elif not stripped or self.open.startswith(stripped):
                    break  # could still open the block
                else:
                    self.state = AFTER
            elif self.state == INSIDE:
                at = self.pending.find(self.close)
                if at >= 0:
                    reasoning.append(self._reasoning(self.pending[:at].rstrip()))
                    self.state, self.trim = AFTER, True
                    self.pending = self.pending[at + len(self.close):]
                    continue
                keep = _held(self.pending, self.close)
                ready = self.pending[:len(self.pending) - keep]
                body = ready.rstrip()  # whitespace before the close is not reasoning
                reasoning.append(self._reasoning(body))
                self.pending = ready[len(body):] + self.pending[len(ready):]
                break
            elif self.trim:
                stripped = self.pending.lstrip()
                if self.answer_open and stripped.startswith(self.answer_open):
                    stripped = stripped[len(self.answer_open):].lstrip()
                elif not stripped or (self.answer_open and self.answer_open.startswith(stripped)):
                    self.pending = stripped
                    break  # could still be the answer's own opening
                self.pending, self.trim = stripped, False
            else:
                answer.append(self._answer())
                break
        reasoned = "".join(reasoning)
        if reasoned or (began == INSIDE or self.state == INSIDE) and not answer:
            self.tokens += tokens
        return reasoned, "".join(answer)

    def _answer(self) -> str:
        """The pending answer, but for what could begin its closing markup."""
        if not self.answer_close:
            ready, self.pending = self.pending, ""
            return ready
        at = self.pending.find(self.answer_close)
        if at >= 0:
            ready, self.pending = self.pending[:at], ""
            self.answer_close = ""  # what follows its close is not the answer's either
            self.state = DONE
            return ready
        keep = _held(self.pending, self.answer_close)
        ready = self.pending[:len(self.pending) - keep]
        self.pending = self.pending[len(ready):]
        return ready

    def _reasoning(self, text: str) -> str:
        if self.fresh:
            text = text.lstrip()
            self.fresh = not text
        return text

    def finish(self) -> tuple[str, str]:
        """What is held when the choice ends: reasoning cut short, or an
        answer that only looked like the start of a marker."""
        held, self.pending = self.pending, ""
        if self.state == INSIDE:
            return self._reasoning(held.rstrip()), ""
        if self.state == START:
            return "", held
        if self.state == DONE or (self.trim and not held.strip()):
            return "", ""
        return "", held


class Reasoning:
    """Every choice's splitter for one generation, applied to its steps."""

    def __init__(self, syntax: ReasoningSyntax, mode: str):
        self.syntax, self.mode = syntax, mode
        self.choices: dict[int, ChoiceReasoning] = {}

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.choices.values())

    def apply(self, step: StepOutput) -> StepOutput:
        deltas = []
        for d in step.deltas:
            choice = self.choices.setdefault(d.index, ChoiceReasoning(self.syntax, self.mode))
            reasoning, text = choice.feed(d.text, len(d.token_ids))
            if d.finish_reason is not None:
                more, rest = choice.finish()
                reasoning, text = reasoning + more, text + rest
            deltas.append(ChoiceDelta(d.index, text, d.token_ids, d.finish_reason, d.logprobs,
                                      d.tool_calls, stop_sequence=d.stop_sequence,
                                      reasoning=d.reasoning + reasoning))
        return StepOutput(tuple(deltas))


class CloseWatch:
    """Model thread: whether a row's reasoning block has closed, from its
    text as it is generated."""

    def __init__(self, close_marker: str):
        self.close, self.tail, self.closed = close_marker, "", False

    def push(self, text: str) -> bool:
        if not self.closed:
            self.tail = (self.tail + text)[-(len(self.close) + len(text)):]
            self.closed = self.close in self.tail
        return self.closed
