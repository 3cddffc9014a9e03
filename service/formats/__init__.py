"""Model families' own output syntaxes: which one the loaded model speaks,
found from its chat template, or named in its directory's settings.

One module per family (formats/hermes.py, llama3.py, mistral.py,
deepseek.py, harmony.py, qwen3_coder.py, gemma4.py) holds its `Family`:
detection, call syntax and, where the family has its own, reasoning syntax
(formats/base.py). Detection reads the
template text first (a template that announces `[AVAILABLE_TOOLS]` is
Mistral's, whatever its tokenizer), the tokenizer's special tokens second;
a template that shows no syntax gets Hermes', today's behaviour. Reasoning
is the family's own, else `<think>` where the template or the special tokens
show it.

A model's settings (`millm_model.json` beside its weights, or in a GGUF
repository's directory) may name both instead: `"tool_call_format"` and
`"reasoning_format"` (`"none"` switches reasoning off). An unknown name is a
load failure naming the setting. Adding a family is adding its module and
one line to FAMILIES.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.errors import EngineError
from service.formats import deepseek, gemma4, harmony, hermes, llama3, mistral, qwen3_coder
from service.formats.base import THINK, CallSyntax, Family, ReasoningSyntax

# In detection order: the first whose template test passes speaks for the model.
FAMILIES: tuple[Family, ...] = (harmony.FAMILY, gemma4.FAMILY, mistral.FAMILY, deepseek.R1,
                                deepseek.V3_1, qwen3_coder.FAMILY, hermes.FAMILY, llama3.FAMILY)
CALL_SYNTAXES: dict[str, CallSyntax] = {f.calls.name: f.calls for f in FAMILIES}
REASONINGS: dict[str, ReasoningSyntax] = {r.name: r for r in (THINK, mistral.THINK,
                                                              harmony.REASONING, gemma4.REASONING)}
NONE = "none"
TOOL_SETTING, REASONING_SETTING = "tool_call_format", "reasoning_format"


@dataclass(frozen=True)
class ModelFormat:
    """What the loaded model speaks."""

    calls: CallSyntax
    reasoning: ReasoningSyntax | None

    @property
    def tool_call_format(self) -> str:
        return self.calls.name

    @property
    def reasoning_format(self) -> str:
        return self.reasoning.name if self.reasoning is not None else NONE

    def writes(self, token_text: str) -> bool:
        """Whether a special token's text is part of this format's markup
        (`[TOOL_CALLS]`, `<|channel|>`, `<think>`): the engines let the model
        generate it, and show it as text for the parsers, where every other
        special token stays banned and unseen."""
        return bool(token_text) and any(token_text in marker for marker in self.markup)

    @property
    def markup(self) -> tuple[str, ...]:
        c, r = self.calls, self.reasoning
        marks = [c.call_open, c.name_close, c.call_close, c.separator, c.group_open,
                 c.group_close, c.trigger, *c.argument_markup]
        if r is not None:
            marks += [r.open, r.close, r.answer_open, r.answer_close]
        return tuple(m for m in marks if m)


def detect(template: str, special_tokens: tuple[str, ...] = ()) -> ModelFormat:
    family = next((f for f in FAMILIES if f.detect(template, special_tokens)), hermes.FAMILY)
    reasoning = family.reasoning
    if reasoning is None:
        if "[THINK]" in template:
            reasoning = mistral.THINK
        elif THINK.open in template or THINK.open in special_tokens:
            reasoning = THINK
    return ModelFormat(family.calls, reasoning)


def resolve(template: str, special_tokens: tuple[str, ...], settings: dict) -> ModelFormat:
    """The detected format, with what the model's settings name instead."""
    found = detect(template, special_tokens)
    calls, reasoning = found.calls, found.reasoning
    named = settings.get(TOOL_SETTING)
    if named is not None:
        if named not in CALL_SYNTAXES:
            raise _unknown(TOOL_SETTING, named, CALL_SYNTAXES)
        calls = CALL_SYNTAXES[named]
    named = settings.get(REASONING_SETTING)
    if named is not None:
        if named != NONE and named not in REASONINGS:
            raise _unknown(REASONING_SETTING, named, {**REASONINGS, NONE: None})
        reasoning = REASONINGS.get(named)
    return ModelFormat(calls, reasoning)


def _unknown(setting: str, named, known: dict) -> EngineError:
    return EngineError("model_load_failed", f"The model's setting '{setting}' names "
                       f"{named!r}, which is not a format; known: {', '.join(sorted(known))}.",
                       setting)
