"""POST /v1/embeddings request schema."""

from __future__ import annotations

from rest_bridge.protocol.base import OpenAIBaseModel


class EmbeddingRequest(OpenAIBaseModel):
    model: str
    # A string, a list of strings, a list of token ids, or a list of those lists.
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: str | None = None
    user: str | None = None
