"""Structured output on the GGUF engine: the transformers engine's xgrammar
masks, applied to llama.cpp's logits in place before its sampler chain reads
them. One grammar compiler and one schema subset serve both engines
(service/grammars.py, service/structured_output.py); only where the mask is
written differs.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch
import xgrammar
from llama_cpp.llama_cpp import llama_get_logits_ith as _logits_ith

from service.engines import bitmask


class GrammarMask:
    """One constrained choice's place in its grammar."""

    def __init__(self, grammar, n_vocab: int, control_ids: list[int], watch=None,
                 pieces: list[bytes] | None = None):
        self.matcher = xgrammar.GrammarMatcher(grammar)
        # A reasoning block before the document is free text: the control
        # ban waits until `watch` (generation/reasoning.py) sees it close.
        self.watch, self.pieces = watch, pieces
        self.n_vocab = n_vocab
        self.bitmask = xgrammar.allocate_token_bitmask(1, n_vocab)
        # Tokens holding a control character never belong in a compact JSON
        # document, though xgrammar's string rules let some through.
        self.control = np.asarray(control_ids, dtype=np.int64)
        self._bits = bitmask.bytes_of(self.bitmask)
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
        self.matcher.fill_next_token_bitmask(self.bitmask)
        if bitmask.LITTLE:
            bitmask.apply_row(logits, self._bits)
        else:
            bitmask.apply(torch.from_numpy(logits), self.bitmask)
        if len(self.control) and self.watch is None:
            logits[self.control] = -np.inf

    def accept(self, token: int) -> bool:
        if self.watch is not None and self.watch.push(
                self.pieces[token].decode("utf-8", "ignore")):
            self.watch = None
        return self.matcher.accept_token(token)
