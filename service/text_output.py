"""From generated token ids to the text a client sees.

IncrementalDetokenizer releases text only in whole characters: a byte-level
token can end in the middle of a UTF-8 sequence, and decoding it alone gives
U+FFFD. StopMatcher cuts stop sequences out of the text even when one arrives
split across tokens, by holding back any tail that could still become a stop.
"""

from __future__ import annotations

# A few prompt tokens seed the detokenizer so tokenizers that merge a leading
# space into the first word (sentencepiece) decode the first output correctly.
_CONTEXT_TOKENS = 4


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int]):
        self._tokenizer = tokenizer
        self._tokens = list(prompt_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._tokens)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def push(self, token_id: int) -> str:
        """Add one token; return the new complete text, possibly empty."""
        self._tokens.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """Text still held back at the end (an incomplete character shows as U+FFFD)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read_offset == len(self._tokens):
            return ""
        prefix_text = self._decode(self._tokens[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._tokens[self._prefix_offset :])
        if len(new_text) > len(prefix_text) and (final or not new_text.endswith("\ufffd")):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._tokens)
            return new_text[len(prefix_text) :]
        if final:
            self._read_offset = len(self._tokens)
        return ""


class StopMatcher:
    """Finds the earliest stop sequence in the text stream and holds back
    whatever could be the start of one."""

    def __init__(self, stops: tuple[str, ...]):
        self._stops = stops
        self._pending = ""
        # The sequence that matched (Anthropic's stop_sequence), once one has.
        self.matched = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit, whether a stop matched)."""
        if not self._stops:
            return text, False
        self._pending += text
        found = [(i, s) for s in self._stops if (i := self._pending.find(s)) >= 0]
        if found:
            hit = min(i for i, _ in found)
            self.matched = next(s for i, s in found if i == hit)
            out, self._pending = self._pending[:hit], ""
            return out, True
        keep = self._held_back_length()
        cut = len(self._pending) - keep
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out

    def _held_back_length(self) -> int:
        # The longest suffix of the pending text that is a proper prefix of a stop.
        best = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(stop[:k]):
                    best = k
                    break
        return best


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-to-character map, inverted: the character each byte is spelled as."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def byte_level_table(tokenizer) -> list[bytes] | None:
    """The bytes of every token id, when the tokenizer is byte-level BPE (GPT-2,
    Llama 3, Qwen, the demo model); None otherwise. Special tokens decode to
    their own text, as `decode(skip_special_tokens=False)` gives them."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or type(backend.decoder).__name__ != "ByteLevel":
        return None
    alphabet = _byte_level_alphabet()
    added = {t.content for t in tokenizer.added_tokens_decoder.values()}
    table = []
    for piece in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))):
        if piece is None:
            table.append(b"")
        elif piece in added:
            table.append(piece.encode())
        elif all(ch in alphabet for ch in piece):
            table.append(bytes(alphabet[ch] for ch in piece))
        else:
            return None  # not the byte-level spelling after all: use the generic path
    return table


class ByteLevelDetokenizer:
    """IncrementalDetokenizer's fast path for byte-level tokenizers: each token
    is a run of bytes, fed to an incremental UTF-8 decoder that releases only
    complete characters. Same output, no decode call per token."""

    def __init__(self, table: list[bytes]):
        import codecs

        self._table = table
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self._table[token_id])

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def control_char_ids(pieces: list[bytes]) -> list[int]:
    """Tokens whose bytes hold a control character (U+0000-U+001F): never part
    of a compact JSON document, so both engines mask them for response_format."""
    return [i for i, piece in enumerate(pieces) if any(b < 0x20 for b in piece)]
