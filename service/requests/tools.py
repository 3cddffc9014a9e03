"""Tool calling: a request's tools, its tool choice and its tool history,
checked and turned into a ToolPlan the engines constrain with.

The calls are written in the loaded model's own syntax (service/formats: one
per family; Hermes, which Qwen 2.5/3, Hermes and the demo model's templates
use, when the template shows none):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The grammar is assembled from xgrammar's structural-tag parts by the
family's CallSyntax (formats/base.py). For `auto` each call is constrained
once the model opens one (its trigger, `<tool_call>` here). A forced or
required choice is only calls, as OpenAI answers it: no text before the
first, the family's separator between them, and after the last (the only one
when the choice names a function or parallel_tool_calls is false) nothing
but the end of the message. Arguments are spaced as json.dumps spaces them.
generation/tool_calls.py parses the calls back out of the text. A template
that renders tools itself gets them natively; any other gets them described
in a system turn in the Hermes syntax (`plain_messages`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from service import json_text
from service.errors import EngineError, invalid_parameter
from service.formats import hermes
from service.formats.base import CallSyntax
from service.requests import custom_tools
from service.schema_limits import RepeatBudget
from service.schema_relax import relax
from service.structured_output import MAX_SCHEMA_BYTES, NAME_PATTERN, check_schema, unsupported

MAX_TOOLS = 128
NONE, AUTO, REQUIRED, FUNCTION = "none", "auto", "required", "function"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class FunctionTool:
    name: str
    description: str = ""
    parameters_json: str = ""  # as sent; empty: any object
    strict: bool | None = None
    # A custom (freeform) tool's input format, (syntax, definition):
    # requests/custom_tools.py. None: a function tool.
    custom: tuple[str, str] | None = None


@dataclass(frozen=True)
class ToolChoice:
    mode: str  # NONE, AUTO, REQUIRED or FUNCTION
    name: str = ""  # the function a FUNCTION choice names


@dataclass(frozen=True)
class ToolCallRecord:
    """A call in the conversation's history (an assistant message's)."""

    id: str
    name: str
    arguments_json: str


@dataclass(frozen=True)
class ToolPlan:
    """The tools a generation may call, and how; the key of its grammar."""

    tools: tuple[tuple[str, str, dict], ...]  # (name, description, parameters schema)
    mode: str  # AUTO, REQUIRED or FUNCTION
    name: str = ""
    parallel: bool = True
    # The loaded model's call syntax (set once the model is known).
    syntax: CallSyntax = hermes.CALLS
    # (name, schema as sent) of each non-strict tool, whose grammar enforces a
    # relaxed schema (schema_relax.py): the model is shown what was sent.
    sent: tuple[tuple[str, dict], ...] = ()
    # Custom tools whose input grammar constrains their calls: (name, EBNF
    # of the arguments, the tool's index in the request).
    custom: tuple[tuple[str, str, int], ...] = ()

    @property
    def key(self) -> str:
        return "tools:" + json.dumps([self.syntax.name, self.tools, self.mode, self.name,
                                      self.parallel, self.custom], sort_keys=True,
                                     separators=(",", ":"))

    def schema_of(self, name: str) -> dict | None:
        return next((schema for n, _, schema in self.tools if n == name), None)

    def openai_tools(self) -> list[dict]:
        """The tools in OpenAI's (and Hugging Face templates') shape, each
        schema as it was sent."""
        sent = dict(self.sent)
        return [{"type": "function", "function": {"name": name, "description": description,
                                                  "parameters": sent.get(name, schema)}}
                for name, description, schema in self.tools]

    @property
    def param(self) -> str:
        """The field a refusal of this plan's grammar names."""
        return "tools"

    def structural_format(self):
        """The calls as an xgrammar structural-tag format, in the model's syntax."""
        from xgrammar import structural_tag as st

        grammars = {name: ebnf for name, ebnf, _ in self.custom}
        tags = [self.syntax.tag(name, self.syntax.arguments_format(schema)
                                or (st.GrammarFormat(grammar=grammars[name]) if name in grammars
                                    else _arguments(schema)))
                for name, _, schema in self.tools if self.mode != FUNCTION or name == self.name]
        one = self.mode == FUNCTION or not self.parallel
        return self.syntax.calls_format(tags, auto=self.mode == AUTO, one=one)

    def compile(self, compiler):
        from xgrammar import structural_tag as st

        return compiler.compile_structural_tag(st.StructuralTag(format=self.structural_format()))


