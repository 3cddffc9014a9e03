"""POST /v1/completions request schema."""

from __future__ import annotations

from rest_bridge.protocol.base import GenerationFields


class CompletionRequest(GenerationFields):
    # A string, a list of strings, a list of token ids, or a list of those lists.
    prompt: str | list[str] | list[int] | list[list[int]]
    # miLLM extension: read special-token text in the prompt as special tokens.
    parse_special_tokens: bool | None = None
