"""What each model step goes through before its reader sees it.

A generation's steps pass, in order, the document check of a reasoning
model's whole text (pattern, choice or grammar), the reasoning split, the
document check of the answer alone (JSON after reasoning, any constraint
without it) and tool-call parsing. Each stage reads the model's own steps one
at a time, and steps a slow reader left piled up are joined only after them:
a joined step could hold the last reasoning tokens, the block's close and the
answer's first words at once, and the count of reasoning tokens, made a step
at a time (generation/reasoning.py), would then move with how fast the reader
(a loaded bridge) takes its events.
"""

from __future__ import annotations

import dataclasses

from service.generation.documents import DocumentCheck
from service.generation.job import StepOutput, join_steps
from service.generation.reasoning import Reasoning
from service.generation.tool_calls import ToolCalls
from service.requests.generation import ValidatedGeneration
from service.structured_output import CHOICE, GRAMMAR


class Stages:
    def __init__(self, spec: ValidatedGeneration):
        self.documents = (DocumentCheck(spec.constraint, spec.grammar) if spec.constraint
                          else None)
        self.calls = ToolCalls(spec.tools) if spec.tools else None
        self.thinking = (Reasoning(spec.reasoning.syntax, spec.reasoning.mode)
                         if spec.reasoning is not None else None)
        # After reasoning, a JSON document is the answer's alone; a pattern,
        # choice or grammar is checked against the whole text its grammar
        # (reasoning block and all: requests/reasoning.py) generated.
        self.whole = (self.documents is not None and self.thinking is not None
                      and not spec.constraint.is_json)
        if self.whole and spec.constraint.kind == CHOICE:  # the grammar holds the choices
            self.documents = DocumentCheck(
                dataclasses.replace(spec.constraint, kind=GRAMMAR), spec.grammar)
        self.idle = self.documents is None and self.calls is None and self.thinking is None

    @property
    def reasoning_tokens(self) -> int:
        return self.thinking.tokens if self.thinking is not None else 0

    def apply(self, step: StepOutput) -> StepOutput:
        """One model step (or a join of steps no stage has seen) through every stage."""
        if self.whole:
            self.documents.check(step)
        if self.thinking is not None:
            # The reasoning first: the document and the calls are the answer's.
            step = self.thinking.apply(step)
        if self.documents is not None and not self.whole:
            self.documents.check(step)
        if self.calls is not None:
            step = self.calls.apply(step)
        return step

    def pile(self, steps: list[StepOutput]) -> StepOutput:
        """Steps that piled up, each through the stages, then joined."""
        if len(steps) == 1:
            return self.apply(steps[0])
        if self.idle:
            return join_steps(steps)
        return join_steps([self.apply(step) for step in steps])
