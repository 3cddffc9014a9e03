"""serving/sse.TextEvents: a stream's text chunks spliced into one rendering
are the bytes the whole payload's encoding gives, for any text."""

from __future__ import annotations

import pytest

from rest_bridge.serving import sse

TEXTS = ["Hello", " world", "", '"quoted"', "back\\slash", "new\nline\ttab", "\x00\x1f",
         "héllo wörld", "日本語", "😀 emoji", "\ud800", "</script>", sse.MARK + "x"]


def payload(index: int, text: str) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
            "model": 'm"odel', "choices": [{"index": index, "delta": {"content": text},
                                           "logprobs": None, "finish_reason": None}],
            "usage": None}


@pytest.mark.parametrize("text", TEXTS)
def test_a_spliced_text_event_is_the_encoded_payload(text):
    events = sse.TextEvents(lambda index: sse.event(payload(index, sse.MARK)))
    for index in (0, 3):
        assert events(index, text) == sse.event(payload(index, text))


def test_a_rendering_without_the_mark_is_refused():
    events = sse.TextEvents(lambda index: sse.event(payload(index, "no mark")))
    with pytest.raises(ValueError):
        events(0, "x")
