"""Server-sent events framed exactly as OpenAI frames them."""

from __future__ import annotations

import json

DONE = b"data: [DONE]\n\n"

SSE_HEADERS = {
    "Cache-Control": "no-cache",
    # Tell proxies (nginx) not to buffer the stream.
    "X-Accel-Buffering": "no",
}


def event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
