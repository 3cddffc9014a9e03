"""Seeded rows on the GGUF engine: each decodes in a llama.cpp context of its own.

A seed promises the same text whatever else the server is doing. llama.cpp's
logits for one sequence move in their last bits with the shape of the batch
it is decoded in and with what shares its KV cache: in the shared context's
unified cache the row's cells land wherever cells are free, beside other
sequences' cells, and the attention's sums then run in another order. So a
seeded group never enters the shared context. It gets a lane: a context of
one sequence and one context window of cells, emptied before the group
starts, so its prompt is cut into the same chunks, its cells sit at the same
places and its batches hold nothing but its own token, every time.

The runner (engines/gguf/batch.py) decodes the shared batch and then each
lane, one llama_decode each, every step: a seeded row moves one token a step
beside the others and admission never waits for it. A lane's context costs
one window of KV cells on top of the shared context; seeded rows count
against the slots, so at most `slots` lanes run at once. One emptied lane is
kept for the next seeded group (opening a context allocates its buffers); the
others are closed once their row has left.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.engines.gguf.slots import Row, Slot


@dataclass
class Lane:
    ctx: object  # LlamaContext
    batch: object  # LlamaBatch
    n_batch: int
    slot: Slot  # sequence 0 of its context; slot.row is the row it runs
    steer: object = None  # its steering tables (engines/gguf/steering.py), if steerable

    @property
    def row(self) -> Row | None:
        return self.slot.row

    def empty(self) -> None:
        """Back to the state of a context just opened: no cell in use."""
        from llama_cpp import llama_cpp as lib

        lib.llama_memory_clear(self.ctx.memory, True)
        self.slot.tokens.clear()
        self.slot.scores.clear()
        self.slot.row = None

    def close(self) -> None:
        self.batch.close()
        self.ctx.close()


def lane_opener(model, base_params, window: int, steerer=None):
    """A function opening a lane over `model`: llama-cpp-python's context
    parameters `base_params` (as the shared context's), one sequence of
    `window` cells, decoded in batches of at most 512 tokens, with the
    steering callback when `steerer` is given."""

    def open_lane() -> Lane:
        from llama_cpp import llama_cpp as lib
        from llama_cpp._internals import LlamaBatch, LlamaContext

        params = lib.llama_context_params.from_buffer_copy(base_params)
        n_batch = min(512, window)
        params.n_ctx, params.n_batch, params.n_ubatch = window, n_batch, n_batch
        params.n_seq_max = 1
        steer = steerer.hook(params, n_batch) if steerer is not None else None
        ctx = LlamaContext(model=model, params=params, verbose=False)
        try:
            batch = LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=1, verbose=False)
        except BaseException:
            ctx.close()
            raise
        return Lane(ctx, batch, n_batch, Slot(0), steer)

    return open_lane


class Lanes:
    """The lanes in use and the one kept spare."""

    def __init__(self, open_lane, spare: int = 1):
        self.open_lane = open_lane
        self.spare_max = spare
        self.active: list[Lane] = []
        self.spare: list[Lane] = []

    @property
    def rows(self) -> list[Row]:
        return [lane.row for lane in self.active if lane.row is not None]

    def running(self) -> list[Lane]:
        return [lane for lane in self.active if lane.row is not None]

    def held(self) -> int:
        return sum(len(lane.slot.tokens) for lane in self.running())

    def owns(self, slot: Slot) -> bool:
        return any(lane.slot is slot for lane in self.active)

    def take(self) -> Lane:
        """An empty lane (the spare one, or a new context: may raise)."""
        lane = self.spare.pop() if self.spare else self.open_lane()
        self.active.append(lane)
        return lane

    def release_free(self) -> None:
        """Lanes whose row left (finished, failed or cancelled) are emptied:
        one is kept spare, the others closed."""
        for lane in [lane for lane in self.active if lane.row is None]:
            self.active.remove(lane)
            if len(self.spare) < self.spare_max:
                lane.empty()
                self.spare.append(lane)
            else:
                lane.close()

    def close(self) -> None:
        for lane in [*self.active, *self.spare]:
            lane.close()
        self.active, self.spare = [], []
