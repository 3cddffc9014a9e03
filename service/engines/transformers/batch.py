"""The running batch of the transformers engine: rows, prefill, and lanes.

A *row* is one choice being generated. A *lane* is a set of rows decoded
together, one forward pass per step, over one KV cache padded on the left so
that rows of different lengths line up: row r's real tokens occupy the last
`length_r` columns, an attention mask hides the padding, and explicit position
ids give each row its own positions. A row joins a lane after its own prefill
(left-padding whichever side is shorter) and leaves it as soon as it finishes
or its caller goes away; columns that no remaining row uses are trimmed.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
from dataclasses import dataclass, field

import torch

from service.engines.scores import TokenTable
from service.engines.transformers import kv, reading
from service.generation.job import ChoiceDelta, FinishReason, GenerationJob
from service.requests.generation import PromptGroup
from service.sampling import SamplingOptions, apply_penalties, choose_tokens
from service.steering.runtime import (
    ActivationRecorder,
    Capture,
    ForwardSteering,
    SteeringRuntime,
    stack_deltas,
)
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
    # The steering hooks; rows hand them their own deltas for each forward pass.
    steering: SteeringRuntime | None = None
    # False when a layer keeps a recurrent state (kv.py): no prefix cache.
    reuses_prefixes: bool = True

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
    # This request's own steering (layer -> delta), made on the model thread.
    deltas: dict | None = None
    recorder: ActivationRecorder | None = None

    def __post_init__(self):
        spec = self.job.spec
        if spec.steering is not None:
            self.deltas = spec.steering.deltas()
        if spec.activations is not None:
            self.recorder = ActivationRecorder(spec.activations, len(self.group.prompt_ids))

    @property
    def steered_or_reading(self) -> bool:
        """Steered or recording: its KV and activations are its own, so it
        neither reads nor feeds the prefix cache."""
        return self.deltas is not None or self.recorder is not None


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
        self.generator = torch.Generator(device=ctx.device).manual_seed(group.row_seeds[offset])
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
        # syntax has newlines, and `auto` lets the model write free text.
        self.bans_controls = spec.constraint is not None
        self.logprobs = spec.logprobs  # alternatives per token; None: not asked for
        self.generated = 0
        self.last_token = -1

    def _final_text(self) -> str:
        text, hit = self.stopper.push(self.detokenizer.flush())
        return text if hit else text + self.stopper.flush()

    def accept(self, token: int, eos: frozenset[int], score=None) -> tuple[ChoiceDelta, bool]:
        """Take the sampled token; return its delta and whether the row is done.
        `score` (its log-probability) is reported unless the token is the
        end-of-sequence one, which adds no text."""
        self.generated += 1
        scores = (score,) if score is not None and token not in eos else ()
        self.progress.completion_tokens += 1
        if self.matcher is not None and not self.matcher.accept_token(token):
            # The mask allowed only tokens the grammar accepts; this is a bug,
            # and the document check after the row ends will refuse the output.
            log.error("grammar refused a token its own mask allowed")
        if token in eos:
            return ChoiceDelta(self.index, self._final_text(), (token,), FinishReason.STOP), True
        text, hit = self.stopper.push(self.detokenizer.push(token))
        if hit:
            return ChoiceDelta(self.index, text, (token,), FinishReason.STOP, scores), True
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
    logits = apply_penalties(logits, options, counts, seen)
    logits[:, ctx.banned_ids] = float("-inf")
    for i, row in enumerate(rows):
        if row.ignore_eos:
            logits[i, ctx.eos_ids] = float("-inf")
    constrained = [i for i, row in enumerate(rows) if row.matcher is not None]
    if constrained:
        _apply_grammar_masks(ctx, rows, logits, constrained)
    tokens = choose_tokens(logits, options, [r.generator for r in rows])
    scores = [None] * len(rows)
    wanting = [i for i, row in enumerate(rows) if row.logprobs is not None]
    if wanting:
        found = reading.generation_logprobs(
            ctx, logits[wanting], [rows[i].options.temperature for i in wanting],
            [tokens[i] for i in wanting], [rows[i].logprobs for i in wanting])
        for i, score in zip(wanting, found, strict=True):
            scores[i] = score
    results = []
    for i, (row, token) in enumerate(zip(rows, tokens, strict=True)):
        delta, done = row.accept(token, ctx.eos_set, scores[i])
        if not done:
            counts[i, token] += 1
            seen[i, token] = True
        results.append((row, delta, done))
    return results


def _apply_grammar_masks(ctx: ModelContext, rows, logits: torch.Tensor, constrained) -> None:
    """-inf on every token that cannot continue each constrained row's document
    (special tokens other than end-of-sequence are banned already)."""
    import xgrammar

    bitmask = xgrammar.allocate_token_bitmask(len(rows), ctx.vocab_width)
    # One call for every constrained row: the per-row Python call is what a
    # small model's step time notices.
    ctx.batch_matcher.batch_fill_next_token_bitmask(
        [rows[i].matcher for i in constrained], bitmask, indices=constrained)
    xgrammar.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=constrained)
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
    counts: torch.Tensor
    seen: torch.Tensor
    results: list[tuple[Row, ChoiceDelta, bool]]


def prefill(
    ctx: ModelContext, progresses: list[GroupProgress], prefix_cache, read_cache: bool
) -> Prefilled:
    """Compute the prompts of several groups in one forward pass (left-padded),
    then sample the first token of each of their rows.

    A lone group may start from cached prefix blocks (`read_cache`); groups
    prefilled together never do, so they share one starting column.
    """
    device = ctx.device
    config = ctx.model.config
    prompts = [p.group.prompt_ids for p in progresses]
    cached, layers = (0, [])
    if (read_cache and ctx.reuses_prefixes and len(progresses) == 1
            and not progresses[0].steered_or_reading):
        cached, layers = prefix_cache.lookup(prompts[0])
        progresses[0].cached_tokens = cached
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    positions = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    for i, prompt in enumerate(prompts):
        start = width - len(prompt)
        ids[i, start:] = torch.tensor(prompt, dtype=torch.long, device=device)
        mask[i, start:] = 1
        positions[i, start:] = torch.arange(len(prompt), device=device)
    cache = kv.from_prefix(config, layers) if cached else kv.new_cache(config)
    steering = _prefill_steering(ctx, progresses, width, ids)
    with _steered(ctx, steering):
        out = ctx.model(
            input_ids=ids[:, cached:],
            attention_mask=mask if len(prompts) > 1 else None,
            position_ids=positions[:, cached:],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
    if ctx.reuses_prefixes:
        computed = kv.attention_kv(cache)
        for i, prompt in enumerate(prompts):
            if not progresses[i].steered_or_reading:
                prefix_cache.store(prompt, computed, row=i, start=width - len(prompt))

    # One row per choice: group i's KV is repeated for its n rows.
    owner = [i for i, p in enumerate(progresses) for _ in range(p.group.n)]
    rows = [Row(ctx, p, j) for p in progresses for j in range(p.group.n)]
    index = torch.tensor(owner, dtype=torch.long, device=device)
    if owner != list(range(len(prompts))):
        kv.select_rows(cache, index)
    logits = out.logits[:, -1, :].float()[index]
    mask = mask[index]
    counts = torch.zeros((len(rows), ctx.vocab_width), dtype=torch.float32, device=device)
    seen = torch.zeros((len(rows), ctx.vocab_width), dtype=torch.bool, device=device)
    for r, i in enumerate(owner):
        seen[r, torch.tensor(prompts[i], dtype=torch.long, device=device)] = True
    results = sample(ctx, rows, logits, counts, seen)
    keep = [r for r, (_, _, done) in enumerate(results) if not done]
    if len(keep) < len(rows) and keep:
        index = torch.tensor(keep, dtype=torch.long, device=device)
        kv.select_rows(cache, index)
        mask, counts, seen = mask[index], counts[index], seen[index]
    return Prefilled([rows[r] for r in keep], cache, mask, counts, seen, results)


def _steered(ctx: ModelContext, steering: ForwardSteering | None):
    """The hooks see `steering` for one forward pass (nothing to do without it)."""
    return ctx.steering.applying(steering) if steering is not None else contextlib.nullcontext()


def _prefill_steering(ctx: ModelContext, progresses: list[GroupProgress], width: int,
                      ids: torch.Tensor) -> ForwardSteering | None:
    """Each group's own deltas and activation captures for the prefill pass
    (one batch row per group; its prompt sits in the last columns)."""
    if ctx.steering is None or not any(p.steered_or_reading for p in progresses):
        return None
    deltas = stack_deltas([p.deltas for p in progresses], ctx.steering)
    captures: dict[int, list[Capture]] = {}
    for i, p in enumerate(progresses):
        if p.recorder is not None:
            prompt = list(p.group.prompt_ids)
            captures.setdefault(p.recorder.spec.layer, []).append(
                Capture(i, width - len(prompt), list(range(len(prompt))), prompt, p.recorder))
    return ForwardSteering(deltas, captures)


class Lane:
    """Rows decoded together over one left-padded KV cache."""

    def __init__(self, ctx: ModelContext):
        self.ctx = ctx
        self.rows: list[Row] = []
        self.cache = None
        self.mask: torch.Tensor | None = None  # [rows, columns], 1 = real token
        self.positions: torch.Tensor | None = None  # [rows] next position id
        self.counts: torch.Tensor | None = None
        self.seen: torch.Tensor | None = None
        self._stacked: dict = {}
        self._stacked_for: tuple = ()

    @property
    def kv_columns(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]

    def kv_tokens(self) -> tuple[int, int]:
        """(token slots held, of which padding)."""
        if self.mask is None:
            return 0, 0
        held = self.mask.numel()
        return held, held - int(self.mask.sum())

    def add(self, new: Prefilled) -> None:
        if not new.rows:
            return
        positions = new.mask.sum(dim=1)
        if not self.rows:
            self.rows, self.cache, self.mask = list(new.rows), new.cache, new.mask
            self.positions, self.counts, self.seen = positions, new.counts, new.seen
            return
        width = max(self.kv_columns, new.mask.shape[1])
        grow_old, grow_new = width - self.kv_columns, width - new.mask.shape[1]
        kv.append_rows(self.cache, new.cache, grow_old, grow_new)
        self.mask = torch.cat([kv.pad_left(self.mask, grow_old, 1),
                               kv.pad_left(new.mask, grow_new, 1)])
        self.positions = torch.cat([self.positions, positions])
        self.counts = torch.cat([self.counts, new.counts])
        self.seen = torch.cat([self.seen, new.seen])
        self.rows.extend(new.rows)

    def keep(self, keep: list[int]) -> None:
        """Keep only these rows; drop everything the others held."""
        if len(keep) == len(self.rows):
            return
        if not keep:
            self.rows, self.cache, self.mask = [], None, None
            self.positions = self.counts = self.seen = None
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.ctx.device)
        kv.select_rows(self.cache, index)
        self.mask, self.positions = self.mask[index], self.positions[index]
        self.counts, self.seen = self.counts[index], self.seen[index]
        self.rows = [self.rows[i] for i in keep]
        # Columns that only departed rows used are padding for everyone left.
        first = int(torch.nonzero(self.mask.any(dim=0))[0])
        if first > 0:
            self.mask = self.mask[:, first:]
            kv.trim_columns(self.cache, first)

    def _steering(self) -> ForwardSteering | None:
        """The rows' own deltas (stacked once per set of rows) and captures."""
        ctx = self.ctx
        if ctx.steering is None or not any(r.progress.steered_or_reading for r in self.rows):
            return None
        key = tuple(r.serial for r in self.rows)
        if self._stacked_for != key:
            self._stacked = stack_deltas([r.progress.deltas for r in self.rows],
                                         ctx.steering)
            self._stacked_for = key
        captures: dict[int, list[Capture]] = {}
        recording = [i for i, row in enumerate(self.rows) if row.progress.recorder is not None]
        if recording:
            positions = self.positions.tolist()  # one device sync, only when reading
            for i in recording:
                row = self.rows[i]
                captures.setdefault(row.progress.recorder.spec.layer, []).append(
                    Capture(i, 0, [positions[i]], [row.last_token], row.progress.recorder))
        return ForwardSteering(self._stacked, captures)

    def step(self) -> list[tuple[Row, ChoiceDelta, bool]]:
        """One decode step for every row; finished rows leave the lane."""
        device = self.ctx.device
        ids = torch.tensor([[r.last_token] for r in self.rows], dtype=torch.long, device=device)
        self.mask = torch.cat(
            [self.mask, torch.ones((len(self.rows), 1), dtype=torch.long, device=device)], dim=1
        )
        steering = self._steering()
        with _steered(self.ctx, steering):
            out = self.ctx.model(
                input_ids=ids,
                attention_mask=self.mask,
                position_ids=self.positions.unsqueeze(1),
                past_key_values=self.cache,
                use_cache=True,
            )
        self.positions = self.positions + 1
        results = sample(self.ctx, self.rows, out.logits[:, -1, :].float(), self.counts, self.seen)
        self.keep([i for i, (_, _, done) in enumerate(results) if not done])
        return results
