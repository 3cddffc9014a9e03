"""The running batch of the transformers engine: rows, sampling and prefill.

A *row* is one choice being generated; it samples with its own options and
generator and turns tokens into deltas. A prefill (prefill.py) computes the
prompts of its groups, a chunk per turn, and samples each row's first token;
the rows then join a lane (lane.py), where they are decoded together.

A row whose own bookkeeping fails (its detokenizer, stop matcher or grammar
matcher) is marked failed and leaves; the other rows of the step go on
(scheduler.py fails that row's request alone).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
from dataclasses import dataclass, field

import torch

from service.engines import bitmask as bitmask_rows
from service.engines import faults
from service.engines.scores import TokenTable
from service.engines.transformers import reading
from service.engines.transformers.steering import (
    ActivationRecorder,
    ForwardSteering,
    SteeringRuntime,
)
from service.formats.base import CLOSED
from service.generation.job import ChoiceDelta, FinishReason, GenerationJob
from service.generation.reasoning import CloseWatch
from service.requests.generation import PromptGroup
from service.sampling import (
    SamplingOptions,
    UniformDraws,
    add_logit_bias,
    apply_penalties,
    choose_tokens,
)
from service.steering.conditions import RowConditions
from service.steering.plan import SteeringPlan, condition_readers
from service.steering.probes import ProbeReader
from service.text_output import ByteLevelDetokenizer, IncrementalDetokenizer, StopMatcher

log = logging.getLogger(__name__)


@dataclass
class ModelContext:
    """What rows and lanes need from the loaded model."""

    model: object
    decoder: object  # the model thread's own tokenizer, for decoding
    device: torch.device
    vocab_width: int  # logits columns (may exceed the tokenizer's vocabulary)
    vocab_size: int  # ids the tokenizer can decode
    eos_ids: torch.Tensor
    banned_ids: torch.Tensor  # special tokens generation must never emit
    eos_set: frozenset[int] = field(default_factory=frozenset)
    # Bytes of every token when the tokenizer is byte-level (fast detokenizing).
    token_bytes: list[bytes] | None = None
    # Tokens holding a control character (U+0000-U+001F): never part of a
    # compact JSON document, though xgrammar's bounded-string rules let some
    # through, so constrained rows mask them too.
    control_ids: torch.Tensor | None = None
    # xgrammar's batch filler (one thread: the model thread has its cores already).
    batch_matcher: object = None
    # The step's grammar bitmask rows, kept for the widest batch so far (model
    # thread only): allocating a tensor each step cost more than its fill.
    grammar_bitmask: torch.Tensor | None = None
    # The steering hooks; rows hand them their own deltas for each forward pass.
    steering: SteeringRuntime | None = None
    # False when a layer keeps a recurrent state (kv.py): no prefix cache.
    reuses_prefixes: bool = True
    # Decode steps, and a lone prompt after cached columns, hand attention its
    # mask ready-made (decode_mask.py).
    ready_masks: bool = False
    # Passes of several query columns take GQA's K/V heads in place rather
    # than copied (grouped_query.py).
    grouped_prompts: bool = False

    @functools.cached_property
    def tokens(self) -> TokenTable:
        return TokenTable(self.vocab_size, self.token_bytes, self.decoder)


@dataclass
class GroupProgress:
    """Book-keeping of one prompt group while its rows run."""

    job: GenerationJob
    group: PromptGroup
    rows_left: int
    completion_tokens: int = 0
    cached_tokens: int = 0
    # This request's own steering (steering/plan.py; steering.build makes
    # the hooks' tensors of it).
    plan: SteeringPlan | None = None
    # Its scored conditions as read at the prompt's last position (index ->
    # holds), which its rows start from; and the readers that fill it.
    prompt_reads: dict = field(default_factory=dict)
    prompt_readers: tuple = ()
    recorder: ActivationRecorder | None = None
    # Monitoring's probes, when the request's model is monitored (one per job).
    monitor: ProbeReader | None = None
    # A later part of a group split by the scheduler: its prompt was counted
    # (and any cache hit reported) with the first part.
    continuation: bool = False

    def __post_init__(self):
        spec = self.job.spec
        self.plan = spec.steering
        self.prompt_readers = condition_readers(self.plan, self.prompt_reads.__setitem__)
        if spec.activations is not None:
            self.recorder = ActivationRecorder(spec.activations, len(self.group.prompt_ids))
        self.monitor = self.job.monitor

    @property
    def steered_or_reading(self) -> bool:
        """Steered, recording or monitored: its KV and activations are its
        own (a monitor reads every prompt position), so it neither reads nor
        feeds the prefix cache."""
        return self.plan is not None or self.recorder is not None or self.monitor is not None


_row_serials = itertools.count()


class Row:
    def __init__(self, ctx: ModelContext, progress: GroupProgress, offset: int):
        # Never reused (unlike id()): keys the lane's stacked steering deltas.
        self.serial = next(_row_serials)
        group, spec = progress.group, progress.job.spec
        self.progress = progress
        self.job = progress.job
        self.index = group.first_index + offset
        self.options: SamplingOptions = spec.options
        self.ignore_eos = spec.ignore_eos
        self.max_tokens = group.max_tokens
        self.draws = UniformDraws(
            torch.Generator(device=ctx.device).manual_seed(group.row_seeds[offset]))
        self.detokenizer = (
            ByteLevelDetokenizer(ctx.token_bytes)
            if ctx.token_bytes is not None
            else IncrementalDetokenizer(ctx.decoder, list(group.prompt_ids))
        )
        self.stopper = StopMatcher(spec.stop)
        # response_format: this row's own place in the grammar.
        self.matcher = None
        if spec.grammar is not None:
            import xgrammar

            self.matcher = xgrammar.GrammarMatcher(spec.grammar)
        # A JSON document holds no raw control character; a tool call's
        # syntax has newlines, `auto` lets the model write free text, and a
        # pattern or grammar says itself which characters it takes. Reasoning
        # before a JSON document is free text too: the ban starts once its
        # block closes.
        self.bans_controls = spec.constraint is not None and spec.constraint.is_json
        self.reasoning_watch = None
        if self.bans_controls and spec.reasoning is not None and spec.reasoning.mode != CLOSED:
            self.bans_controls = False
            self.reasoning_watch = CloseWatch(spec.reasoning.syntax.close)
        self.logprobs = spec.logprobs  # alternatives per token; None: not asked for
        # Its logits depend on its token counts: only then are they kept (sample).
        self.penalised = self.options.penalised
        self.generated = 0
        self.last_token = -1
        # Its steering's conditions, evaluated on what it generates.
        plan = progress.plan
        self.conditions = (RowConditions(plan.conditions, plan.aborts)
                           if plan is not None and plan.conditional else None)
        self.condition_readers = ()
        if self.conditions is not None:
            self.condition_readers = condition_readers(plan, self.conditions.read)
            for index, holds in progress.prompt_reads.items():
                self.conditions.read(index, holds)
        self.failed = False  # its bookkeeping raised: it left, and its request fails

    def _final_text(self) -> str:
        text, hit = self.stopper.push(self.detokenizer.flush())
        return text if hit else text + self.stopper.flush()

    def accept(self, token: int, eos: frozenset[int], score=None) -> tuple[ChoiceDelta, bool]:
        """Take the sampled token; return its delta and whether the row is done.
        `score` is its log-probability. The end-of-sequence token is counted in
        completion_tokens, so it has a log-probability entry too, with empty
        text (it adds none): the entries and the count always agree."""
        self.generated += 1
        # A steering abort_when that held where this token was sampled ends
        # the row before it, as an end-of-sequence token would.
        aborted = self.conditions is not None and self.conditions.aborted()
        if score is not None and (token in eos or aborted):
            score = dataclasses.replace(score, token=dataclasses.replace(
                score.token, text="", bytes=b""))
        scores = (score,) if score is not None else ()
        self.progress.completion_tokens += 1
        if self.matcher is not None and not self.matcher.accept_token(token):
            # The mask allowed only tokens the grammar accepts; this is a bug,
            # and the document check after the row ends will refuse the output.
            log.error("grammar refused a token its own mask allowed")
        if aborted:
            return (ChoiceDelta(self.index, self._final_text(), (token,),
                                FinishReason.CONTENT_FILTER, scores), True)
        if token in eos:
            # The end's flush can still complete a held-back stop sequence.
            text = self._final_text()
            return (ChoiceDelta(self.index, text, (token,), FinishReason.STOP, scores,
                                stop_sequence=self.stopper.matched), True)
        piece = self.detokenizer.push(token)
        if self.conditions is not None:
            self.conditions.generated(piece)
        if self.reasoning_watch is not None and self.reasoning_watch.push(piece):
            self.bans_controls, self.reasoning_watch = True, None
        text, hit = self.stopper.push(piece)
        if hit:
            return ChoiceDelta(self.index, text, (token,), FinishReason.STOP, scores,
                               stop_sequence=self.stopper.matched), True
        if self.generated >= self.max_tokens:
            text += self._final_text()
            return ChoiceDelta(self.index, text, (token,), FinishReason.LENGTH, scores), True
        self.last_token = token
        return ChoiceDelta(self.index, text, (token,), None, scores), False


def sample(
    ctx: ModelContext,
    rows: list[Row],
    logits: torch.Tensor,
    counts: torch.Tensor,
    seen: torch.Tensor,
) -> list[tuple[Row, ChoiceDelta, bool]]:
    """Choose each row's next token with its own options and generator."""
    options = [r.options for r in rows]
    if counts is not None:  # some row has a penalty (Row.penalised)
        logits = apply_penalties(logits, options, counts, seen)
    logits[:, ctx.banned_ids] = float("-inf")
    ignoring = [i for i, row in enumerate(rows) if row.ignore_eos]
    if len(ignoring) == len(rows):
        logits[:, ctx.eos_ids] = float("-inf")
    elif ignoring:
        index = torch.tensor(ignoring, dtype=torch.long, device=logits.device)
        logits[index.unsqueeze(1), ctx.eos_ids.unsqueeze(0)] = float("-inf")
    constrained = [i for i, row in enumerate(rows) if row.matcher is not None]
    if constrained:
        _apply_grammar_masks(ctx, rows, logits, constrained)
    # logit_bias moves the choice, not the reported distribution (vLLM's
    # default raw log-probabilities leave it out too); a masked token stays
    # masked whatever its bias.
    tokens = choose_tokens(add_logit_bias(logits, options), options,
                           [r.draws for r in rows])
    scores = [None] * len(rows)
    wanting = [i for i, row in enumerate(rows) if row.logprobs is not None]
    if wanting:
        found = reading.generation_logprobs(
            ctx, logits[wanting], [rows[i].options.temperature for i in wanting],
            [tokens[i] for i in wanting], [rows[i].logprobs for i in wanting])
        for i, score in zip(wanting, found, strict=True):
            scores[i] = score
    results = []
    counted: list[int] = []
    for i, (row, token) in enumerate(zip(rows, tokens, strict=True)):
        try:
            faults.hit("row")
            delta, done = row.accept(token, ctx.eos_set, scores[i])
        except Exception:
            log.exception("a row failed to take its token; its request fails alone")
            row.failed = True
            delta, done = ChoiceDelta(row.index, "", ()), True
        if not done and row.penalised:
            counted.append(i)
        results.append((row, delta, done))
    if counted:  # only a penalised row's counts are ever read
        index = torch.tensor(counted, dtype=torch.long, device=counts.device)
        chosen = torch.tensor([tokens[i] for i in counted], dtype=torch.long,
                              device=counts.device)
        counts[index, chosen] += 1
        seen[index, chosen] = True
    return results


