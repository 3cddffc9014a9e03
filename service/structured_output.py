"""Structured output: which JSON schemas we accept, their compiled grammars,
and the validation of every finished document.

xgrammar turns a schema into a grammar whose token masks keep each row on a
valid document; it compiles some keywords without enforcing them, so the
subset we accept is checked here by our own walk of the schema, and every
finished document is validated with `jsonschema` before it may end with
finish_reason "stop".
"""

from __future__ import annotations

import collections
import json
import re
import threading
from dataclasses import dataclass

from service.errors import EngineError

JSON_OBJECT, JSON_SCHEMA = "json_object", "json_schema"

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
    "enum", "const", "minimum", "maximum", "minLength", "maxLength", "pattern", "anyOf", "$ref",
    "$defs",
})
ANNOTATIONS = frozenset({"title", "description", "default", "examples"})


def unsupported(param: str, message: str) -> EngineError:
    return EngineError("response_format_unsupported", message, param)


def _pointer(parts: list[str]) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


@dataclass(frozen=True)
class Constraint:
    """A request's response_format, checked and ready to compile."""

    kind: str  # JSON_OBJECT or JSON_SCHEMA
    name: str = ""
    schema: dict | None = None

    @property
    def key(self) -> str:
        # One cache entry per distinct schema, however its keys were ordered.
        return self.kind + ":" + json.dumps(self.schema, sort_keys=True, separators=(",", ":"))


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON")


class _SchemaWalk:
    """Finds every keyword outside the subset (with its JSON pointer) and
    enforces the size limits."""

    def __init__(self, root: dict):
        self.root = root
        self.problems: list[str] = []

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
            elif key in SUBSCHEMA:
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
                if not names or any(n not in TYPES for n in names):
                    self.problems.append(f"type {value!r} at {_pointer(here)} (not a JSON type)")

    def _check_ref(self, ref, here: list[str]) -> None:
        if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
            self.problems.append(f"$ref {ref!r} at {_pointer(here)} (only local refs into "
                                 "#/$defs are supported)")
            return
        name = ref.removeprefix("#/$defs/").replace("~1", "/").replace("~0", "~")
        if name not in (self.root.get("$defs") or {}):
            self.problems.append(f"$ref {ref!r} at {_pointer(here)} (no such definition)")


def check_schema(schema_json: str) -> dict:
    """The schema if it is within the supported subset and limits, else a 400
    naming every unsupported keyword with its JSON pointer."""
    param = "response_format.json_schema.schema"
    size = len(schema_json.encode())
    if size > MAX_SCHEMA_BYTES:
        raise unsupported("response_format", f"The schema is {size} bytes; at most "
                          f"{MAX_SCHEMA_BYTES}.")
    if not schema_json:
        raise unsupported(param, f"'{param}' is required for json_schema.")
    try:
        schema = json.loads(schema_json, parse_constant=_not_json)
    except (ValueError, RecursionError) as exc:
        raise unsupported(param, f"'{param}' is not JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise unsupported(param, f"'{param}' must be a JSON object.")
    walk = _SchemaWalk(schema)
    walk.walk(schema, [], 0)
    if walk.problems:
        raise unsupported("response_format", "The schema uses what structured output cannot "
                          "enforce: " + "; ".join(walk.problems) + ".")
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = _pointer([str(p) for p in exc.path]) or "/"
        raise unsupported("response_format", f"The schema is not valid JSON Schema at {where}: "
                          f"{exc.message}") from None
    return schema


def document_problem(constraint: Constraint, text: str) -> str | None:
    """Why a finished document is not what was asked for; None when it is."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        return f"it is not JSON ({exc})"
    if constraint.kind == JSON_OBJECT:
        return None if isinstance(document, dict) else "it is not a JSON object"
    import jsonschema

    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(constraint.schema).iter_errors(document))
    if error is None:
        return None
    return f"it fails the schema at {_pointer([str(p) for p in error.path]) or '/'}: " \
           f"{error.message}"


class GrammarCache:
    """Compiled grammars by schema, for one tokenizer: a judge sending the same
    schema a million times compiles it once."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids: list[int], capacity: int = 256):
        import xgrammar

        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=stop_ids)
        # xgrammar's own cache is keyed by the exact schema text; ours by the
        # canonical schema, and bounded.
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._entries: collections.OrderedDict[str, object] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.capacity = capacity
        self.compiled_total = 0

    def get(self, constraint: Constraint):
        key = constraint.key
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        grammar = self._compile(constraint)
        with self._lock:
            self._entries[key] = grammar
            self.compiled_total += 1
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return grammar

    def _compile(self, constraint: Constraint):
        if constraint.kind == JSON_OBJECT:
            # Any object: properties of any name and value.
            schema, strict = {"type": "object"}, False
        else:
            schema, strict = constraint.schema, True
        try:
            return self._compiler.compile_json_schema(
                json.dumps(schema), any_whitespace=False, separators=(",", ":"),
                strict_mode=strict)
        except Exception as exc:  # xgrammar raises plain RuntimeErrors (say, a bad pattern)
            raise unsupported("response_format", f"The schema could not be compiled into a "
                              f"grammar: {exc}") from None
