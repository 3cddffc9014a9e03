"""A chat request's reasoning fields, checked, and the grammar of reasoning
followed by the answer.

OpenAI's `reasoning_effort` takes one of EFFORTS; the template gets it as
the variable `reasoning_effort` (harmony-style templates read it), and
"none" also switches thinking off (enable_thinking false where the template
reads it, else a budget of 0). `thinking_token_budget` (vLLM's name) caps
the tokens of reasoning: 0 to max_tokens. `chat_template_kwargs` are
variables for the template; the names a renderer sets itself are refused,
and names the template never mentions are reported as ignored (the whole
field when it reads none of them).

Where the answer starts depends on the rendered prompt (`prompt_mode`): a
generation prompt that opened the reasoning block (DeepSeek R1) starts the
answer inside it; one that closed it (Qwen3 with enable_thinking false) has
no reasoning; otherwise the model may open one. With a constraint
(response_format, structured_outputs) or a tool plan, or a budget, the
answer runs under one grammar (`Reasoned`): the
reasoning block is free text (at most `budget` tokens of it: xgrammar's
AnyText max_tokens, after which only the closing marker's tokens are
allowed, so the engine closes the block itself), and the constraint starts
where the block ends (xgrammar's reasoning modes: `formats/base.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from service.errors import invalid_parameter
from service.formats.base import CLOSED, OPEN, OPTIONAL, ReasoningSyntax
from service.requests.tools import ToolPlan

EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
# Variables the renderers set themselves (Hugging Face's and llama-cpp-python's).
RESERVED_TEMPLATE_NAMES = frozenset({
    "self", "conversation", "messages", "tools", "documents", "add_generation_prompt",
    "continue_final_message", "chat_template", "tokenize", "sanitize_control_tokens",
    "return_dict", "padding", "truncation", "max_length", "return_tensors",
    "return_assistant_tokens_mask", "tokenizer_kwargs", "eos_token", "bos_token",
    "raise_exception", "functions", "function_call", "tool_choice", "strftime_now",
    "return_generation_prompt",
    # Jinja's own globals, which templates call.
    "range", "dict", "lipsum", "cycler", "joiner", "namespace"})
# How much of the prompt's end is read to find an open or closed block.
PROMPT_TAIL_TOKENS = 48


@dataclass(frozen=True)
class ReasoningRequest:
    """The reasoning fields as checked (None: not sent)."""

    effort: str | None = None
    budget: int | None = None
    template_kwargs: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class ReasoningPlan:
    """How a generation's answer starts: the model's reasoning syntax, where
    the block stands (formats/base.py OPEN, OPTIONAL or CLOSED) and its budget."""

    syntax: ReasoningSyntax
    mode: str
    budget: int | None = None


def check_reasoning(effort: str | None, budget: int | None, template_kwargs: dict | None,
                    max_tokens: int | None) -> ReasoningRequest:
    if effort is not None and effort not in EFFORTS:
        raise invalid_parameter("reasoning_effort", f"'reasoning_effort' must be one of "
                                f"{', '.join(EFFORTS)}; got {effort[:64]!r}.")
    if budget is not None:
        top = max_tokens if max_tokens is not None else None
        if budget < 0 or (top is not None and budget > top):
            bound = f"max_tokens ({top})" if top is not None else "max_tokens"
            raise invalid_parameter("thinking_token_budget", f"'thinking_token_budget' must "
                                    f"be from 0 to {bound}; got {budget}.")
    kwargs = template_kwargs or {}
    if not isinstance(kwargs, dict):
        raise invalid_parameter("chat_template_kwargs", "'chat_template_kwargs' must be an "
                                "object.")
    for name in kwargs:
        if name in RESERVED_TEMPLATE_NAMES:
            raise invalid_parameter(f"chat_template_kwargs.{name}", f"'chat_template_kwargs."
                                    f"{name}' is set by the renderer itself.")
    return ReasoningRequest(effort, budget, tuple(kwargs.items()))


def template_variables(request: ReasoningRequest, template: str,
                       unused: list[str]) -> dict:
    """The variables the template gets; names it never mentions are added
    to `unused`."""
    variables = dict(request.template_kwargs)
    missing = [name for name in variables if name not in template]
    if missing and len(missing) == len(variables):
        unused.append("chat_template_kwargs")  # the template reads none of them
    else:
        unused.extend(f"chat_template_kwargs.{name}" for name in missing)
    if request.effort is not None:
        variables.setdefault("reasoning_effort", request.effort)
        if request.effort == "none" and "enable_thinking" in template:
            variables.setdefault("enable_thinking", False)
    return variables


def check_budget(budget: int, max_tokens: int) -> None:
    """The budget against the completion's room once it is known."""
    if budget > max_tokens:
        raise invalid_parameter("thinking_token_budget", f"'thinking_token_budget' must be "
                                f"from 0 to max_tokens ({max_tokens}); got {budget}.")


