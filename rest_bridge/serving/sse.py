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


# Stands for the one string that differs between a stream's text chunks.
MARK = "\x00millm-text\x00"
_MARK_JSON = json.dumps(MARK).encode()


class TextEvents:
    """A stream's text chunks, all alike but for their text: the chunk is
    rendered once per choice with MARK for its text, and each text is spliced
    in as json.dumps writes a string, so a token's event costs one string's
    encoding rather than the whole payload's (the same bytes as event())."""

    def __init__(self, render):
        self._render = render  # index -> the event with MARK as its text
        self._parts: dict[int, tuple[bytes, bytes]] = {}

    def __call__(self, index: int, text: str) -> bytes:
        parts = self._parts.get(index)
        if parts is None:
            head, found, tail = self._render(index).partition(_MARK_JSON)
            if not found:
                raise ValueError("the rendered chunk does not hold its text")
            parts = self._parts[index] = (head, tail)
        return parts[0] + json.dumps(text).encode() + parts[1]
