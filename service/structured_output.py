"""Structured output: the constraints a request may put on its text, which
JSON schemas we accept, what the grammar compiler gets of each, and the
validation of every finished output (the compiled grammars are cached and
compiled in grammars.py; which field asks for which constraint is
requests/constraints.py's).

xgrammar turns a schema into a grammar whose token masks keep each row on a
valid document; it compiles some keywords without enforcing them, so the
subset we accept is checked here by our own walk of the schema, and every
finished document is validated with `jsonschema` before it may end with
finish_reason "stop". The other kinds (a regex, a choice, an EBNF grammar, a
structural tag) are xgrammar's own languages: a finished output is checked by
running it through a fresh matcher of the same grammar (a choice also by
plain comparison).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from service import json_text
from service.errors import EngineError
from service.regex_spelling import grammar_pattern
from service.schema_limits import RepeatBudget, limit_problem

JSON_OBJECT, JSON_SCHEMA = "json_object", "json_schema"
REGEX, CHOICE, GRAMMAR, STRUCTURAL_TAG = "regex", "choice", "grammar", "structural_tag"
JSON_KINDS = frozenset({JSON_OBJECT, JSON_SCHEMA})

# The most text any one constraint may be: a schema, a pattern, a grammar, a
# structural tag or the choices together.
MAX_SCHEMA_BYTES = 64 * 1024
MAX_DEPTH = 32
MAX_PROPERTIES = 256
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")

TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
# Keywords whose value is one subschema / a map of them / a list of them.
SUBSCHEMA = frozenset({"additionalProperties", "items"})
SUBSCHEMA_MAPS = frozenset({"properties", "$defs"})
SUBSCHEMA_LISTS = frozenset({"anyOf"})
SUPPORTED = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "minLength", "maxLength", "pattern", "format", "anyOf", "$ref", "$defs",
})
# The string formats OpenAI's strict mode accepts; xgrammar enforces each while
# decoding, and jsonschema's format checker validates each finished document.
FORMATS = ("date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6",
           "uuid")

# Where xgrammar's own format grammar lets through strings the validator
# refuses (a 31st of November, second 60, "041" in an address, a 64-letter
# label), the grammar gets our pattern instead: a subset of what the validator
# accepts (tests/test_format_grammars.py draws from each and validates).
_YEAR = "([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_LEAP = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
_DATE = (f"({_YEAR}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
         f"|02-(0[1-9]|1[0-9]|2[0-8]))|{_LEAP}-02-29)")
_FRACTION = "(\\.[0-9]{1,6})?"
_TIME = f"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]{_FRACTION}(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_LABEL = "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
# IPv6 in RFC 4291's text forms (eight groups, or fewer around one "::"), and
# an IPv4 tail only after six groups or a bare "::" (with dec-octets: "00" in
# an embedded address, which xgrammar's own grammar allows, is refused).
_H = "[0-9a-fA-F]{1,4}"
_IPV6 = "|".join([
    f"({_H}:){{7}}{_H}", f"({_H}:){{1,7}}:", f"({_H}:){{1,6}}:{_H}",
    f"({_H}:){{1,5}}(:{_H}){{1,2}}", f"({_H}:){{1,4}}(:{_H}){{1,3}}",
    f"({_H}:){{1,3}}(:{_H}){{1,4}}", f"({_H}:){{1,2}}(:{_H}){{1,5}}", f"{_H}:(:{_H}){{1,6}}",
    f":((:{_H}){{1,7}}|:)", f"({_H}:){{6}}{_OCTET}(\\.{_OCTET}){{3}}",
    f"::{_OCTET}(\\.{_OCTET}){{3}}"])
FORMAT_PATTERNS = {
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}T{_TIME}$",
    "ipv4": f"^{_OCTET}(\\.{_OCTET}){{3}}$",
    "hostname": f"^{_LABEL}(\\.{_LABEL}){{0,2}}$",
    "ipv6": f"^({_IPV6})$",
}
ANNOTATIONS = frozenset({"title", "description", "default", "examples"})


def unsupported(param: str, message: str) -> EngineError:
    return EngineError("response_format_unsupported", message, param)


_COMPILER_NOISE = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: (Check failed: .*? is false: )?")


def compiler_message(exc: Exception) -> str:
    """xgrammar's message without its log prefix (time, source file, check)."""
    return _COMPILER_NOISE.sub("", str(exc)).strip()


