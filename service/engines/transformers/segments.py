"""Tokenizing a rendered chat by the pieces between its special tokens, with
the long pieces remembered.

A Hugging Face fast tokenizer first cuts its input at every added token (the
chat markup: `<|im_start|>`, `<|im_end|>`), then tokenizes each piece in
between on its own. A rendered conversation is therefore the same ids as its
pieces tokenized one by one, and a piece seen before (the long system prompt
a deployment sends with every request) need not be tokenized again: 512
tokens of it cost about half a millisecond each time, which is most of what a
request whose prompt the prefix cache already holds still pays before its
first token.

That equality holds only for tokenizers whose pieces really are independent,
so `SegmentTokenizer.for_tokenizer` returns None (tokenize the whole text)
unless: there is no normalizer; the pre-tokenizer is byte-level (optionally
with regex splits and digit splits), without a prefix space; the model is BPE
without dropout; and no added token strips the whitespace beside it or
matches only whole words. It also checks itself once on a sample conversation
and stands down if the two ways differ.
"""

from __future__ import annotations

import collections
import json
import re

# Pieces shorter than this are tokenized every time (cheap, and rarely shared).
MIN_CACHED_CHARS = 256
# The remembered pieces' characters at most, least recently used dropped first.
CACHED_CHARS = 1 << 20

_INDEPENDENT_PRE_TOKENIZERS = {"ByteLevel", "Split", "Digits"}


def _pre_tokenizer_ok(config: dict | None) -> bool:
    if config is None:
        return True
    kind = config.get("type")
    if kind == "Sequence":
        return all(_pre_tokenizer_ok(c) for c in config.get("pretokenizers", []))
    if kind == "ByteLevel" and config.get("add_prefix_space"):
        return False
    return kind in _INDEPENDENT_PRE_TOKENIZERS


class SegmentTokenizer:
    def __init__(self, backend, added: dict[str, int]):
        self._backend = backend
        self._added = added
        # Longest first: at one position the longest added token wins, as the
        # tokenizer's own leftmost-longest match does.
        self._split = re.compile("(" + "|".join(
            re.escape(t) for t in sorted(added, key=len, reverse=True)) + ")")
        self._pieces: collections.OrderedDict[str, list[int]] = collections.OrderedDict()
        self._chars = 0

    @classmethod
    def for_tokenizer(cls, tokenizer) -> SegmentTokenizer | None:
        """A SegmentTokenizer agreeing with `tokenizer(text, add_special_tokens=False)`,
        or None when this tokenizer's pieces are not independent."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        config = json.loads(backend.to_str())
        model = config.get("model") or {}
        added = config.get("added_tokens") or []
        if (config.get("normalizer") is not None
                or not _pre_tokenizer_ok(config.get("pre_tokenizer"))
                or model.get("type") != "BPE" or model.get("dropout")
                or not added
                or any(t.get("lstrip") or t.get("rstrip") or t.get("single_word")
                       for t in added)):
            return None
        segments = cls(backend, {t["content"]: t["id"] for t in added})
        sample = "".join(f"{t} some text, 12345 and\n  more {t}" for t in segments._added)
        sample += "x" * MIN_CACHED_CHARS  # a piece long enough to be cached
        whole = list(tokenizer(sample, add_special_tokens=False)["input_ids"])
        if segments.encode(sample) != whole or segments.encode(sample) != whole:
            return None  # (the second time from the cache)
        segments._pieces.clear()
        segments._chars = 0
        return segments

    def encode(self, text: str) -> list[int]:
        """The ids of `text`, without the tokenizer's added BOS/EOS."""
        ids: list[int] = []
        for i, piece in enumerate(self._split.split(text)):
            if i % 2:  # the separators: an added token each
                ids.append(self._added[piece])
            elif piece:
                ids.extend(self._piece(piece))
        return ids

    def _piece(self, piece: str) -> list[int]:
        if len(piece) < MIN_CACHED_CHARS:
            return self._backend.encode(piece, add_special_tokens=False).ids
        found = self._pieces.get(piece)
        if found is None:
            found = self._backend.encode(piece, add_special_tokens=False).ids
            if len(piece) <= CACHED_CHARS:
                self._pieces[piece] = found
                self._chars += len(piece)
                while self._chars > CACHED_CHARS:
                    self._chars -= len(self._pieces.popitem(last=False)[0])
        else:
            self._pieces.move_to_end(piece)
        return found