def penalty_state(ctx: ModelContext, rows: list[Row], prompts: list) -> tuple:
    """(counts, seen) for new rows, `prompts[r]` row r's prompt ids: counts
    [rows, vocab] of each generated token, seen [rows, vocab] marking the
    prompt's and generated tokens. (None, None) when no row has a penalty:
    nothing reads them then, and a lane neither builds nor copies them."""
    if not any(row.penalised for row in rows):
        return None, None
    device = ctx.device
    counts = torch.zeros((len(rows), ctx.vocab_width), dtype=torch.float32, device=device)
    seen = torch.zeros((len(rows), ctx.vocab_width), dtype=torch.bool, device=device)
    for r, prompt in enumerate(prompts):
        seen[r, torch.tensor(prompt, dtype=torch.long, device=device)] = True
    return counts, seen


def join_penalty_state(ctx: ModelContext, old: tuple, old_rows: int, new: tuple,
                       new_rows: int) -> tuple:
    """The (counts, seen) of a lane's rows followed by new ones; zeros stand
    in for a side that tracked nothing (none of its rows has a penalty)."""
    if old[0] is None and new[0] is None:
        return None, None

    def filled(state, rows):
        if state[0] is not None:
            return state
        return (torch.zeros((rows, ctx.vocab_width), dtype=torch.float32, device=ctx.device),
                torch.zeros((rows, ctx.vocab_width), dtype=torch.bool, device=ctx.device))

    old, new = filled(old, old_rows), filled(new, new_rows)
    return torch.cat([old[0], new[0]]), torch.cat([old[1], new[1]])


