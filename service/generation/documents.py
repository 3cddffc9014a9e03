"""Structured output's last line of defence: a constrained choice is checked
when it ends, before its last delta leaves the engine (a JSON document with
jsonschema, the other kinds against their compiled grammar)."""

from __future__ import annotations

import logging

from service.errors import EngineError
from service.generation.job import FinishReason, StepOutput
from service.structured_output import Constraint, document_problem

log = logging.getLogger(__name__)


class DocumentCheck:
    """"stop" is only ever reported for a document that parses and, for
    json_schema, validates. A choice cut by max_tokens ends "length" and is not
    checked (its text is incomplete by definition)."""

    def __init__(self, constraint: Constraint, grammar=None):
        self.constraint = constraint
        self.grammar = grammar
        self.texts: dict[int, list[str]] = {}

    def check(self, step: StepOutput) -> None:
        for delta in step.deltas:
            self.texts.setdefault(delta.index, []).append(delta.text)
            if delta.finish_reason == FinishReason.STOP:
                problem = document_problem(self.constraint, "".join(self.texts[delta.index]),
                                           self.grammar)
                if problem is not None:
                    # The problem text can quote the output: it goes to the caller only.
                    log.error("constrained output of choice %d failed validation", delta.index)
                    raise EngineError("constrained_output_invalid", f"Choice {delta.index} "
                                      f"finished a document that is not valid: {problem}.")
