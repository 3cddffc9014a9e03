"""Non-strict tool schemas: any JSON Schema, reduced to the part a grammar
can enforce.

A tool that is not `strict` uses its schema as a description (OpenAI's
non-strict function calling, and Anthropic's `input_schema`, which has no
strict flag). Coding agents send rich ones: `oneOf` unions, `allOf` mixins,
`not`, `patternProperties`, recursive `$ref`s, draft-07 `definitions`. The
model sees the schema as sent; a call's grammar (forced, required, or once an
`auto` call opens) is built from `relax(schema)`, which stays inside the
structured-output subset (structured_output.py) so that xgrammar enforces
all of it and a finished call is validated against exactly what was
enforced. The relaxed schema accepts (nearly always) every document the
original does, and keeps as much of its structure as the subset can say:

- `oneOf` becomes `anyOf` (the union is kept, "exactly one" is not);
- `allOf` branches are merged into their schema (properties and required
  joined, bounds tightened), and siblings of an `anyOf` are merged into each
  of its branches, since xgrammar reads a union and ignores what sits beside
  it;
- `prefixItems` (and draft-07 tuple `items`) become a union of the item
  schemas; `patternProperties` become `additionalProperties` of their union
  (dropped where other properties are forbidden: a grammar cannot hold a
  key's pattern, and a small model let loose on key names never stops);
- every `$ref` inside the document (`#`, `#/definitions/..`, any pointer)
  becomes a `#/$defs/..` one, recursion included; a ref to elsewhere allows
  any value;
- what no grammar can hold (`not`, `if`/`then`/`else`, dependencies,
  `uniqueItems`, `contains`, property counts, regexes xgrammar cannot read,
  unknown formats, numbers past schema_limits.py's caps) is dropped, as are
  keyword values that are not valid JSON Schema: nothing here refuses.

If the result were still outside the subset (a schema this walk did not
foresee), the call falls back to any JSON object and a warning is logged.
"""

from __future__ import annotations

import json
import logging
import re
from urllib.parse import unquote

from service.regex_spelling import grammar_pattern
from service.schema_limits import (
    BOUNDS,
    COUNTS,
    MAX_BOUND,
    MAX_COUNT,
    MAX_REPEATS,
    RepeatBudget,
    pattern_repeats,
)
from service.structured_output import (
    FORMAT_PATTERNS,
    FORMATS,
    MAX_DEPTH,
    MAX_PROPERTIES,
    MAX_SCHEMA_BYTES,
    TYPES,
    _SchemaWalk,
)

log = logging.getLogger(__name__)

ANY_OBJECT = {"type": "object"}
_CUT_DEPTH = MAX_DEPTH - 8  # room for the unions that merging adds
MAX_NODES = 50_000  # values in a relaxed schema (a 64 KiB one has far fewer)
_LOWER = {"minimum", "exclusiveMinimum", "minLength", "minItems"}
_UPPER = {"maximum", "exclusiveMaximum", "maxLength", "maxItems"}
_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def relax(schema: dict, budget: RepeatBudget | None = None) -> dict:
    """The enforceable part of a tool's parameters (a JSON object schema):
    a schema in the structured-output subset describing JSON objects."""
    try:
        relaxed = _Relaxer(schema, budget or RepeatBudget()).run()
        _check(relaxed)
    except ValueError as exc:
        log.warning("a non-strict tool schema relaxed to any object: %s", exc)
        return dict(ANY_OBJECT)
    return relaxed


def _check(relaxed: dict) -> None:
    """Refuse (ValueError) a result outside the subset: the safety net."""
    import jsonschema

    if len(json.dumps(relaxed)) > 4 * MAX_SCHEMA_BYTES:  # (after _too_big: bounded)
        raise ValueError("the relaxed schema grew too large")
    walk = _SchemaWalk(relaxed, RepeatBudget(MAX_REPEATS * 1000))
    try:
        walk.walk(relaxed, [], 0)
    except Exception as exc:  # the depth limit
        raise ValueError(str(exc)) from None
    if walk.problems or walk.excess:
        raise ValueError("; ".join(walk.problems + walk.excess))
    try:
        jsonschema.Draft202012Validator.check_schema(relaxed)
    except jsonschema.SchemaError as exc:
        raise ValueError(exc.message) from None


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _pattern_ok(pattern: str) -> bool:
    """Whether both xgrammar (the grammar) and Python (the validator) read it."""
    import xgrammar

    try:
        re.compile(pattern)
        xgrammar.Grammar.from_regex(grammar_pattern(pattern))
    except Exception:  # re.error, or xgrammar's RuntimeError for lookarounds and the like
        return False
    return True