def _apply_grammar_masks(ctx: ModelContext, rows, logits: torch.Tensor, constrained) -> None:
    """-inf on every token that cannot continue each constrained row's document
    (special tokens other than end-of-sequence are banned already)."""
    import xgrammar

    bitmask = ctx.grammar_bitmask
    if bitmask is None or bitmask.shape[0] < len(rows):
        bitmask = ctx.grammar_bitmask = xgrammar.allocate_token_bitmask(len(rows),
                                                                        ctx.vocab_width)
    # (Only the constrained rows' bits are filled and read.)
    bitmask = bitmask[:len(rows)]
    # One call for every constrained row: the per-row Python call is what a
    # small model's step time notices.
    ctx.batch_matcher.batch_fill_next_token_bitmask(
        [rows[i].matcher for i in constrained], bitmask, indices=constrained)
    bitmask_rows.apply(logits, bitmask, indices=constrained)
    banning = [i for i in constrained if rows[i].bans_controls]
    if banning and ctx.control_ids is not None and len(ctx.control_ids):
        rows_index = torch.tensor(banning, dtype=torch.long, device=logits.device)
        logits[rows_index.unsqueeze(1), ctx.control_ids.unsqueeze(0)] = float("-inf")


@dataclass
class Prefilled:
    """Groups after their prefill: the rows still running and their left-padded KV."""

    rows: list[Row]
    cache: object
    mask: torch.Tensor  # [rows, columns], 1 = real token
    counts: torch.Tensor | None  # None: no row has a penalty (penalty_state)
    seen: torch.Tensor | None
    results: list[tuple[Row, ChoiceDelta, bool]]


def _steered(ctx: ModelContext, steering: ForwardSteering | None):
    """The hooks see `steering` for one forward pass (nothing to do without it)."""
    return ctx.steering.applying(steering) if steering is not None else contextlib.nullcontext()
