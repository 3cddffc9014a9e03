"""The shared base schema and the one JSON-body parser.

Types are strict (a string is never coerced into a number, a bool never into
an int), unknown fields are kept in `model_extra` rather than dropped, and a
validation failure becomes a 400 envelope whose `param` names the field
("messages[1].content"), never FastAPI's 422 shape.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rest_bridge.errors import OpenAIError

INT64_MAX = 2**63 - 1
# Every integer of a body travels as a protobuf int64: only the wire's range is
# checked here (a larger one is "out of range", naming it); the engine owns the
# real ranges.
Int64 = Annotated[int, Field(ge=-INT64_MAX - 1, le=INT64_MAX)]
_RANGE_ERRORS = frozenset({"less_than_equal", "greater_than_equal"})
_QUERY_INT = re.compile(r"-?[0-9]{1,19}")


def query_int(query, name: str) -> int | None:
    """An integer query parameter (`?limit=20`), None when absent. ASCII digits
    with an optional minus, in int64 range: anything else ("--5", "²", "1_0",
    " 5") is a 400 invalid_parameter naming it; the engine owns the real range."""
    raw = query.get(name)
    if raw is None:
        return None
    value = int(raw) if _QUERY_INT.fullmatch(raw) else None
    if value is None or not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise OpenAIError(400, f"'{name}' must be an integer.", param=name,
                          code="invalid_parameter")
    return value


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    def top_level_extras(self) -> dict:
        """Keys of the body itself that the schema does not declare, with their
        values: the engine decides whether each is refused or reported."""
        return dict(self.model_extra or {})

    def nested_unused(self) -> list[str]:
        """Locations of undeclared keys below the top level, such as
        "messages[2].foo": nothing in miLLM reads them."""
        found: list[str] = []
        for name in type(self).model_fields:
            _walk(getattr(self, name), name, found)
        return found


def _walk(value, location: str, found: list[str]) -> None:
    if isinstance(value, OpenAIBaseModel):
        found.extend(f"{location}.{key}" for key in (value.model_extra or {}))
        for name in type(value).model_fields:
            _walk(getattr(value, name), f"{location}.{name}", found)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _walk(item, f"{location}[{i}]", found)


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = None


class PositionRange(OpenAIBaseModel):
    start: Int64
    end: Int64


class SaeActivationsSpec(OpenAIBaseModel):
    """miLLM's return_sae_activations."""

    sae_id: str | None = None
    features: list[Int64] | None = None
    top_k: Int64 | None = None
    # last, prompt, completion, all, or {"start", "end"} (half-open).
    positions: str | PositionRange | None = None
    # post_steering or pre_steering.
    read_point: str | None = None


class SharedFields(OpenAIBaseModel):
    """The fields every generation route declares alike (chat, text
    completions and /v1/responses): one definition, so a field is judged by
    the same type rule on each route."""

    model: str
    stream: bool | None = None
    # vLLM's scheduling class: lower starts first (GenerateRequest.priority).
    priority: Int64 | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int64 | None = None
    min_p: float | None = None
    stop: str | list[str] | None = None
    seed: Int64 | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    user: str | None = None
    # miLLM steering: a saved profile and the dial (a number in 0-2 or
    # off/min/max) for this request only; the engine says where they apply.
    profile: str | None = None
    steering_intensity: float | str | None = None
    return_sae_activations: SaeActivationsSpec | None = None
    # The unsteered completion beside the steered one (millm.unsteered, millm.divergence).
    steering_compare: bool | None = None

    # Declared fields this route's translation has no place for: their shape
    # is checked here, then they travel as extra fields and the engine's
    # field table refuses them by name (never dropped, never read unchecked).
    UNMAPPED: ClassVar[frozenset[str]] = frozenset()

    def top_level_extras(self) -> dict:
        extras = super().top_level_extras()
        for name in self.UNMAPPED:
            value = getattr(self, name)
            if value is not None:
                extras[name] = (value.model_dump(exclude_unset=True, by_alias=True)
                                if isinstance(value, BaseModel) else value)
        return extras


class StructuredOutputsSpec(OpenAIBaseModel):
    """vLLM's structured_outputs: exactly one constraint (the engine judges
    each; vLLM's other options here are reported as unused)."""

    # "json" would shadow a BaseModel method, hence the alias.
    json_: str | dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    structural_tag: str | dict[str, Any] | None = None
    json_object: bool | None = None


