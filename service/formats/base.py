"""What a model family's output syntax is made of, and the grammar built
from it.

A family writes its tool calls as literal markup around a JSON object of
arguments, which fits one shape for every family served here:

    [group_open] call_open NAME name_close {ARGUMENTS} call_close
                 [separator call_open NAME ...] [group_close]

(Hermes/Qwen: `<tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>`;
Mistral: `[TOOL_CALLS]NAME[ARGS]{...}`; DeepSeek V3.1:
`<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
<｜tool▁calls▁end｜>`). A family that thinks first wraps its reasoning in an
opening and a closing marker (`<think>` ... `</think>`). The same data drive
the grammar (`calls_format`, `reasoning_prefix`: xgrammar structural-tag
parts, so the grammar and the parser can never disagree on a character) and
the streaming parsers (generation/tool_calls.py, generation/reasoning.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Where a request's reasoning starts (the rendered prompt decides):
OPEN = "open"  # the generation prompt opened the block: the answer starts inside it
OPTIONAL = "optional"  # the model may open one at the start of its answer
CLOSED = "closed"  # the prompt closed it already (thinking switched off): none follows


@dataclass(frozen=True)
class ReasoningSyntax:
    name: str  # the reasoning_format reported (GetCapabilities, /api/capabilities)
    open: str
    close: str
    # Markup around the answer itself (harmony's final channel), left out of
    # the content like the reasoning markers.
    answer_open: str = ""
    answer_close: str = ""
    # Whether a generation prompt can close the block (thinking switched
    # off); harmony's close is where every assistant message starts.
    prompt_closes: bool = True

    def prefix(self, mode: str, budget: int | None):
        """The grammar of the reasoning block in `mode` (None: CLOSED), at most
        `budget` tokens of thinking before the close is forced."""
        from xgrammar import structural_tag as st

        if mode == CLOSED:
            return None
        block = st.TagFormat(begin="" if mode == OPEN else self.open,
                             content=st.AnyTextFormat(max_tokens=budget), end=self.close)
        return block if mode == OPEN else st.OptionalFormat(content=block)


class ArgumentNotation:
    """How a family writes a call's arguments when they are not JSON text.
    The family's module subclasses it (formats/qwen3_coder.py's XML,
    formats/gemma4.py's notation) and names it in its CallSyntax, so this
    module knows no family's module (they import it)."""

    style = ""  # xgrammar's JSON-schema style for them ("qwen_xml", "gemma")
    markup: tuple[str, ...] = ()  # markers inside them

    def text(self, arguments_json: str, call_close: str) -> tuple[str, str]:
        """JSON arguments as the model writes them, and the call's close as
        written after them."""
        raise NotImplementedError

    def reader(self, schema: dict | None, call_close: str) -> tuple:
        """What reads the arguments back into JSON text (`feed` a character,
        get the JSON it completes; `done` at their end), and the part of
        `call_close` left to expect once it is done."""
        raise NotImplementedError


@dataclass(frozen=True)
class CallSyntax:
    name: str  # the tool_call_format reported
    call_open: str
    name_close: str
    call_close: str
    separator: str = "\n"
    group_open: str = ""
    group_close: str = ""
    # Free text opens calls with this (a prefix of group_open or call_open).
    trigger: str = ""
    # How arguments are written when not as JSON text (None: JSON).
    arguments: ArgumentNotation | None = None

    @property
    def argument_markup(self) -> tuple[str, ...]:
        """Markers inside non-JSON arguments."""
        return self.arguments.markup if self.arguments is not None else ()

    @property
    def opener(self) -> str:
        """What the parser watches for in free text."""
        return self.trigger or self.group_open or self.call_open

    def call_text(self, name: str, arguments_json: str) -> str:
        """One call written out (with its group markers): what the grammar
        constrains and the parser reads."""
        arguments, close = arguments_json, self.call_close
        if self.arguments is not None:
            arguments, close = self.arguments.text(arguments_json, close)
        return (f"{self.group_open}{self.call_open}{name}{self.name_close}{arguments}"
                f"{close}{self.group_close}")

    def arguments_format(self, schema: dict):
        """The grammar of a call's arguments when they are not JSON text (the
        schema in xgrammar's qwen_xml or gemma style); None for JSON."""
        if self.arguments is None:
            return None
        from xgrammar import structural_tag as st

        from service.structured_output import grammar_schema

        # Whitespace between tokens at most one character at a time: left
        # free, a small model can lay out whitespace until max_tokens.
        return st.JSONSchemaFormat(json_schema=grammar_schema(schema), style=self.arguments.style,
                                   max_whitespace_cnt=1)

    def argument_reader(self, schema: dict | None):
        """What reads a call's arguments back into JSON when they are not
        JSON text (None for JSON), and the part of call_close left to expect
        once it is done."""
        if self.arguments is None:
            return None, ""
        return self.arguments.reader(schema, self.call_close)

    def calls_format(self, tags: list, auto: bool, one: bool):
        """The calls part of a tool plan's grammar: `tags` are the per-tool
        TagFormats from `tag`. `auto`: free text, each call constrained once
        the model opens one; otherwise calls only (nothing before the first,
        the separator between them, nothing after the last). `one`: a single
        call."""
        from xgrammar import structural_tag as st

        calls = st.TagsWithSeparatorFormat(tags=tags, separator=self.separator,
                                           at_least_one=True, stop_after_first=one)
        if self.group_open:
            group = st.TagFormat(begin=self.group_open, content=calls, end=self.group_close)
            if auto:
                return st.TriggeredTagsFormat(triggers=[self.opener], tags=[group],
                                              stop_after_first=True)
            return group
        if auto:
            return st.TriggeredTagsFormat(triggers=[self.opener], tags=tags,
                                          stop_after_first=one)
        return calls

    def tag(self, name: str, arguments):
        from xgrammar import structural_tag as st

        return st.TagFormat(begin=f"{self.call_open}{name}{self.name_close}", content=arguments,
                            end=self.call_close)


@dataclass(frozen=True)
class Family:
    """One model family's unit: how it is recognised and how it writes."""

    name: str
    calls: CallSyntax
    # The family's own reasoning syntax (None: it thinks only if the template
    # shows `<think>`, found by detection).
    reasoning: ReasoningSyntax | None
    # Whether a chat template (its text) and the tokenizer's special tokens are this family's.
    detect: Callable[[str, tuple[str, ...]], bool]
    summary: str = ""  # how it is detected, for the docs' table


THINK = ReasoningSyntax("think", "<think>", "</think>")
