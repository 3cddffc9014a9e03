"""The parts of the OpenAI API that miLLM does not serve.

A client calling one of them gets an OpenAI-format 404 saying so, instead of
a bare "Not Found" page, so SDK code fails with a readable error.
"""

from __future__ import annotations

import re

# Path families of the public OpenAI API (see docs/openai-compatibility.md).
OPENAI_FAMILIES = (
    "embeddings", "audio", "images", "files", "uploads", "vector_stores",
    "assistants", "threads", "batches", "fine_tuning", "moderations", "realtime",
    "organization", "evals", "containers", "conversations", "chatkit", "videos",
)
_FAMILY = re.compile(r"^/v1/(" + "|".join(OPENAI_FAMILIES) + r")(/.*)?$")
# /v1/responses is served (POST, GET and DELETE of one, its input_items); its
# other OpenAI routes (cancel, compact, input_tokens) are not.
_RESPONSES_UNSERVED = re.compile(r"^/v1/responses/(input_tokens|compact|[^/]+/cancel)$")


def is_openai_endpoint(method: str, path: str) -> bool:
    if _FAMILY.match(path) or _RESPONSES_UNSERVED.match(path):
        return True
    # Deleting a fine-tuned model is part of the Models API.
    return method == "DELETE" and re.match(r"^/v1/models/[^/]+$", path) is not None