class GenerationFields(SharedFields):
    """The fields chat and text completions share besides those: streaming
    options, token limits, choices and scoring."""

    stream_options: StreamOptions | None = None
    # SGLang's stream_interval: tokens per streamed chunk after the first.
    stream_interval: Int64 | None = None
    max_tokens: Int64 | None = None
    max_completion_tokens: Int64 | None = None
    n: Int64 | None = None
    ignore_eos: bool | None = None
    # Scoring (max_tokens 1): restrict the next token to these ids.
    allowed_token_ids: list[Int64] | None = None
    # Key log-probabilities by "token_id:<id>" instead of the token's text.
    return_tokens_as_token_ids: bool | None = None
    # OpenAI's logit_bias: token ids (as JSON object keys) -> bias.
    logit_bias: dict[str, float] | None = None
    # vLLM's constraints (rest_bridge/serving/structured_outputs.py).
    structured_outputs: StructuredOutputsSpec | None = None


Model = TypeVar("Model", bound=OpenAIBaseModel)


def _field_names(model: type[BaseModel], seen: set | None = None) -> set[str]:
    seen = set() if seen is None else seen
    if model in seen:
        return set()
    seen.add(model)
    names = set(model.model_fields)
    for field in model.model_fields.values():
        for arg in _types_within(field.annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                names |= _field_names(arg, seen)
    return names


def _types_within(annotation) -> list:
    args = getattr(annotation, "__args__", None)
    if not args:
        return [annotation]
    found = []
    for arg in args:
        found.extend(_types_within(arg))
    return found


def _param(loc: tuple, field_names: set[str]) -> str:
    """('messages', 0, 'content', 'str') -> 'messages[0].content'.

    Union members appear in pydantic's locations as tags like 'str' or
    'list[int]'; they are not field names, so they are skipped.
    """
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in field_names:
            out += f".{part}" if out else part
    return out


def _describe(errors: list[dict], field_names: set[str]) -> OpenAIError:
    out_of_range = [e for e in errors if e["type"] in _RANGE_ERRORS]
    if out_of_range:  # the most specific complaint, even among a union's members
        param = _param(out_of_range[0]["loc"], field_names)
        return OpenAIError(400, f"'{param}' is out of range.", param=param,
                           code="invalid_parameter")
    first = errors[0]
    param = _param(first["loc"], field_names)
    if first["type"] == "missing":
        return OpenAIError(400, f"Missing required parameter: '{param}'.", param=param,
                           code="missing_required_parameter")
    same = [e["msg"] for e in errors if _param(e["loc"], field_names) == param]
    reasons = " or ".join(dict.fromkeys(m[0].lower() + m[1:] for m in same))
    return OpenAIError(400, f"Invalid type for '{param}': {reasons}.", param=param,
                       code="invalid_type")


# Deeper bodies are refused: a parser's recursion and protobuf's nesting limit
# (about 100 messages, and a JSON level costs two in a Struct) are both finite.
MAX_BODY_DEPTH = 128
MAX_EXTRA_FIELD_DEPTH = 32


def json_depth(value) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0, [] and [1] are 1),
    level by level rather than by recursion."""
    depth, level = 0, [value]
    while containers := [v for v in level if isinstance(v, dict | list)]:
        depth += 1
        level = [c for item in containers
                 for c in (item.values() if isinstance(item, dict) else item)]
    return depth


def unpaired_surrogate(value) -> str | None:
    """Where the first string holding an unpaired surrogate is ("messages[0].content"),
    or None. JSON may spell one ("\\ud800"), but it is not text: protobuf cannot
    encode it and the engine could not tokenize it. Level by level, like json_depth."""
    level = [("", value)]
    while level:
        below = []
        for location, item in level:
            if isinstance(item, str):
                if not _is_text(item):
                    return location
            elif isinstance(item, dict):
                for key, child in item.items():
                    where = f"{location}.{key}" if location else key
                    if not _is_text(key):
                        return location or "(a key)"
                    below.append((where, child))
            elif isinstance(item, list):
                below.extend((f"{location}[{i}]", child) for i, child in enumerate(item))
        level = below
    return None


def _is_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def refuse_surrogates(data) -> None:
    """A 400 naming the field when a string of the body is not valid Unicode."""
    location = unpaired_surrogate(data)
    if location is not None:
        param = location[:256]
        raise OpenAIError(400, f"'{param}' holds an unpaired UTF-16 surrogate, which is not "
                          "valid Unicode text.", param=param, code="invalid_parameter")


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _invalid_json(reason: str) -> OpenAIError:
    return OpenAIError(
        400,
        f"We could not parse the JSON body of your request ({reason}). The body must be a "
        "JSON object.",
        code="invalid_json",
    )


def parse_body(raw: bytes, model: type[Model]) -> Model:
    too_deep = f"nested deeper than {MAX_BODY_DEPTH} levels"
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise _invalid_json(too_deep) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _invalid_json(str(exc)) from None
    if not isinstance(data, dict):
        raise OpenAIError(400, "The request body must be a JSON object.", code="invalid_json")
    if json_depth(data) > MAX_BODY_DEPTH:
        raise _invalid_json(too_deep)
    refuse_surrogates(data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _describe(exc.errors(), _field_names(model)) from None