def _arguments(schema: dict):
    """A call's arguments: JSON valid against the tool's schema, spaced as
    json.dumps (and the chat template's `tojson`) spaces it. Free whitespace
    there (a newline before a value) takes a small model off the text it
    learned, and it then keeps writing calls instead of ending."""
    import xgrammar
    from xgrammar import structural_tag as st

    from service.structured_output import grammar_schema

    grammar = xgrammar.Grammar.from_json_schema(
        json.dumps(grammar_schema(schema)), any_whitespace=False, separators=(", ", ": "),
        strict_mode=True)
    return st.GrammarFormat(grammar=str(grammar))


def check_tools(tools: tuple[FunctionTool, ...], choice: ToolChoice | None,
                parallel: bool | None, unused: list[str]) -> ToolPlan | None:
    """The plan a chat request's tools make, or None when nothing is called
    (no tools, or tool_choice none: then what went unused is appended to
    `unused`, never refused)."""
    if not tools:
        if choice is not None and choice.mode != NONE:  # "none" asks for nothing
            unused.append("tool_choice")
        if parallel is not None:
            unused.append("parallel_tool_calls")
        return None
    if len(tools) > MAX_TOOLS:
        raise invalid_parameter("tools", f"'tools' takes at most {MAX_TOOLS} tools; got "
                                f"{len(tools)}.")
    mode = choice.mode if choice is not None else AUTO
    if mode == NONE:
        unused.append("tools")
        if parallel is not None:
            unused.append("parallel_tool_calls")
        return None
    checked, seen, sent, custom = [], set(), [], []
    budget = RepeatBudget()  # one grammar holds every tool: their patterns share it
    for i, tool in enumerate(tools):
        where = f"tools[{i}].function"
        if not NAME_PATTERN.fullmatch(tool.name):
            raise invalid_parameter(f"{where}.name", f"'{where}.name' must be 1 to 64 letters, "
                                    "digits, '_' or '-'.")
        if tool.name in seen:
            raise invalid_parameter(f"{where}.name", f"Two tools are named '{tool.name}'; "
                                    "function names must be unique.")
        seen.add(tool.name)
        if tool.custom is not None:
            # Its input is text, written as the one string argument `input`.
            schema = custom_tools.INPUT_SCHEMA
            ebnf = custom_tools.arguments_grammar(*tool.custom)
            if ebnf is not None:
                custom.append((tool.name, ebnf, i))
            elif tool.custom[0] != custom_tools.FREE:
                unused.append(f"tools[{i}].custom")  # the text stays free
            checked.append((tool.name, tool.description, schema))
            continue
        schema = {"type": "object"}
        if tool.parameters_json and tool.strict:
            schema = _tool_schema(tool.parameters_json, f"{where}.parameters", budget)
        elif tool.parameters_json:
            described = _described_schema(tool.parameters_json, f"{where}.parameters")
            schema = relax(described, budget)
            sent.append((tool.name, described))  # shown as sent, its key order too
        checked.append((tool.name, tool.description, schema))
    name = ""
    if mode == FUNCTION:
        name = choice.name
        if name not in seen:
            raise invalid_parameter("tool_choice.function.name", f"'tool_choice' names "
                                    f"'{name}', which is not among the tools.")
    return ToolPlan(tuple(checked), mode, name, parallel is not False, sent=tuple(sent),
                    custom=tuple(custom))