def _pointer(parts: list[str]) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


@dataclass(frozen=True)
class Constraint:
    """A request's constraint (response_format, structured_outputs or the
    top-level grammar), checked and ready to compile."""

    kind: str  # JSON_OBJECT, JSON_SCHEMA, REGEX, CHOICE, GRAMMAR or STRUCTURAL_TAG
    name: str = ""
    schema: dict | None = None
    # The field it came from: what a refusal of its grammar names.
    param: str = "response_format"
    # REGEX: the pattern; GRAMMAR: the EBNF; STRUCTURAL_TAG: the tag's JSON text.
    text: str = ""
    choices: tuple[str, ...] = ()  # CHOICE

    @property
    def is_json(self) -> bool:
        return self.kind in JSON_KINDS

    @property
    def key(self) -> str:
        # One cache entry per distinct schema, however its keys were ordered;
        # the field is part of it, so a refusal names the field that was sent.
        if self.is_json:
            body = json.dumps(self.schema, sort_keys=True, separators=(",", ":"))
        elif self.kind == CHOICE:
            body = json.dumps(self.choices)
        else:
            body = self.text
        return f"{self.kind}:{self.param}:{body}"

    def _grammar_schema(self) -> tuple[dict, bool]:
        if self.kind == JSON_OBJECT:
            # Any object: properties of any name and value.
            return {"type": "object"}, False
        return grammar_schema(self.schema), True

    def compile(self, compiler):
        if self.kind == REGEX:
            return compiler.compile_regex(grammar_pattern(self.text))
        if self.kind == CHOICE:
            return compiler.compile_grammar(choice_grammar(self.choices))
        if self.kind == GRAMMAR:
            return compiler.compile_grammar(self.text)
        if self.kind == STRUCTURAL_TAG:
            return compile_structural_tag(compiler, self.text)
        schema, strict = self._grammar_schema()
        return compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                            separators=(",", ":"), strict_mode=strict)

    def structural_format(self):
        """The same constraint as an xgrammar structural-tag part (after a
        reasoning block: requests/reasoning.py)."""
        import xgrammar
        from xgrammar import structural_tag as st

        if self.kind == REGEX:
            return st.RegexFormat(pattern=grammar_pattern(self.text))
        if self.kind in (CHOICE, GRAMMAR):
            return st.GrammarFormat(grammar=choice_grammar(self.choices) if self.kind == CHOICE
                                    else self.text)
        if self.kind == STRUCTURAL_TAG:
            # xgrammar's own format (the older one has no place after reasoning).
            return st.StructuralTag.model_validate_json(self.text).format
        schema, strict = self._grammar_schema()
        grammar = xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False,
                                                    separators=(",", ":"), strict_mode=strict)
        return st.GrammarFormat(grammar=str(grammar))

    def refused(self, message: str) -> EngineError:
        """The 400 for a constraint the compiler refused, naming its field."""
        if self.is_json:
            return unsupported(self.param, f"The schema could not be compiled into a grammar: "
                               f"{message}")
        return EngineError("invalid_parameter", f"'{self.param}' could not be compiled: "
                           f"{message}", self.param)


