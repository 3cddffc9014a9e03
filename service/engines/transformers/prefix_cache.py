"""Reusing the KV cache of prompt prefixes computed before.

Prompts are cut into blocks of BLOCK_TOKENS tokens. A block is identified by
a digest chained over every token before and in it, so a block matches only
when the whole prefix up to it matches. After a prefill, each full block of
the prompt is stored (one K and one V slice per layer); a later prompt that
starts with the same blocks skips computing them. Blocks are evicted least
recently used first once the cache holds more than its token budget.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from dataclasses import dataclass

import torch

BLOCK_TOKENS = 16


@dataclass
class _Block:
    keys: list[torch.Tensor]  # per layer [kv_heads, BLOCK_TOKENS, head_dim]
    values: list[torch.Tensor]


def _block_digests(prompt: tuple[int, ...], blocks: int) -> list[bytes]:
    tokens = blocks * BLOCK_TOKENS
    data = struct.pack(f"<{tokens}I", *prompt[:tokens])  # one call, not one per token
    step = 4 * BLOCK_TOKENS
    digests, previous = [], b""
    for i in range(blocks):
        previous = hashlib.blake2b(previous + data[i * step:(i + 1) * step],
                                   digest_size=16).digest()
        digests.append(previous)
    return digests


class PrefixCache:
    def __init__(self, max_tokens: int):
        self.max_blocks = max(0, max_tokens // BLOCK_TOKENS)
        self._blocks: OrderedDict[bytes, _Block] = OrderedDict()
        self.hit_tokens_total = 0
        self.lookups_total = 0
        # The last prompt's digests: admission peeks, the prefill looks up and
        # then stores the same prompt tuple, which needs hashing only once.
        self._digested: tuple[tuple[int, ...], list[bytes]] = ((), [])

    def _digests(self, prompt: tuple[int, ...], blocks: int) -> list[bytes]:
        seen, digests = self._digested
        if seen is not prompt or len(digests) < blocks:
            digests = _block_digests(prompt, len(prompt) // BLOCK_TOKENS)
            self._digested = (prompt, digests)
        return digests[:blocks]

    @property
    def enabled(self) -> bool:
        return self.max_blocks > 0

    @property
    def cached_tokens(self) -> int:
        return len(self._blocks) * BLOCK_TOKENS

    def peek(self, prompt: tuple[int, ...]) -> int:
        """How many prompt tokens a lookup would reuse (without touching recency)."""
        if not self.enabled:
            return 0
        usable = (len(prompt) - 1) // BLOCK_TOKENS
        hits = 0
        for digest in self._digests(prompt, usable):
            if digest not in self._blocks:
                break
            hits += 1
        return hits * BLOCK_TOKENS

    def lookup(
        self, prompt: tuple[int, ...], columns: int = 0
    ) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]:
        """The longest cached prefix, leaving at least one token to compute
        (its logits choose the first output token): (tokens T, per-layer
        [1,H,max(T, columns),D] K/V), the prefix in the first T columns and
        the rest unwritten room for the columns computed next
        (kv.from_prefix): one copy of the prefix, not two."""
        self.lookups_total += 1
        if not self.enabled:
            return 0, []
        usable = (len(prompt) - 1) // BLOCK_TOKENS
        found: list[_Block] = []
        for digest in self._digests(prompt, usable):
            block = self._blocks.get(digest)
            if block is None:
                break
            self._blocks.move_to_end(digest)
            found.append(block)
        if not found:
            return 0, []
        room = max(0, columns - len(found) * BLOCK_TOKENS)

        def joined(parts: list[torch.Tensor]) -> torch.Tensor:
            first = parts[0]  # keys and values may differ in head size
            spare = first.new_empty((first.shape[0], room, first.shape[2]))
            return torch.cat([*parts, spare], dim=1).unsqueeze(0)

        layers = [(joined([b.keys[i] for b in found]), joined([b.values[i] for b in found]))
                  for i in range(len(found[0].keys))]
        tokens = len(found) * BLOCK_TOKENS
        self.hit_tokens_total += tokens
        return tokens, layers

    def store(self, prompt: tuple[int, ...], layers: list[tuple[torch.Tensor, torch.Tensor]],
              row: int = 0, start: int = 0) -> None:
        """Keep each full block of `prompt`, whose KV sits in `row` of a freshly
        prefilled cache's attention layers (keys, values) from column `start`
        on (after any left padding)."""
        if not self.enabled:
            return
        blocks = len(prompt) // BLOCK_TOKENS
        for i, digest in enumerate(self._digests(prompt, blocks)):
            if digest in self._blocks:
                self._blocks.move_to_end(digest)
                continue
            span = slice(start + i * BLOCK_TOKENS, start + (i + 1) * BLOCK_TOKENS)
            self._blocks[digest] = _Block(
                keys=[k[row, :, span, :].clone() for k, _ in layers],
                values=[v[row, :, span, :].clone() for _, v in layers],
            )
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()
