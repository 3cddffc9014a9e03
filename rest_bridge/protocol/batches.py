"""POST /v1/batches request schema (OpenAI's)."""

from __future__ import annotations

from rest_bridge.protocol.base import OpenAIBaseModel


class BatchRequest(OpenAIBaseModel):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
