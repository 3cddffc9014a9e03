"""POST /v1/completions request schema."""

from __future__ import annotations

from rest_bridge.protocol.base import OpenAIBaseModel, StreamOptions


class CompletionRequest(OpenAIBaseModel):
    model: str
    # A string, a list of strings, a list of token ids, or a list of those lists.
    prompt: str | list[str] | list[int] | list[list[int]]
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