class _Relaxer:
    def __init__(self, root: dict, budget: RepeatBudget):
        self.root, self.budget = root, budget
        self.defs: dict[str, object] = {}  # relaxed definitions by name
        self.names: dict[str, str] = {}  # JSON pointer -> its definition's name
        self.building: set[str] = set()  # definitions being relaxed (recursion)

    def run(self) -> dict:
        out = self.merge(dict(ANY_OBJECT), self.node(self.root, 0))
        if not isinstance(out, dict):
            out = dict(ANY_OBJECT)  # `false`, or a ref that cannot merge: any object
        if self.defs:
            out["$defs"] = self.defs
        if _too_big(out):  # merges share what they copy; written out, it could explode
            raise ValueError(f"the relaxed schema has more than {MAX_NODES} nodes")
        return _prune(out)

    # -- one schema ------------------------------------------------------------------

    def node(self, node, depth: int):
        if isinstance(node, bool):
            return node
        if not isinstance(node, dict) or depth > _CUT_DEPTH:
            return {}
        if isinstance(node.get("$ref"), str):
            return self.ref(node["$ref"])  # its siblings dropped: a superset
        out: dict = {}
        self._types(node, out)
        self._object(node, out, depth)
        self._array(node, out, depth)
        self._scalars(node, out)
        unions = [node[k] for k in ("anyOf", "oneOf") if isinstance(node.get(k), list) and node[k]]
        if unions:  # both present: the first kept (a superset of both)
            out["anyOf"] = [self.node(sub, depth + 1) for sub in unions[0]]
        mixins = node.get("allOf")
        for sub in mixins if isinstance(mixins, list) else ():
            out = self.merge(out, self.node(sub, depth + 1))
        return self.distribute(out)

    def _types(self, node: dict, out: dict) -> None:
        names = node.get("type")
        names = [names] if isinstance(names, str) else names
        if isinstance(names, list):
            kept = [n for n in names if isinstance(n, str) and n in TYPES]
            if kept and node.get("nullable") is True and "null" not in kept:
                kept.append("null")  # OpenAPI's spelling of a nullable type
            if kept:
                out["type"] = kept[0] if len(kept) == 1 else list(dict.fromkeys(kept))
        if "enum" in node and isinstance(node["enum"], list) and node["enum"]:
            out["enum"] = node["enum"]
        if "const" in node:
            out["const"] = node["const"]

    def _object(self, node: dict, out: dict, depth: int) -> None:
        props = node.get("properties")
        if isinstance(props, dict) and len(props) <= MAX_PROPERTIES:
            out["properties"] = {k: self.node(v, depth + 1) for k, v in props.items()}
        extra = node.get("additionalProperties", None)
        extra = self.node(extra, depth + 1) if isinstance(extra, dict | bool) else None
        patterns = node.get("patternProperties")
        if isinstance(patterns, dict) and patterns and extra is not False:
            values = [self.node(v, depth + 1) for v in patterns.values()]
            if extra is not None and extra is not False:
                values.append(extra)
            extra = (True if any(v is True or v == {} for v in values)
                     else values[0] if len(values) == 1 else {"anyOf": values})
        if extra is not None:
            out["additionalProperties"] = extra
        required = node.get("required")
        if isinstance(required, list):  # (pruned to what can be written once merged: _prune)
            kept = list(dict.fromkeys(r for r in required if isinstance(r, str)))
            if kept:
                out["required"] = kept

    def _array(self, node: dict, out: dict, depth: int) -> None:
        items, prefix = node.get("items"), node.get("prefixItems")
        if isinstance(items, list):  # draft-07 tuples
            items, prefix = node.get("additionalItems", True), items
        item = self.node(items, depth + 1) if isinstance(items, dict | bool) else None
        if isinstance(prefix, list) and prefix:
            choices = [self.node(p, depth + 1) for p in prefix]
            if item is None or item is True or item == {}:
                item = None  # anything may follow the tuple
            elif item is not False:
                choices.append(item)
            if item is not None:
                item = {"anyOf": choices}
        if item is not None:
            out["items"] = item

    def _scalars(self, node: dict, out: dict) -> None:
        for key in COUNTS:
            value = node.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
                out[key] = value
        for key in BOUNDS - {"multipleOf"}:
            value = node.get(key)
            if _number(value) and abs(value) <= MAX_BOUND:
                out[key] = value
        step = node.get("multipleOf")
        if (isinstance(step, int) and not isinstance(step, bool) and step > 0
                and out.get("type") == "integer"):
            out["multipleOf"] = step
        pattern = node.get("pattern")
        if isinstance(pattern, str) and _pattern_ok(pattern):
            repeats = pattern_repeats(pattern)
            if self.budget.used + repeats <= self.budget.total:
                self.budget.used += repeats
                out["pattern"] = pattern
        fmt = node.get("format")
        if fmt in FORMATS and not (fmt in FORMAT_PATTERNS and "pattern" in out):
            out["format"] = fmt

    # -- references --------------------------------------------------------------------

    def ref(self, ref: str):
        """A `$ref` as one into the relaxed `$defs` (any value when it points
        outside the document or nowhere)."""
        if not ref.startswith("#"):
            return {}
        pointer = unquote(ref[1:])
        if pointer not in self.names:
            target = _resolve(self.root, pointer)
            if target is None:
                return {}
            name = self._name(pointer)
            self.names[pointer] = name
            self.building.add(name)
            self.defs[name] = {}
            self.defs[name] = self.node(target, 1)
            self.building.discard(name)
        return {"$ref": "#/$defs/" + self.names[pointer]}

    def _name(self, pointer: str) -> str:
        base = _NAME.sub("_", pointer.rsplit("/", 1)[-1].replace("~1", "/").replace("~0", "~"))
        base = base or "root"
        name, i = base, 1
        while name in self.defs:
            i += 1
            name = f"{base}_{i}"
        return name

    def _target(self, node):
        """What a relaxed `$ref` stands for, when it is fully relaxed already."""
        if isinstance(node, dict) and set(node) == {"$ref"}:
            name = node["$ref"].removeprefix("#/$defs/")
            if name not in self.building:
                return self.defs.get(name, node)
        return node

    # -- joining schemas -----------------------------------------------------------------

    def merge(self, a, b):
        """What both `a` and `b` say, as nearly as one subset schema says it
        (where they cannot be joined, one of them: a superset of both)."""
        a, b = self._target(a), self._target(b)
        if a is True or a == {}:
            return b
        if b is True or b == {}:
            return a
        if a is False or b is False:
            return False
        if "$ref" in a or "$ref" in b:
            return a if "$ref" in a else b  # a definition still being relaxed
        out = dict(a)
        for key, value in b.items():
            if key not in out:
                out[key] = value
            elif key == "properties":
                mine = out[key]
                out[key] = {k: self.merge(v, value[k]) if k in value else v
                            for k, v in mine.items()}
                out[key].update((k, v) for k, v in value.items() if k not in mine)
                if out.get("additionalProperties") is False or b.get(
                        "additionalProperties") is False:
                    out.pop("additionalProperties", None)  # each side's "no others" is wrong now
            elif key == "required":
                out[key] = list(dict.fromkeys([*out[key], *value]))
            elif key == "type":
                mine = out[key] if isinstance(out[key], list) else [out[key]]
                theirs = value if isinstance(value, list) else [value]
                both = [t for t in mine if t in theirs or (t == "number" and "integer" in theirs)]
                both = ["integer" if t == "number" and "integer" in theirs else t for t in both]
                if both:
                    out[key] = both[0] if len(both) == 1 else both
            elif key in _LOWER:
                out[key] = max(out[key], value)
            elif key in _UPPER:
                out[key] = min(out[key], value)
        return self.distribute(out)

    def distribute(self, node):
        """xgrammar reads an `anyOf` alone and ignores its siblings: move them
        into each branch (A and (B or C) is (A and B) or (A and C))."""
        if not isinstance(node, dict) or "anyOf" not in node:
            return node
        if len(node) == 1:
            return node["anyOf"][0] if len(node["anyOf"]) == 1 else node
        siblings = {k: v for k, v in node.items() if k != "anyOf"}
        branches = [self.merge(siblings, branch) for branch in node["anyOf"]]
        return branches[0] if len(branches) == 1 else {"anyOf": branches}


