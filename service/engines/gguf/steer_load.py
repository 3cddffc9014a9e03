"""The GGUF engine's steering at load: whether a model's graph hands over
every block's residual stream (`reachable`), and the `Steerer` that gives
each generating context the eval callback (steer_cb.c) over its own tables
(steering.py ContextSteer).

Why a module of its own: this runs once per model, apart from the per-step
tables steering.py fills.
"""

from __future__ import annotations

import logging

import torch

from service.engines.gguf.steering import ContextSteer, RowSteering

log = logging.getLogger(__name__)


class Steerer:
    """The model's steering facts (engines/base.py ModelSteering) and the
    callback every generating context of the engine is opened with."""

    def __init__(self, n_embd: int, n_layer: int):
        from llama_cpp import llama_cpp as lib

        from service.engines.gguf import native

        self.hidden_size, self.num_layers = n_embd, n_layer
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.callback = lib.ggml_backend_sched_eval_callback(("millm_steer_eval", native.load()))

    def hook(self, params, capacity: int) -> ContextSteer:
        """Give context parameters `params` the callback over a new set of tables."""
        steer = ContextSteer(self.hidden_size, self.num_layers, capacity)
        params.cb_eval = self.callback
        params.cb_eval_user_data = steer.user_data
        return steer

    def row(self, spec, monitor, prompt_len: int) -> RowSteering | None:
        return RowSteering.of(spec.steering, spec.activations, monitor, prompt_len,
                              self.num_layers - 1)


def new_steerer(model, model_id: str) -> Steerer | None:
    """The Steerer of a loaded llama_model, or None where the callback cannot
    be built (no C compiler, no ggml headers)."""
    from llama_cpp import llama_cpp as lib

    from service.engines.gguf.native import NativeUnavailable

    try:
        return Steerer(lib.llama_model_n_embd(model), lib.llama_model_n_layer(model))
    except NativeUnavailable as exc:
        log.warning("steering unavailable for %s: %s", model_id, exc)
        return None


def reachable(ctx, batch, steer: ContextSteer, bos: int, model_id: str) -> bool:
    """Decode one token in sequence 0 of `ctx` with the callback listening:
    does the graph hand over every block's residual stream, laid out as the
    callback reads it? The token's cells are dropped again."""
    from llama_cpp import llama_cpp as lib

    raw = batch.batch
    raw.n_tokens = 1
    raw.token[0] = max(0, bos)
    raw.pos[0], raw.n_seq_id[0], raw.seq_id[0][0], raw.logits[0] = 0, 1, 0, True
    steer.discover()
    try:
        ctx.decode(batch)
    finally:
        found = steer.reachable()
        lib.llama_memory_seq_rm(ctx.memory, 0, 0, -1)
        raw.n_tokens = 0
    if found:
        log.info("%s: steering on llama.cpp's residual stream (%d layers)", model_id,
                 steer.n_layer)
    else:
        log.warning("steering unavailable for %s: its graph does not name every block's "
                    "residual stream (l_out-<layer>)", model_id)
    return found
