"""vLLM's structured_outputs, JSON to the contract's StructuredOutputs, and
the X-miLLM-Constrained header that says which constraint shaped a response.

The contract holds one kind (a oneof), so a body that sets several cannot be
translated: that is the one refusal made here. Everything else (empty texts,
bad patterns, sizes) is the engine's to judge (service/requests/constraints.py).
llama.cpp's top-level `grammar` is not translated: it travels as an extra
field, which the engine reads.
"""

from __future__ import annotations

import json

from millm.v1 import generation_pb2
from rest_bridge.errors import OpenAIError

_KINDS = ("json_", "regex", "choice", "grammar", "structural_tag", "json_object")
_HEADER_KINDS = {
    generation_pb2.OUTPUT_CONSTRAINT_JSON_OBJECT: "json_object",
    generation_pb2.OUTPUT_CONSTRAINT_JSON_SCHEMA: "json_schema",
    generation_pb2.OUTPUT_CONSTRAINT_REGEX: "regex",
    generation_pb2.OUTPUT_CONSTRAINT_CHOICE: "choice",
    generation_pb2.OUTPUT_CONSTRAINT_GRAMMAR: "grammar",
    generation_pb2.OUTPUT_CONSTRAINT_STRUCTURAL_TAG: "structural_tag",
}


def add_to_request(request, pb) -> None:
    # Only a schema that declares it has a spec; on one that does not (the
    # Messages API's) a sent one is an extra field, for the engine to judge.
    spec = (request.structured_outputs if "structured_outputs" in type(request).model_fields
            else None)
    if spec is None:
        return
    sent = [name for name in _KINDS if getattr(spec, name) is not None]
    if len(sent) > 1:
        names = ", ".join(f"'{n.rstrip('_')}'" for n in sent)
        raise OpenAIError(400, f"'structured_outputs' takes exactly one constraint; got {names}.",
                          param="structured_outputs", code="invalid_parameter")
    if not sent:
        return  # {}: no constraint
    kind = sent[0]
    value = getattr(spec, kind)
    out = pb.structured_outputs
    if kind == "choice":
        out.choice.choices.extend(value)
    elif isinstance(value, dict):  # a schema or a structural tag given as JSON
        setattr(out, kind.rstrip("_"), json.dumps(value))
    else:
        setattr(out, kind.rstrip("_"), value)


def header(meta: generation_pb2.ResponseMetadata) -> str | None:
    """X-miLLM-Constrained: the constraint's kind, and a json_schema's name
    when it has one."""
    kind = _HEADER_KINDS.get(meta.constraint)
    if kind is None:
        return None
    if kind == "json_schema" and meta.constraint_name:
        name = meta.constraint_name.replace("\\", "\\\\").replace('"', '\\"')
        return f'json_schema;name="{name}"'
    return kind
