"""The rules of an embeddings request: which fields it honours (the field
table's embeddings column), its inputs, and their fit in the context window."""

from __future__ import annotations

from dataclasses import dataclass

from service.engines.capabilities import EngineCapabilities
from service.errors import context_length_exceeded, invalid_parameter, unused_fields_refused
from service.requests import fields
from service.requests.checks import outside_vocabulary
from service.requests.params import EmbedParams

MAX_EMBED_INPUTS = 2048


@dataclass(frozen=True)
class EmbedResult:
    vectors: list[list[float]]
    prompt_tokens: int
    model: str
    ignored_fields: tuple[str, ...]


def check_fields(params: EmbedParams, kind: EngineCapabilities) -> list[str]:
    """Refuse what embeddings cannot honour; the unused locations otherwise
    (refused too under strict mode)."""
    unused = fields.check(params.extra_fields, fields.EMBEDDINGS, kind)
    unused.extend(params.unused_fields)
    if params.user is not None:
        unused.append("user")
    if params.strict and unused:
        raise unused_fields_refused(unused)
    return unused


def check_inputs(params: EmbedParams, vocab_size: int) -> None:
    if not params.inputs:
        raise invalid_parameter("input", "'input' must not be empty.")
    if len(params.inputs) > MAX_EMBED_INPUTS:
        raise invalid_parameter("input", f"'input' takes at most {MAX_EMBED_INPUTS} items; "
                                f"got {len(params.inputs)}.")
    for i, item in enumerate(params.inputs):
        if isinstance(item, tuple):
            bad = outside_vocabulary(item, vocab_size)
            if bad is not None:
                raise invalid_parameter(f"input[{i}]", f"Input {i} holds token id {bad}, "
                                        f"outside the vocabulary (0-{vocab_size - 1}).")


def check_fit(ids: list[list[int]], context_window: int,
              embedding_window: int | None = None) -> None:
    """Each input fits: the context window, or the shorter embedding window of
    an engine that reads less at once for embeddings (GGUF)."""
    limit = min(context_window, embedding_window or context_window)
    what = ("maximum context length" if limit == context_window
            else "longest embedding input")
    for i, tokens in enumerate(ids):
        if not tokens:
            raise invalid_parameter(f"input[{i}]", f"Input {i} tokenizes to no tokens.")
        if len(tokens) > limit:
            raise context_length_exceeded(
                f"input[{i}]", f"This model's {what} is {limit} tokens. However, input {i} "
                f"has {len(tokens)} tokens. Please shorten it.")