def _too_big(node) -> bool:
    """Whether the schema, written out, has more than MAX_NODES values
    (counted without recursion, stopping at the limit)."""
    stack, seen = [node], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _prune(node):
    """Each `required` cut to the names the grammar can write (its listed
    properties, or any name when other properties are allowed): xgrammar
    skips a required name it has no schema for, which the validator would
    then miss."""
    if isinstance(node, list):
        return [_prune(sub) for sub in node]
    if not isinstance(node, dict):
        return node
    out = {k: _prune(v) if k in ("properties", "$defs") and isinstance(v, dict) else v
           for k, v in node.items()}
    for key in ("properties", "$defs"):
        if isinstance(out.get(key), dict):
            out[key] = {name: _prune(sub) for name, sub in node[key].items()}
    for key in ("additionalProperties", "items", "anyOf"):
        if key in out:
            out[key] = _prune(out[key])
    if "required" in out:
        open_extra = out.get("additionalProperties") not in (None, False)
        listed = out.get("properties", {})
        kept = [r for r in out["required"] if r in listed or open_extra]
        if kept:
            out["required"] = kept
        else:
            del out["required"]
    return out


def _resolve(root, pointer: str):
    """The value a JSON pointer names in the document, or None."""
    if pointer == "":
        return root
    if not pointer.startswith("/"):
        return None
    node = root
    for part in pointer[1:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