def choice_grammar(choices: tuple[str, ...]) -> str:
    """An EBNF grammar matching exactly one of the strings: each a literal,
    escaped as a JSON string (which xgrammar's literals read alike)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def compile_structural_tag(compiler, text: str):
    """A structural tag in xgrammar's format, or in the older one vLLM also
    takes (`structures` of begin/schema/end and `triggers`)."""
    import xgrammar

    tag = json_text.loads(text)
    if isinstance(tag, dict) and "structures" in tag:
        try:
            items = [xgrammar.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]),
                                                end=s["end"]) for s in tag["structures"]]
            triggers = list(tag["triggers"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"each of 'structures' needs begin, schema and end, and "
                             f"'triggers' a list of strings ({exc!r} is missing or wrong)") \
                from None
        return compiler.compile_structural_tag(items, triggers)
    return compiler.compile_structural_tag(text)


class _SchemaWalk:
    """Finds every keyword outside the subset (with its JSON pointer) and
    enforces the size limits and the caps of schema_limits.py."""

    def __init__(self, root: dict, budget: RepeatBudget):
        self.root = root
        self.budget = budget
        self.problems: list[str] = []
        self.excess: list[str] = []

    def walk(self, node, path: list[str], depth: int) -> None:
        if depth > MAX_DEPTH:
            raise unsupported("response_format", f"The schema nests deeper than {MAX_DEPTH} "
                              f"levels (at {_pointer(path) or '/'}).")
        if isinstance(node, bool):
            return  # true / false schemas
        if not isinstance(node, dict):
            self.problems.append(f"{_pointer(path) or '/'} (a schema must be an object)")
            return
        for key, value in node.items():
            here = [*path, key]
            if key in ANNOTATIONS:
                continue
            if key not in SUPPORTED:
                self.problems.append(f"{key} at {_pointer(here)}")
                continue
            excess = limit_problem(key, value, _pointer(here), self.budget)
            if excess is not None:
                self.excess.append(excess)
            if key in SUBSCHEMA:
                self.walk(value, here, depth + 1)
            elif key in SUBSCHEMA_MAPS:
                if not isinstance(value, dict):
                    self.problems.append(f"{key} at {_pointer(here)} (must be an object)")
                    continue
                if key == "properties" and len(value) > MAX_PROPERTIES:
                    raise unsupported("response_format", f"The object at {_pointer(path) or '/'} "
                                      f"has {len(value)} properties; at most {MAX_PROPERTIES}.")
                for name, sub in value.items():
                    self.walk(sub, [*here, name], depth + 1)
            elif key in SUBSCHEMA_LISTS:
                if not isinstance(value, list) or not value:
                    self.problems.append(f"{key} at {_pointer(here)} (must be a non-empty list)")
                    continue
                for i, sub in enumerate(value):
                    self.walk(sub, [*here, str(i)], depth + 1)
            elif key == "$ref":
                self._check_ref(value, here)
            elif key == "type":
                names = value if isinstance(value, list) else [value]
                # A name is text: an object or list there is no type (and no key of TYPES).
                if not names or any(not isinstance(n, str) or n not in TYPES for n in names):
                    self.problems.append(f"type {value!r} at {_pointer(here)} (not a JSON type)")
            elif key == "format" and value not in FORMATS:
                self.problems.append(f"format {value!r} at {_pointer(here)} (supported: "
                                     f"{', '.join(FORMATS)})")
            elif key == "format" and value in FORMAT_PATTERNS and "pattern" in node:
                self.problems.append(f"format {value!r} with a pattern at {_pointer(here)} "
                                     "(one of them can be enforced, not both)")
            elif key == "multipleOf" and not (
                    node.get("type") == "integer" and isinstance(value, int)
                    and not isinstance(value, bool) and value > 0):
                # xgrammar enforces an integer step on integers only.
                self.problems.append(f"multipleOf at {_pointer(here)} (enforced with a positive "
                                     "integer step on type integer only)")

    def _check_ref(self, ref, here: list[str]) -> None:
        if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
            self.problems.append(f"$ref {ref!r} at {_pointer(here)} (only local refs into "
                                 "#/$defs are supported)")
            return
        name = ref.removeprefix("#/$defs/").replace("~1", "/").replace("~0", "~")
        defs = self.root.get("$defs")
        if not isinstance(defs, dict) or name not in defs:
            self.problems.append(f"$ref {ref!r} at {_pointer(here)} (no such definition)")


def check_schema(schema_json: str, budget: RepeatBudget | None = None) -> dict:
    """The schema if it is within the supported subset and limits, else a 400
    naming every unsupported keyword with its JSON pointer. `budget` is the
    pattern repetitions left to it, when it shares them (a request's tools)."""
    param = "response_format.json_schema.schema"
    size = len(schema_json.encode())
    if size > MAX_SCHEMA_BYTES:
        raise unsupported("response_format", f"The schema is {size} bytes; at most "
                          f"{MAX_SCHEMA_BYTES}.")
    if not schema_json:
        raise unsupported(param, f"'{param}' is required for json_schema.")
    try:
        schema = json_text.loads(schema_json)
    except ValueError as exc:
        raise unsupported(param, f"'{param}' is not JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise unsupported(param, f"'{param}' must be a JSON object.")
    walk = _SchemaWalk(schema, budget or RepeatBudget())
    walk.walk(schema, [], 0)
    if walk.problems:
        raise unsupported("response_format", "The schema uses what structured output cannot "
                          "enforce: " + "; ".join(walk.problems) + ".")
    if walk.excess:
        raise unsupported("response_format", "The schema asks the grammar for more than it "
                          "may: " + "; ".join(walk.excess) + ".")
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = _pointer([str(p) for p in exc.path]) or "/"
        raise unsupported("response_format", f"The schema is not valid JSON Schema at {where}: "
                          f"{exc.message}") from None
    return schema


def grammar_schema(node):
    """The schema as the grammar compiler gets it: formats xgrammar would
    enforce too loosely become our patterns (FORMAT_PATTERNS). Walks the
    subset's subschema keywords only, as _SchemaWalk does."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    if isinstance(node.get("pattern"), str):
        out["pattern"] = grammar_pattern(node["pattern"])
    if isinstance(node.get("format"), str) and node["format"] in FORMAT_PATTERNS:
        del out["format"]
        out["pattern"] = grammar_pattern(FORMAT_PATTERNS[node["format"]])
    for key in SUBSCHEMA & node.keys():
        out[key] = grammar_schema(node[key])
    for key in SUBSCHEMA_MAPS & node.keys():
        if isinstance(node[key], dict):
            out[key] = {name: grammar_schema(sub) for name, sub in node[key].items()}
    for key in SUBSCHEMA_LISTS & node.keys():
        if isinstance(node[key], list):
            out[key] = [grammar_schema(sub) for sub in node[key]]
    return out


def document_problem(constraint: Constraint, text: str, grammar=None) -> str | None:
    """Why a finished document is not what was asked for; None when it is.
    `grammar` is the constraint's compiled grammar (the non-JSON kinds are
    checked against it)."""
    if not constraint.is_json:
        return _language_problem(constraint, text, grammar)
    try:
        document = json.loads(text)
    except ValueError as exc:
        return f"it is not JSON ({exc})"
    if constraint.kind == JSON_OBJECT:
        return None if isinstance(document, dict) else "it is not a JSON object"
    import jsonschema

    validator = jsonschema.Draft202012Validator(
        constraint.schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    if error is None:
        return None
    return f"it fails the schema at {_pointer([str(p) for p in error.path]) or '/'}: " \
           f"{error.message}"


def _language_problem(constraint: Constraint, text: str, grammar) -> str | None:
    if constraint.kind == CHOICE and text not in constraint.choices:
        return "it is none of the choices"
    if grammar is None:
        return None
    import xgrammar

    matcher = xgrammar.GrammarMatcher(grammar)
    if not (matcher.accept_string(text) and matcher.is_completed()):
        return f"it does not match the {constraint.kind.replace('_', ' ')}"
    return None