def prompt_mode(syntax: ReasoningSyntax, tail: str) -> str:
    """Where the answer starts, from the rendered prompt's end."""
    opened = tail.rfind(syntax.open)
    closed = tail.rfind(syntax.close) if syntax.prompt_closes else -1
    if opened > closed and not tail[opened + len(syntax.open):].strip():
        return OPEN
    if closed >= 0 and closed > opened and not tail[closed + len(syntax.close):].strip():
        return CLOSED
    return OPTIONAL


def plan_for(syntax: ReasoningSyntax, mode: str, request: ReasoningRequest,
             template: str, unused: list[str]) -> ReasoningPlan:
    budget = request.budget
    if request.effort == "none" and "enable_thinking" not in template and budget is None:
        budget = 0
    if mode == CLOSED and request.budget is not None:
        unused.append("thinking_token_budget")  # the prompt switched thinking off
    return ReasoningPlan(syntax, mode, budget if mode != CLOSED else None)


@dataclass(frozen=True)
class Reasoned:
    """A grammar that lets the reasoning block come first: then the
    response_format or tool plan `inner` (None: free text)."""

    plan: ReasoningPlan
    inner: object = None  # structured_output.Constraint or tools.ToolPlan

    @property
    def key(self) -> str:
        plan = self.plan
        return (f"reasoned:{plan.syntax.name}:{plan.mode}:{plan.budget}:"
                + (self.inner.key if self.inner is not None else "text"))

    @property
    def param(self) -> str:
        return self.inner.param if self.inner is not None else "thinking_token_budget"

    @property
    def is_json(self) -> bool:
        return getattr(self.inner, "is_json", True)

    def refused(self, message: str):
        """The constraint's own refusal when its grammar does not compile."""
        refused = getattr(self.inner, "refused", None)
        if refused is not None:
            return refused(message)
        return invalid_parameter(self.param, f"'{self.param}' could not be compiled: {message}")

    def compile(self, compiler):
        from xgrammar import structural_tag as st

        plan = self.plan
        syntax = plan.syntax
        answer = (self.inner.structural_format() if self.inner is not None
                  else st.AnyTextFormat())
        if syntax.answer_open and not isinstance(self.inner, ToolPlan):
            # The answer in its own markup (harmony's final channel); calls have theirs.
            answer = st.SequenceFormat(elements=[st.ConstStringFormat(value=syntax.answer_open),
                                                 answer])
        prefix = syntax.prefix(plan.mode, plan.budget)
        shape = answer if prefix is None else st.SequenceFormat(elements=[prefix, answer])
        return compiler.compile_structural_tag(st.StructuralTag(format=shape))


def grammar_item(plan: ReasoningPlan | None, inner):
    """What the engine compiles for a generation: `inner` alone, or inner
    after a reasoning block; None when nothing constrains it."""
    if plan is None or plan.mode == CLOSED:
        return inner
    if inner is None and plan.budget is None:
        return None
    return Reasoned(plan, inner)
