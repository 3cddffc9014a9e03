"""Structured output on the GGUF engine: the transformers engine's xgrammar
masks, applied to llama.cpp's logits in place before its sampler chain reads
them. One grammar compiler and one schema subset serve both engines
(service/grammars.py, service/structured_output.py); only where the mask is
written differs.

A row's bitmask lives only from its fill to its write, both in one call on
the model thread, so every row shares the engine's one scratch bitmask
(`Scratch`) rather than allocating a tensor per request: inside the serving
process an allocation and its numpy view cost about 150 µs a request, more
than the choice's whole mask work over its answer.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch
import xgrammar
from llama_cpp.llama_cpp import llama_get_logits_ith as _logits_ith

from service.engines import bitmask


class Scratch:
    """The model thread's one bitmask row, filled and written by one row at a
    time (never shared across threads)."""

    def __init__(self, n_vocab: int):
        self.bitmask = xgrammar.allocate_token_bitmask(1, n_vocab)
        self.bits = bitmask.bytes_of(self.bitmask)


class GrammarMask:
    """One constrained choice's place in its grammar."""

    def __init__(self, grammar, n_vocab: int, control_ids: list[int], scratch: Scratch,
                 watch=None, pieces: list[bytes] | None = None):
        self.matcher = xgrammar.GrammarMatcher(grammar)
        # A reasoning block before the document is free text: the control
        # ban waits until `watch` (generation/reasoning.py) sees it close.
        self.watch, self.pieces = watch, pieces
        self.n_vocab = n_vocab
        self.scratch = scratch
        # Tokens holding a control character never belong in a compact JSON
        # document, though xgrammar's string rules let some through.
        self.control = np.asarray(control_ids, dtype=np.int64) if control_ids else None
        self._view: tuple[int, np.ndarray] | None = None  # (address, logits over it)

    def apply(self, ctx, index: int = -1) -> None:
        """-inf on every token that cannot continue the document, in the
        logits of batch position `index` (what llama.cpp samples from)."""
        pointer = _logits_ith(ctx.ctx, index)
        address = ctypes.addressof(pointer.contents)
        if self._view is None or self._view[0] != address:
            # The context keeps its logits in one buffer: the view is made once.
            self._view = (address, np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)))
        logits = self._view[1]
        scratch = self.scratch
        # False: every token may come next (nothing to write).
        if self.matcher.fill_next_token_bitmask(scratch.bitmask):
            if bitmask.LITTLE:
                bitmask.apply_row(logits, scratch.bits)
            else:
                bitmask.apply(torch.from_numpy(logits), scratch.bitmask)
        if self.control is not None and self.watch is None:
            logits[self.control] = -np.inf

    def accept(self, token: int) -> bool:
        if self.watch is not None and self.watch.push(
                self.pieces[token].decode("utf-8", "ignore")):
            self.watch = None
        return self.matcher.accept_token(token)