def _described_schema(parameters_json: str, param: str) -> dict:
    """A non-strict tool's parameters: any JSON Schema of an object, up to the
    size any schema may be. What it says beyond the subset is relaxed, never
    refused (schema_relax.py)."""
    size = len(parameters_json.encode())
    if size > MAX_SCHEMA_BYTES:
        raise unsupported(param, f"'{param}' is {size} bytes; at most {MAX_SCHEMA_BYTES}.")
    try:
        schema = json_text.loads(parameters_json)
    except ValueError as exc:
        raise invalid_parameter(param, f"'{param}' is not JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise invalid_parameter(param, f"'{param}' must be a JSON object.")
    if schema.get("type", "object") not in ("object", ["object"]):
        raise invalid_parameter(param, f"'{param}' must describe an object (type: object).")
    return schema


def _tool_schema(parameters_json: str, param: str, budget: RepeatBudget) -> dict:
    """A strict tool's parameters, held to the structured-output subset;
    refusals name the tool's parameters and the pointer within them."""
    try:
        schema = check_schema(parameters_json, budget)
    except EngineError as exc:
        raise EngineError(exc.code, f"'{param}': {exc.message}", param) from None
    if schema.get("type", "object") != "object":
        raise invalid_parameter(param, f"'{param}' must describe an object (type: object).")
    return schema


def check_history(conversations) -> None:
    """Assistant tool calls carry JSON-object arguments, and every tool message
    answers a call made earlier in its conversation."""
    for where, turns in conversations:
        called: set[str] = set()
        for i, turn in enumerate(turns):
            for j, call in enumerate(turn.tool_calls):
                param = f"{where}[{i}].tool_calls[{j}].function.arguments"
                try:
                    arguments = json_text.loads(call.arguments_json)
                except ValueError:  # NaN and deep nesting too (json_text.py)
                    arguments = None
                if not isinstance(arguments, dict):
                    raise invalid_parameter(param, f"'{param}' must be a JSON object as a string.")
                called.add(call.id)
            if turn.role == "tool" and turn.tool_call_id not in called:
                raise invalid_parameter(f"{where}[{i}].tool_call_id", f"'{where}[{i}]."
                                        f"tool_call_id' ('{turn.tool_call_id}') answers no "
                                        "earlier tool call.")


def call_text(name: str, arguments_json: str, syntax: CallSyntax = hermes.CALLS) -> str:
    """One call in the syntax the grammar constrains."""
    return syntax.call_text(name, arguments_json)


def template_message(turn) -> dict:
    """A turn in the Hugging Face chat-template shape (tool calls and an
    assistant's reasoning_content included: templates that show reasoning
    read it there, and drop or keep it as their family does)."""
    message = {"role": "system" if turn.role == "developer" else turn.role,
               "content": turn.content}
    if getattr(turn, "reasoning_content", ""):
        message["reasoning_content"] = turn.reasoning_content
    if turn.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": json.loads(c.arguments_json)}}
            for c in turn.tool_calls]
    if turn.role == "tool":
        message["tool_call_id"] = turn.tool_call_id
    return message


def plain_messages(messages: list[dict], plan: ToolPlan | None) -> list[dict]:
    """The conversation for a template that renders no tools: the tools
    described in the system turn, calls and results written out as text."""
    out = []
    for m in messages:
        content = m.get("content") or ""
        if m.get("tool_calls"):
            calls = "\n".join(call_text(c["function"]["name"], json.dumps(c["function"][
                "arguments"])) for c in m["tool_calls"])
            content = f"{content}\n{calls}" if content else calls
            out.append({"role": "assistant", "content": content})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n"
                                                   "</tool_response>"})
        else:
            out.append({"role": m["role"], "content": content})
    if plan is None:
        return out
    described = "\n".join(json.dumps(t) for t in plan.openai_tools())
    system = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
              f"You are provided with function signatures within <tools></tools> XML tags:\n"
              f"<tools>\n{described}\n</tools>\n\nFor each function call, return a json object "
              "with function name and arguments within <tool_call></tool_call> XML tags:\n"
              + call_text("<function-name>", "<args-json-object>"))
    if out and out[0]["role"] == "system":
        return [{"role": "system", "content": out[0]["content"] + "\n\n" + system}, *out[1:]]
    return [{"role": "system", "content": system}, *out]
