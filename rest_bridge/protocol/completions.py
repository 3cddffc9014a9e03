"""POST /v1/completions request schema."""

from __future__ import annotations

from rest_bridge.protocol.base import GenerationFields, Int64


class CompletionRequest(GenerationFields):
    # A string, a list of strings, a list of token ids, or a list of those lists.
    prompt: str | list[str] | list[Int64] | list[list[Int64]]
    # miLLM extension: read special-token text in the prompt as special tokens.
    parse_special_tokens: bool | None = None
    # Alternatives per token, 0-20; with max_tokens 1 this is scoring mode.
    logprobs: Int64 | None = None
    echo: bool | None = None
    add_special_tokens: bool | None = None
