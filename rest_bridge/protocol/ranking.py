"""POST /v1/rerank (and /rerank), /v1/score and /v1/classify request schemas:
the shapes vLLM, llama.cpp's server and Jina/Cohere clients send."""

from __future__ import annotations

from rest_bridge.protocol.base import Int64, OpenAIBaseModel


class RerankDocument(OpenAIBaseModel):
    text: str


class RerankRequest(OpenAIBaseModel):
    model: str
    query: str
    # Texts, or Cohere's {"text": ...} objects.
    documents: list[str | RerankDocument]
    top_n: Int64 | None = None
    # Each result carries its document's text unless this is false.
    return_documents: bool | None = None


class ScoreRequest(OpenAIBaseModel):
    """vLLM's: one text against each of text_2, or two lists pairwise."""

    model: str
    text_1: str | list[str]
    text_2: str | list[str]


class ClassifyRequest(OpenAIBaseModel):
    model: str
    input: str | list[str]
    probe: str | None = None
    labels: list[str] | None = None
