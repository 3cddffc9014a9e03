"""Log-probabilities of generated tokens on the GGUF engine.

llama.cpp's sampler chain draws from a distribution it never hands back, so
each row that asked for `logprobs` keeps a second chain of its own: the same
bans and repeat penalties (accepting the same tokens, so its penalty history
is the drawing chain's) and the same temperature, without the request's
logit_bias, without truncation and without the draw. Applied to the row's
logits after its grammar mask, it gives the distribution the transformers
engine reports (engines/transformers/reading.py generation_logprobs: after
penalties, masks and temperature, before top-p/top-k/min-p), normalised and
ranked by engines/scores.py drawn_score, as the transformers engine's.
"""

from __future__ import annotations

import ctypes
import dataclasses

import llama_cpp as lib
import numpy as np
import torch
from llama_cpp.llama_cpp import llama_get_logits_ith as _logits_ith

from service.engines.gguf.sampling import sampler_chain
from service.engines.scores import TokenScore, TokenTable, drawn_score

# llama_token_data: {int32 id; float logit; float p}.
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class TokenScorer:
    """One row's log-probabilities: `score` after each draw, `top`
    alternatives with each (OpenAI's top_logprobs)."""

    def __init__(self, options, n_vocab: int, banned, seed: int, *, history: int,
                 tokens: TokenTable, top: int):
        reported = dataclasses.replace(options, top_k=0, top_p=1.0, min_p=0.0, logit_bias=())
        self.chain = sampler_chain(reported, n_vocab, banned, seed, history=history, draw=False)
        self.n_vocab, self.tokens, self.top = n_vocab, tokens, top
        self.data = np.zeros(n_vocab, dtype=_TOKEN_DATA)
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self.array = lib.llama_token_data_array(
            self.data.ctypes.data_as(ctypes.POINTER(lib.llama_token_data)), n_vocab, -1, False)

    def score(self, ctx, index: int, token: int) -> TokenScore:
        """The drawn `token`'s log-probability among the logits of batch
        position `index` (as its grammar mask left them), then the token is
        taken into this chain's penalty history as the drawing chain took it."""
        pointer = _logits_ith(ctx.ctx, index)
        logits = np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))
        self.data["id"] = self._ids
        self.data["logit"] = logits
        self.data["p"] = 0.0
        self.array.size, self.array.selected, self.array.sorted = self.n_vocab, -1, False
        lib.llama_sampler_apply(self.chain.sampler, ctypes.byref(self.array))
        values = np.empty(self.n_vocab, dtype=np.float32)
        kept = self.data[:self.array.size]  # no truncation in the chain: every id stays
        values[kept["id"]] = kept["logit"]
        self.chain.accept(token)
        return drawn_score(self.tokens, torch.from_numpy(values), token, self.top)
