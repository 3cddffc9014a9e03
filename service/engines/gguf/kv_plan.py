"""How many KV cells the GGUF engine opens: slots × window, sized to memory.

llama.cpp allocates a context's whole KV cache, and the scratch its attention
needs for that many cells, when the context is created. A long-context file
(a 128k window) with the default 8 slots would ask for 8 × 128k cells; on most
machines that does not fit. So the window is chosen here, before the load, from
the file's trained context, MILLM_GGUF_SLOTS and the memory the engine may
use (`budget`), by one rule:

1. MILLM_GGUF_CONTEXT set: that window (capped by the trained one) and the
   configured slots, or a refusal when they do not fit: an explicit setting is
   never quietly changed.
2. Otherwise the trained window for every slot when it fits.
3. Otherwise the configured slots keep their number and the window shrinks to
   the longest that fits (a multiple of 256), never below FLOOR (or the trained
   window when that is shorter). The slots are the operator's concurrency; the
   trained window is a ceiling most requests are far below, and a prompt past
   the chosen window gets a clear context_length_exceeded naming it.
4. If even FLOOR does not fit, fewer slots at FLOOR; if not one fits, refused.

What a window costs (`engine_bytes`) counts every context the engine may hold
at once at that window: the shared generation context (slots × window cells),
a lane per slot for seeded rows (engines/gguf/lanes.py: up to `slots` run at
once), and the scoring reader (f32 cells, engines/gguf/reading.py). The
embedding reader is not planned with them: it is made only when embeddings
are asked for, and its window is capped so that it stays within EMBED_BYTES
(`embedding_window`). A cell
costs its K and V rows in every layer (f16: 2 bytes a value) plus llama.cpp's
attention scratch, one f32 score per head and one mask value for each token
of a micro-batch (flash attention is off in llama-cpp-python's contexts).
Per-context fixed buffers (logits, activations) are left to the headroom.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024
FLOOR = 2048  # the shortest window a shrink goes to (a file trained shorter keeps its own)
STEP = 256  # a shrunk window is a multiple of this
MICRO_BATCH = 512  # the engine's contexts decode at most this many tokens a pass
EMBED_BYTES = 256 * MIB  # the most the embedding reader's context may take


@dataclass(frozen=True)
class CellCost:
    """What one KV cell of a file costs: K and V in every layer at f16, and
    the attention heads (the scratch grows with them)."""

    kv_bytes: int  # f16 K + V bytes of one cell, summed over the layers
    heads: int  # attention heads (the most of any layer)

    def context_bytes(self, cells: int, kv_width: int = 2, micro: int = MICRO_BATCH) -> int:
        """One llama.cpp context of `cells` cells: its KV cache (kv_width bytes
        a value: 2 for f16, 4 for f32) and its attention scratch for a
        micro-batch of `micro` tokens."""
        micro = min(micro, cells)
        return cells * (self.kv_bytes * kv_width // 2 + micro * (4 * self.heads + 4))


def embedding_window(cost: CellCost, window: int) -> int:
    """The longest input the embedding reader takes. It reads a whole input in
    one micro-batch (mean pooling needs every position in one pass), so its
    scratch grows with the square of that length: the window, or the longest
    multiple of STEP whose context stays within EMBED_BYTES (an input past it
    is refused with context_length_exceeded instead of exhausting memory)."""
    cells = window
    while cells > STEP and cost.context_bytes(cells, kv_width=4, micro=cells) > EMBED_BYTES:
        cells = (cells - 1) // STEP * STEP
    return cells


@dataclass(frozen=True)
class KvPlan:
    window: int  # cells one sequence may use: the context window requests get
    slots: int  # sequences decoded together
    trained: int  # the file's trained context
    kv_bytes: int  # the shared generation context's KV cache, bytes
    engine_bytes: int  # every context the engine may hold at this window, bytes
    budget: int  # bytes the engine may use for them
    reason: str  # why this window and slot count
    refusal: str = ""  # non-empty: the load is refused with insufficient_memory, saying this
    embed_window: int = 0  # the longest embedding input (`embedding_window`)

    @property
    def cells(self) -> int:
        return self.window * self.slots

    def describe(self) -> str:
        return (f"GGUF KV cache: {self.slots} slots × {self.window} cells = "
                f"{self.kv_bytes / MIB:.1f} MiB (trained {self.trained}; {self.reason}; "
                f"at most {self.engine_bytes / MIB:.1f} MiB with lanes, scoring and "
                f"attention scratch, of {self.budget / MIB:.0f} MiB the engine may use; "
                f"embedding inputs up to {self.embed_window} tokens)")


def engine_bytes(cost: CellCost, window: int, slots: int, kv_width: int = 2) -> int:
    """The most the engine may hold at `window`: the shared context, one lane
    per slot (each with `kv_width`-byte values: MILLM_GGUF_KV_TYPE), and the
    scoring context (f32 cells). (The embedding context, made on the first
    embeddings request, is bounded by EMBED_BYTES instead.)"""
    return (cost.context_bytes(window * slots, kv_width)
            + slots * cost.context_bytes(window, kv_width)
            + cost.context_bytes(window, kv_width=4))


def plan(cost: CellCost, trained: int, slots: int, budget: int, context: int = 0,
         kv_width: int = 2) -> KvPlan:
    """The window and slots for a file (module docstring: the rule), its
    generation cells holding `kv_width`-byte values (2: f16, 4: f32)."""
    trained = trained or 2048  # a file that does not say: llama.cpp's old default

    def made(window: int, count: int, reason: str, refusal: str = "") -> KvPlan:
        return KvPlan(window, count, trained, window * count * cost.kv_bytes * kv_width // 2,
                      engine_bytes(cost, window, count, kv_width), budget, reason, refusal,
                      embedding_window(cost, window))

    def fits(window: int, count: int) -> bool:
        return engine_bytes(cost, window, count, kv_width) <= budget

    if context:
        window = min(context, trained)
        if fits(window, slots):
            return made(window, slots, "MILLM_GGUF_CONTEXT")
        return made(window, slots, "MILLM_GGUF_CONTEXT", refusal=(
            f"MILLM_GGUF_CONTEXT={context} with {slots} slots (MILLM_GGUF_SLOTS, at most "
            f"MILLM_MAX_BATCH) needs about "
            f"{engine_bytes(cost, window, slots, kv_width) / MIB:.0f} MiB of KV cache and "
            "attention "
            f"buffers, more than the {budget / MIB:.0f} MiB it may use; set a shorter "
            "context, fewer slots, or leave MILLM_GGUF_CONTEXT unset to size it to memory"))
    if fits(trained, slots):
        return made(trained, slots, "the trained window fits")
    floor = min(FLOOR, trained)
    if fits(floor, slots):
        low, high = floor, trained  # fits(low) holds, fits(high) does not
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if fits(middle, slots) else (low, middle)
        window = max(floor, low // STEP * STEP)
        return made(window, slots, "limited by memory")
    count = slots
    while count > 1 and not fits(floor, count):
        count -= 1
    if fits(floor, count):
        return made(floor, count, f"limited by memory: {count} of {slots} slots at the "
                                  f"{floor}-cell floor")
    return made(floor, 1, "limited by memory", refusal=(
        f"even one slot of {floor} cells needs about "
        f"{engine_bytes(cost, floor, 1, kv_width) / MIB:.0f} "
        f"MiB of KV cache and attention buffers, more than the {budget / MIB:.0f} MiB it "
        "may use"))
