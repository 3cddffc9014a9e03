"""Which constraint a generation asks for, checked: OpenAI's response_format,
vLLM's structured_outputs (json, regex, choice, grammar, structural_tag,
json_object) or llama.cpp's top-level grammar, at most one of them.

Every kind is held to the same limits before it reaches the compiler: at most
MAX_SCHEMA_BYTES of text (structured_output.py), and the counted repetitions
of a pattern or grammar within schema_limits.MAX_REPEATS (a small text can
ask xgrammar for a huge automaton). The compile itself runs under the time
limit of grammars.py, and its refusal names the field with xgrammar's
message. A refusal here names the field as sent: "response_format",
"structured_outputs.regex", "grammar".
"""

from __future__ import annotations

from service import json_text
from service.errors import EngineError, invalid_parameter
from service.requests.params import GenerateParams
from service.schema_limits import MAX_REPEATS, pattern_repeats
from service.structured_output import (
    CHOICE,
    GRAMMAR,
    JSON_OBJECT,
    JSON_SCHEMA,
    MAX_SCHEMA_BYTES,
    NAME_PATTERN,
    REGEX,
    STRUCTURAL_TAG,
    Constraint,
    check_schema,
    unsupported,
)

# structured_outputs' kinds, as the constraint kinds they make.
KINDS = {"json": JSON_SCHEMA, "regex": REGEX, "choice": CHOICE, "grammar": GRAMMAR,
         "structural_tag": STRUCTURAL_TAG, "json_object": JSON_OBJECT}


def _refuse(param: str, message: str) -> EngineError:
    """response_format keeps its own code; the newer fields are parameters."""
    if param == "response_format":
        return unsupported(param, message)
    return invalid_parameter(param, message)


def check_constraint(params: GenerateParams) -> Constraint | None:
    """The request's one constraint, or None for free text."""
    grammar = params.grammar
    if grammar is not None and not isinstance(grammar, str):
        raise invalid_parameter("grammar", "'grammar' must be a string (a GBNF grammar).")
    sent = [name for name, value in (("response_format", params.response_format),
                                     ("structured_outputs", params.structured_outputs),
                                     ("grammar", grammar or None)) if value is not None]
    if not sent:
        return None
    if len(sent) > 1:
        raise invalid_parameter(sent[1], f"'{sent[0]}' and '{sent[1]}' both constrain the "
                                "output; send one of them.")
    field = sent[0]
    if params.stop:
        # A stop string could cut an output short and have it reported complete.
        raise _refuse(field, f"'stop' cannot be combined with '{field}'.")
    if params.ignore_eos:
        raise _refuse(field, f"'ignore_eos' cannot be combined with '{field}': a finished "
                      "output must end the choice.")
    if field == "response_format":
        return _response_format(params)
    if field == "grammar":
        return _language(GRAMMAR, "grammar", grammar)
    so = params.structured_outputs
    param = f"structured_outputs.{so.kind}"
    kind = KINDS.get(so.kind)
    if kind is None:
        raise invalid_parameter("structured_outputs", f"'structured_outputs' has no kind "
                                f"'{so.kind}'; one of {', '.join(KINDS)}.")
    if kind == JSON_OBJECT:
        return Constraint(JSON_OBJECT, param=param)
    if kind == JSON_SCHEMA:
        try:
            schema = check_schema(so.value)
        except EngineError as exc:  # named as this field, not response_format's
            raise EngineError(exc.code, f"'{param}': {exc.message}", param) from None
        return Constraint(JSON_SCHEMA, schema=schema, param=param)
    if kind == CHOICE:
        return _choice(param, so.value)
    return _language(kind, param, so.value)


def _response_format(params: GenerateParams) -> Constraint:
    fmt = params.response_format
    if fmt.kind == JSON_OBJECT:
        return Constraint(JSON_OBJECT)
    if not NAME_PATTERN.fullmatch(fmt.name):
        raise invalid_parameter("response_format.json_schema.name",
                                "'response_format.json_schema.name' must be 1 to 64 letters, "
                                "digits, '_' or '-'.")
    return Constraint(JSON_SCHEMA, fmt.name, check_schema(fmt.schema_json))


def _size(param: str, size: int) -> None:
    if size > MAX_SCHEMA_BYTES:
        raise invalid_parameter(param, f"'{param}' is {size} bytes; at most "
                                f"{MAX_SCHEMA_BYTES}.")


def _language(kind: str, param: str, text: str) -> Constraint:
    """A regex, an EBNF grammar or a structural tag."""
    if not text:
        raise invalid_parameter(param, f"'{param}' must not be empty.")
    _size(param, len(text.encode()))
    if kind == STRUCTURAL_TAG:
        try:
            tag = json_text.loads(text)
        except ValueError as exc:
            raise invalid_parameter(param, f"'{param}' is not JSON: {exc}") from None
        if not isinstance(tag, dict):
            raise invalid_parameter(param, f"'{param}' must be a JSON object.")
    else:
        repeats = pattern_repeats(text)
        if repeats > MAX_REPEATS:
            raise invalid_parameter(param, f"'{param}' asks for {repeats} counted "
                                    f"repetitions ({{m,n}}); at most {MAX_REPEATS}.")
    return Constraint(kind, param=param, text=text)


def _choice(param: str, choices: tuple[str, ...]) -> Constraint:
    if not choices:
        raise invalid_parameter(param, f"'{param}' must list at least one string.")
    for i, choice in enumerate(choices):
        if not choice:
            raise invalid_parameter(f"{param}[{i}]", f"'{param}[{i}]' is empty; every choice "
                                    "must be some text.")
    _size(param, sum(len(c.encode()) for c in choices))
    return Constraint(CHOICE, param=param, choices=tuple(dict.fromkeys(choices)))
