"""What every generation route sends besides its own translation of the
body: the sampling fields that were sent, logit_bias keys as token ids, the
strict-mode header, the fields the schema does not map (for the engine to
judge) and the stream, coalesce, request-id and steering fields.

Split from serving/generation.py so the shared call and stream machinery
reads on its own; the embeddings, token-count and tokenize routes use the
header and the unmapped fields without any generation handler.
"""

from __future__ import annotations

import re

from starlette.requests import Request

from millm.v1 import generation_pb2, generation_service_pb2
from rest_bridge.access import request_id
from rest_bridge.errors import OpenAIError
from rest_bridge.protocol.base import MAX_EXTRA_FIELD_DEPTH, json_depth
from rest_bridge.serving import steering_fields, structured_outputs

_SAMPLING_FIELDS = (
    "temperature", "top_p", "top_k", "min_p", "max_tokens", "max_completion_tokens",
    "n", "seed", "frequency_penalty", "presence_penalty", "repetition_penalty", "ignore_eos",
)
# Note: logprobs is mapped by each route (chat's is a flag, completions' a count).


def sampling_to_pb(request) -> generation_pb2.SamplingParams:
    """Copy the sampling fields that were sent; unsent ones stay unset."""
    sampling = generation_pb2.SamplingParams()
    for name in _SAMPLING_FIELDS:
        value = getattr(request, name)
        if value is None:
            continue
        setattr(sampling, name, value)
    stop = request.stop
    if stop is not None:
        sampling.stop.extend([stop] if isinstance(stop, str) else stop)
    if request.allowed_token_ids is not None:
        sampling.allowed_token_ids.extend(request.allowed_token_ids)
    if request.logit_bias:
        sampling.logit_bias.update(logit_bias_ids(request.logit_bias))
    return sampling


_TOKEN_KEY = re.compile(r"-?[0-9]{1,19}")


def logit_bias_ids(bias: dict[str, float]) -> dict[int, float]:
    """logit_bias's keys as the token ids they spell (a JSON object's keys
    are strings); a key that spells no int64, or the same id as another key,
    is a 400 naming it. The engine owns the vocabulary and the value range."""
    ids: dict[int, float] = {}
    for key, value in bias.items():
        where = f"logit_bias[{key[:64]}]"
        token = int(key) if _TOKEN_KEY.fullmatch(key) else None
        if token is None or not -2**63 <= token < 2**63:
            raise OpenAIError(400, f"'{where}': the keys of 'logit_bias' are token ids, "
                              "written as decimal integers.", param=where,
                              code="invalid_parameter")
        if token in ids:
            raise OpenAIError(400, f"'{where}' names token {token} a second time.",
                              param=where, code="invalid_parameter")
        ids[token] = value
    return ids


STRICT_HEADER = "X-miLLM-Strict"
_STRICT_VALUES = {"true": True, "1": True, "false": False, "0": False}


def strict_mode(http_request: Request) -> bool:
    value = http_request.headers.get(STRICT_HEADER)
    if value is None:
        return False
    strict = _STRICT_VALUES.get(value.strip().lower())
    if strict is None:
        raise OpenAIError(400, f"The {STRICT_HEADER} header must be true, 1, false or 0.",
                          param=STRICT_HEADER, code="invalid_parameter")
    return strict


def forward_unmapped(request, pb) -> None:
    """What the schema does not map goes to the engine to judge: top-level
    extras with their values (extra_fields), nested unknown locations
    (unused_fields) and the user id. GenerateRequest and EmbedRequest share
    these field names."""
    extras = request.top_level_extras()
    for name, value in extras.items():
        if json_depth(value) > MAX_EXTRA_FIELD_DEPTH:
            raise OpenAIError(400, f"'{name}' is nested deeper than {MAX_EXTRA_FIELD_DEPTH} "
                              "levels.", param=name, code="invalid_parameter")
        try:
            pb.extra_fields.update({name: value})
        except (OverflowError, ValueError):  # an integer no double holds
            raise OpenAIError(400, f"'{name}' holds a number out of range.", param=name,
                              code="invalid_parameter") from None
    pb.unused_fields.extend(request.nested_unused())
    # (A schema without `user`, as Anthropic's, has any sent one among the extras.)
    if "user" in type(request).model_fields and request.user is not None:
        pb.user = request.user


def common_fields(request, pb: generation_service_pb2.GenerateRequest,
                  strict: bool) -> generation_service_pb2.GenerateRequest:
    """What every generation route (chat, completions, responses) sends besides
    its own translation: strict mode (the caller reads it first, as its first
    check), whether it streams (the engine's stream rules), the request id, the
    steering fields and what the schema does not map."""
    pb.strict = strict
    # (A token count declares no `stream`: one sent there is an extra field.)
    pb.stream = "stream" in type(request).model_fields and bool(request.stream)
    # A reply given whole needs the engine's output in one message, not a step's each.
    pb.coalesce = not pb.stream
    interval = getattr(request, "stream_interval", None)
    if interval is not None and "stream_interval" in type(request).model_fields:
        pb.stream_interval = interval
    priority = getattr(request, "priority", None)
    if priority is not None and "priority" in type(request).model_fields:
        pb.priority = priority
    pb.request_id = request_id.get()
    steering_fields.add_to_request(request, pb)
    structured_outputs.add_to_request(request, pb)
    forward_unmapped(request, pb)
    return pb
