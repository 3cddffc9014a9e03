"""What the fuzzers share: one seed per run, hostile values, and protobuf
messages drawn from their descriptors.

Every run draws new examples: the seed is random unless MILLM_FUZZ_SEED is set,
and a failing fuzz test prints it ("rerun with MILLM_FUZZ_SEED=…") so the
failure can be replayed. No example database is kept: a run depends on its
seed alone.

The values are the ones that broke servers before: strings of thousands of
characters, objects with thousands of keys, nesting hundreds of levels deep,
and odd text (unpaired surrogates, NUL, right-to-left marks, emoji, the
model's own special tokens).
"""

from __future__ import annotations

import functools
import os
import secrets

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st

SEED = int(os.environ.get("MILLM_FUZZ_SEED") or secrets.randbelow(2**32))

ODD_PIECES = ["\x00", "\u202e", "\u200f", "\U0001f600", "\ufeff", "e\u0301", "\U0010ffff",
              "\ud800", "\udfff", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "\r\n", "\\",
              '"', "%s", "{{", "\x1b[31m", "", "\u0000\u0000"]
ODD_TEXT = st.lists(st.one_of(st.sampled_from(ODD_PIECES), st.text(max_size=6)), max_size=6).map(
    "".join)
LONG_TEXT = st.builds(lambda piece, n: piece * n,
                      st.sampled_from(["a", "é", "\U0001f600", "\x00", "ab ", "\u202e"]),
                      st.integers(1_000, 40_000))
TEXT = st.one_of(st.text(max_size=30), ODD_TEXT, ODD_TEXT, LONG_TEXT)
KEY = st.one_of(st.text(max_size=8), ODD_TEXT)

MANY_KEYS = st.integers(200, 3_000).map(lambda n: {f"k{i}": i for i in range(n)})


def _nest(depth: int, as_object: bool):
    value = 0
    for _ in range(depth):
        value = {"a": value} if as_object else [value]
    return value


# Below the json module's recursion limit, above the bridge's 128 levels.
DEEP = st.builds(_nest, st.integers(20, 600), st.booleans())

JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False), TEXT,
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(KEY, inner, max_size=4)),
    max_leaves=12,
)
# Any JSON at all, hostile shapes included.
ANY_JSON = st.one_of(JSON_VALUES, JSON_VALUES, LONG_TEXT, MANY_KEYS, DEEP)


def fuzz(max_examples: int):
    """Settings for a fuzz test: this run's seed, no example database, and the
    seed printed when the test fails."""

    def decorate(test):
        configured = seed(SEED)(settings(
            max_examples=max_examples, deadline=None, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                   HealthCheck.data_too_large, HealthCheck.large_base_example],
        )(test))

        @functools.wraps(configured)
        def run(*args, **kwargs):
            try:
                return configured(*args, **kwargs)
            except BaseException:
                print(f"fuzz seed {SEED}: rerun with MILLM_FUZZ_SEED={SEED}")
                raise

        return run

    return decorate


# -- protobuf messages -----------------------------------------------------------------------

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
# What protobuf can carry: valid Unicode (no unpaired surrogates).
PROTO_TEXT = TEXT.map(lambda t: t.encode("utf-8", "replace").decode("utf-8"))


def _scalar(field: FieldDescriptor) -> st.SearchStrategy:
    kind = field.type
    if kind in _INT_RANGES:
        low, high = _INT_RANGES[kind]
        # Mostly small (the values code branches on), now and then anything.
        return st.one_of(st.integers(max(low, -3), 70), st.integers(low, high))
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.one_of(st.floats(-3, 3), st.floats(width=32 if kind == FieldDescriptor.TYPE_FLOAT
                                                     else 64))
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_STRING:
        return PROTO_TEXT
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if kind == FieldDescriptor.TYPE_ENUM:
        numbers = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(numbers), st.integers(-2, 40))
    raise AssertionError(f"unhandled field type {kind}")


def _struct_values() -> st.SearchStrategy:
    # A Struct's Value holds JSON; its numbers are doubles.
    return st.dictionaries(PROTO_TEXT, JSON_VALUES.filter(_struct_safe), max_size=4)


def _struct_safe(value) -> bool:
    try:
        import json

        json.dumps(value, ensure_ascii=False).encode("utf-8")
        return not _has_big_int(value)
    except (ValueError, UnicodeEncodeError):
        return False


def _has_big_int(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) > 2**53
    if isinstance(value, list):
        return any(_has_big_int(v) for v in value)
    if isinstance(value, dict):
        return any(_has_big_int(v) for v in value.values())
    return False


def _field(field: FieldDescriptor, depth: int) -> st.SearchStrategy:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        if field.message_type.full_name == "google.protobuf.Struct":
            return _struct_values()
        if field.message_type.GetOptions().map_entry:
            key = _field(field.message_type.fields_by_name["key"], depth + 1)
            value = _field(field.message_type.fields_by_name["value"], depth + 1)
            return st.dictionaries(key, value, max_size=4)
        one = message_values(field.message_type, depth + 1)
        if field.is_repeated:
            return st.lists(one, max_size=4)
        return one
    one = _scalar(field)
    if field.is_repeated:
        # Now and then hundreds of entries (scalars only: drawing hundreds of
        # nested messages would take the fuzzer longer than the engine).
        return st.one_of(st.lists(one, max_size=4), st.lists(one, min_size=100, max_size=300))
    return one


def message_values(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy:
    """Field values for a message of this type, as nested dicts (see build())."""
    if depth > 2:
        return st.just({})
    return st.fixed_dictionaries(
        {}, optional={f.name: st.deferred(lambda f=f: _field(f, depth))
                      for f in descriptor.fields})


def build(descriptor: Descriptor, values: dict):
    """A message from message_values()'s dicts."""
    message = message_factory.GetMessageClass(descriptor)()
    _fill(message, values)
    return message


def _fill(message, values: dict) -> None:
    for name, value in values.items():
        field = message.DESCRIPTOR.fields_by_name[name]
        target = getattr(message, name)
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            if field.is_repeated:
                target.extend(value)
            else:
                setattr(message, name, value)
        elif field.message_type.full_name == "google.protobuf.Struct":
            target.update(value)
        elif field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            for key, item in value.items():
                if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    _fill(target[key], item)
                else:
                    target[key] = item
        elif field.is_repeated:
            for item in value:
                _fill(target.add(), item)
        else:
            target.SetInParent()
            _fill(target, value)
