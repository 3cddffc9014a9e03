"""Structured output on the GGUF engine: the transformers engine's xgrammar
masks, applied to llama.cpp's logits in place before its sampler chain reads
them. One grammar compiler and one schema subset serve both engines
(service/structured_output.py); only where the mask is written differs.
"""

from __future__ import annotations

import numpy as np
import torch
import xgrammar


class GrammarMask:
    """One constrained choice's place in its grammar."""

    def __init__(self, grammar, n_vocab: int, control_ids: list[int]):
        self.matcher = xgrammar.GrammarMatcher(grammar)
        self.n_vocab = n_vocab
        self.bitmask = xgrammar.allocate_token_bitmask(1, n_vocab)
        # Tokens holding a control character never belong in a compact JSON
        # document, though xgrammar's string rules let some through.
        self.control = torch.tensor(control_ids, dtype=torch.long)

    def apply(self, ctx) -> None:
        """-inf on every token that cannot continue the document, in the
        logits of the context's last position (what llama.cpp samples from)."""
        from llama_cpp import llama_cpp as lib

        pointer = lib.llama_get_logits_ith(ctx.ctx, -1)
        logits = torch.from_numpy(np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)))
        self.matcher.fill_next_token_bitmask(self.bitmask)
        xgrammar.apply_token_bitmask_inplace(logits, self.bitmask)
        if len(self.control):
            logits[self.control] = float("-inf")

    def accept(self, token: int) -> bool:
        return self.matcher.accept_token(token)
