"""The GGUF engine's rows and the sequences (slots) they run in.

A slot is one llama.cpp sequence and the tokens its KV cells hold, in order;
a row is one prompt group while it runs in a slot. `Slots` are the shared
context's sequences: which row runs in each, which free one a new prompt
takes (the one holding the longest prefix of it: the prefix cache), and
whether the cells the rows may still write fit the context. step_batch fills
a llama_batch with rows' next tokens; take_token turns a sampled token into
the row's text delta. The runner (engines/gguf/batch.py) uses them for the
shared context and for the seeded lanes (engines/gguf/lanes.py) alike.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from service.generation.job import ChoiceDelta, FinishReason, GenerationJob
from service.requests.generation import PromptGroup
from service.text_output import ByteLevelDetokenizer, StopMatcher


@dataclass
class Slot:
    seq: int
    tokens: list[int] = field(default_factory=list)  # what its KV cells hold, in order
    row: Row | None = None
    used: int = 0  # step of its last use, to evict the least recent
    # The steering plan its cells were computed under (steering/plan.py
    # plan_key; None: unsteered): a prefix is reused only under the same one.
    key: tuple | None = None
    # Monitoring's probe scores of its positions, per probe layer of the
    # monitor spec its key names (engines/gguf/steering.py keep_scores).
    scores: dict = field(default_factory=dict)


@dataclass
class Row:
    """One choice of a prompt group while it runs (n > 1 runs as parts of one
    choice each: engines/gguf/forks.py)."""

    job: GenerationJob
    group: PromptGroup
    slot: Slot
    sampler: object
    mask: object  # GrammarMask or None
    pending: list[int]  # tokens still to evaluate (prompt, then the last sampled one)
    cached: int
    detokenizer: ByteLevelDetokenizer
    stopper: StopMatcher
    generated: int = 0
    batch_index: int = -1  # where its logits are in this step's batch; -1: none
    steer: object = None  # engines/gguf/steering.py RowSteering, when steered or reading
    # Its tokens in this step's batch: first index, count, first position, ids.
    batch_span: tuple[int, int, int, list[int]] = (0, 0, 0, [])
    scorer: object = None  # engines/gguf/logprobs.py TokenScorer, when logprobs were asked for

    @property
    def need(self) -> int:
        """Cells this row may still fill."""
        return len(self.pending) + self.group.max_tokens - self.generated


# Tokens two cached prompts must share at their start to count as one prefix.
REDUNDANT_HEAD = 32


def common_prefix(a: list[int], b: tuple[int, ...], limit: int) -> int:
    same = 0
    while same < limit and a[same] == b[same]:
        same += 1
    return same


class Slots:
    """The sequences of the batch context, and which row runs in each."""

    def __init__(self, count: int, cells: int, whole_only: bool = False,
                 keep_prefixes: bool = True):
        self.slots = [Slot(i) for i in range(count)]
        self.cells = cells
        self.clock = 0
        # False (MILLM_PREFIX_CACHE_TOKENS=0): no prompt reuses a slot's cells,
        # and a row's cells are dropped when it leaves.
        self.keep_prefixes = keep_prefixes
        # A recurrent (Mamba, RWKV) or hybrid model's state cannot be cut back
        # to a position (llama_memory_seq_rm refuses): a slot is reused only
        # when the prompt continues everything it holds.
        self.whole_only = whole_only

    @property
    def rows(self) -> list[Row]:
        return [s.row for s in self.slots if s.row is not None]

    def held(self) -> int:
        return sum(len(s.tokens) for s in self.slots)

    def idle_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.slots if s.row is None)

    def pick(self, prompt: tuple[int, ...], key: tuple | None = None,
             fresh: bool = False) -> tuple[Slot, int] | None:
        """The free slot to run `prompt` in, and the tokens it can keep (at
        least one prompt token is evaluated again, so its logits are fresh);
        None while every slot is busy. Only cells computed under the same
        steering `key` are kept; a `fresh` prompt (one whose every position
        is read) keeps none."""
        free = [s for s in self.slots if s.row is None]
        if not free:
            return None

        def keeps(s: Slot) -> int:
            if fresh or s.key != key or not self.keep_prefixes:
                return 0
            same = common_prefix(s.tokens, prompt, min(len(s.tokens), len(prompt) - 1))
            return 0 if self.whole_only and same < len(s.tokens) else same

        def redundant(s: Slot) -> bool:
            """Another slot holds the same start under the same plan (a shared
            system prompt cached twice): evicting this one loses nothing."""
            head = min(len(s.tokens), REDUNDANT_HEAD)
            return any(o is not s and o.key == s.key and len(o.tokens) >= head
                       and o.tokens[:head] == s.tokens[:head] for o in self.slots)

        scored = [(keeps(s), s) for s in free]
        most = max(kept for kept, _ in scored)
        if most > 0:
            best = max((s for kept, s in scored if kept == most), key=lambda s: -s.used)
            return best, most
        # Nothing to keep: take an empty slot, else a redundant one, else the
        # least recently used, so the prefixes other plans may reuse survive.
        best = max(free, key=lambda s: (not s.tokens, redundant(s), -s.used))
        return best, 0

    def fits(self, need: int, keep: Slot, same: int) -> bool:
        """Whether a row keeping `same` cells of `keep` and filling `need` more
        fits beside what every other slot holds and the running rows may
        still write."""
        held = sum(len(s.tokens) for s in self.slots if s is not keep) + same
        growth = sum(s.row.need for s in self.slots if s.row is not None)
        return held + growth + need <= self.cells


def step_batch(rows: list[Row], capacity: int, batch) -> list[Row]:
    """Fill `batch` (a llama_batch) with each row's next tokens, prompt chunks
    cut to fit `capacity`; returns the rows whose logits this step produces."""
    batch.n_tokens = 0
    sampling = []
    room = capacity
    for row in rows:
        if room == 0:
            row.batch_index = -1
            row.batch_span = (0, 0, 0, [])
            continue
        chunk = row.pending[:room]
        start = len(row.slot.tokens)
        row.batch_span = (batch.n_tokens, len(chunk), start, chunk)
        for offset, token in enumerate(chunk):
            j = batch.n_tokens + offset
            batch.token[j] = token
            batch.pos[j] = start + offset
            batch.n_seq_id[j] = 1
            batch.seq_id[j][0] = row.slot.seq
            batch.logits[j] = False
        batch.n_tokens += len(chunk)
        room -= len(chunk)
        row.slot.tokens.extend(chunk)
        del row.pending[:len(chunk)]
        if row.pending:
            row.batch_index = -1  # still reading its prompt
        else:
            row.batch_index = batch.n_tokens - 1
            batch.logits[row.batch_index] = True
            sampling.append(row)
    return sampling


def take_token(row: Row, token: int, eog: frozenset[int], ignore_eos: bool, score=None
               ) -> tuple[ChoiceDelta, bool]:
    """The sampled token's delta, and whether the row is done. `score` is
    its log-probability (engines.scores.TokenScore) when asked for; an end
    token or a token an abort stops before has one too, with no text (it
    adds none), so the entries and completion_tokens agree, as on the
    transformers engine."""
    row.generated += 1
    index = row.group.first_index
    conditions = row.steer.conditions if row.steer is not None else None
    aborted = conditions is not None and conditions.aborted()
    if score is not None and (aborted or (token in eog and not ignore_eos)):
        score = dataclasses.replace(score, token=dataclasses.replace(
            score.token, text="", bytes=b""))
    scores = (score,) if score is not None else ()
    if aborted:
        # A steering abort_when held where this token was sampled: the row
        # ends before it, as at an end-of-generation token.
        text, hit = row.stopper.push(row.detokenizer.flush())
        text = text if hit else text + row.stopper.flush()
        return ChoiceDelta(index, text, (token,), FinishReason.CONTENT_FILTER, scores), True
    if token in eog and not ignore_eos:
        text, hit = row.stopper.push(row.detokenizer.flush())
        text = text if hit else text + row.stopper.flush()
        return ChoiceDelta(index, text, (token,), FinishReason.STOP, scores,
                           stop_sequence=row.stopper.matched), True
    piece = row.detokenizer.push(token)
    if conditions is not None:
        conditions.generated(piece)
    text, hit = row.stopper.push(piece)
    if hit:
        return ChoiceDelta(index, text, (token,), FinishReason.STOP, scores,
                           stop_sequence=row.stopper.matched), True
    if row.generated >= row.group.max_tokens:
        tail, hit = row.stopper.push(row.detokenizer.flush())
        text += tail if hit else tail + row.stopper.flush()
        return ChoiceDelta(index, text, (token,), FinishReason.LENGTH, scores), True
    row.pending.append(token)
    return ChoiceDelta(index, text, (token,), None, scores), False
