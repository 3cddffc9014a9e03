"""Which replica has most likely cached a prompt's beginning.

Why: an engine's prefix cache only helps requests that reach the engine that
holds the prefix. The bridge cannot see the engines' caches (and does not
tokenize), so it keeps an approximate index of what it sent where, the way
llm-d's approximate prefix scorer and SGLang's cache-aware router do: the
prompt text is cut into fixed blocks of characters, each block's hash chains
the ones before it (a block's hash stands for the whole prefix up to its end),
and the index remembers which replicas were sent each block hash, least
recently used first out. A replica's match is the number of leading blocks it
was sent.
"""

from __future__ import annotations

import contextvars
import hashlib
from collections import OrderedDict

BLOCK_CHARS = 256
MAX_BLOCKS = 256  # 64 KiB of prompt: past that, the beginning decides
INDEX_ENTRIES = 65_536


HASHED_CHARS = MAX_BLOCKS * BLOCK_CHARS
# A request's prompt_cache_key (the Responses API's), set by its handler: a
# client's hint that its requests share a prefix. It becomes a first block of
# their own, so requests with the same key go where the key went before
# (while that replica is not overloaded) even when their text has no whole
# block in common yet, and requests with different keys share no prefix.
cache_key: contextvars.ContextVar[str] = contextvars.ContextVar("cache_key", default="")


def prompt_text(request) -> str:
    """A GenerateRequest's input in prompt order: tools (rendered before the
    conversation by chat templates), then each message's role and content; or
    the first completion prompt. Only its first HASHED_CHARS characters, all
    that block_hashes reads: the rest of a long conversation is not gathered."""
    kind = request.WhichOneof("input")
    if kind == "chat":
        parts, size = [request.model, "\x1d"], len(request.model) + 1

        def add(*pieces: str) -> bool:
            nonlocal size
            for piece in pieces:
                piece = piece[:HASHED_CHARS - size]
                parts.append(piece)
                size += len(piece)
            return size < HASHED_CHARS

        for t in request.tools:
            if not add(t.name, "\x1f", t.description, "\x1f", t.parameters_json, "\x1e"):
                return "".join(parts)
        for message in request.chat.messages:
            if not add(str(message.role), "\x1f", message.content, "\x1e"):
                break
        return "".join(parts)
    if kind == "prompt" and request.prompt.prompts:
        first = request.prompt.prompts[0]
        body = (first.text[:HASHED_CHARS] if first.HasField("text")
                else ",".join(map(str, first.token_ids.ids[:HASHED_CHARS])))
        return f"{request.model}\x1d{body}"[:HASHED_CHARS]
    return ""


def block_hashes(text: str, key: str = "") -> list[bytes]:
    """Chained hashes of the text's whole blocks (a shorter tail is left out:
    two prompts share a block only if they share all of it), after the
    key's block when there is a key (cache_key)."""
    hashes, previous = [], b""
    if key:
        previous = hashlib.blake2b(b"\x1ckey\x1c" + key.encode("utf-8", "surrogatepass"),
                                   digest_size=8).digest()
        hashes.append(previous)
    for start in range(0, min(len(text), MAX_BLOCKS * BLOCK_CHARS) - BLOCK_CHARS + 1,
                       BLOCK_CHARS):
        block = text[start:start + BLOCK_CHARS].encode("utf-8", "surrogatepass")
        previous = hashlib.blake2b(previous + block, digest_size=8).digest()
        hashes.append(previous)
    return hashes


class PrefixIndex:
    """Block hash -> the replicas it was sent to, bounded, least recently used out."""

    def __init__(self, entries: int = INDEX_ENTRIES):
        self.entries = entries
        self._sent: OrderedDict[bytes, set[str]] = OrderedDict()

    def matches(self, hashes: list[bytes]) -> dict[str, int]:
        """For each replica, how many leading blocks it was sent."""
        found: dict[str, int] = {}
        alive: set[str] | None = None
        for depth, block in enumerate(hashes, 1):
            holders = self._sent.get(block)
            alive = set(holders or ()) if alive is None else alive & (holders or set())
            if not alive:
                break
            for target in alive:
                found[target] = depth
        return found

    def record(self, hashes: list[bytes], target: str) -> None:
        for block in hashes:
            holders = self._sent.get(block)
            if holders is None:
                self._sent[block] = {target}
            else:
                holders.add(target)
                self._sent.move_to_end(block)
        while len(self._sent) > self.entries:
            self._sent.popitem(last=False)

    def forget(self, target: str) -> None:
        """A replica restarted or left: its cache is gone."""
        for block in [b for b, holders in self._sent.items() if target in holders]:
            holders = self._sent[block]
            holders.discard(target)
            if not holders:
                del self._sent[block]
