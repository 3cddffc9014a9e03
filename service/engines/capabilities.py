"""What an engine can do, as data: the field table (requests/fields.py) and
GetCapabilities read it, so validation never asks which engine it is. Kept
apart from the engine interface (engines/base.py) so that request validation
imports no engine code."""

from __future__ import annotations

from dataclasses import dataclass

from service.models.registry import GGUF, TRANSFORMERS


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can do; the field table (requests/fields.py) reads these."""

    several_choices: bool  # n > 1: rows of one batch
    generation_logprobs: bool  # log-probabilities of generated tokens
    scoring: bool  # next-token scoring and echo's prompt log-probabilities
    grammar: bool  # response_format and structured_outputs through token masks
    steer: bool  # per-request SAE steering and activation readout
    embeddings: bool
    extra_conversations: bool  # extra_messages: several chats in one request
    # The model has a reasoning format (service/formats): without one the
    # reasoning fields are reported as ignored, never faked.
    reasoning: bool = True


KIND_CAPABILITIES: dict[str, EngineCapabilities] = {
    TRANSFORMERS: EngineCapabilities(
        several_choices=True, generation_logprobs=True, scoring=True, grammar=True,
        steer=True, embeddings=True, extra_conversations=True),
    # llama.cpp's sampler does not expose the distribution it drew from, so a
    # row asking for log-probabilities keeps a chain of its own that does
    # (engines/gguf/logprobs.py); a request's n choices share its prompt's
    # cells (engines/gguf/forks.py), and their logits take the same grammar
    # masks (engines/gguf/constraint.py).
    GGUF: EngineCapabilities(
        several_choices=True, generation_logprobs=True, scoring=True, grammar=True,
        steer=True, embeddings=True, extra_conversations=False),
}
