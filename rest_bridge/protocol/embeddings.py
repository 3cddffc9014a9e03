"""POST /v1/embeddings request schema."""

from __future__ import annotations

from rest_bridge.protocol.base import Int64, OpenAIBaseModel


class EmbeddingRequest(OpenAIBaseModel):
    model: str
    # A string, a list of strings, a list of token ids, or a list of those lists.
    input: str | list[str] | list[Int64] | list[list[Int64]]
    encoding_format: str | None = None
    user: str | None = None
