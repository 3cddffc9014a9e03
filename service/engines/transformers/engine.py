"""The transformers engine: any HF causal-LM checkpoint directory.

This module loads the checkpoint and tokenizes; all model work happens on the
scheduler's model thread (scheduler.py, batch.py), so torch is never called
from the event loop.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import threading

import torch
import xgrammar

from service.chat_template import CHATML, render_folding_system
from service.engines.admission import SchedulerLimits
from service.engines.base import (
    Engine,
    EngineCapabilities,
    EngineStatus,
    LoadedModel,
)
from service.engines.transformers import decode_mask, grouped_query, kv, reading
from service.engines.transformers.architecture import LayersNotFound, decoder_layers
from service.engines.transformers.batch import ModelContext
from service.engines.transformers.packed_linear import AUTO, pack_linears
from service.engines.transformers.prefix_cache import PrefixCache
from service.engines.transformers.scheduler import Scheduler
from service.engines.transformers.segments import SegmentTokenizer
from service.engines.transformers.steering import SteeringRuntime
from service.errors import invalid_parameter
from service.generation.job import GenerationJob
from service.grammars import GrammarCache
from service.models.registry import TRANSFORMERS
from service.text_output import byte_level_table, control_char_ids

log = logging.getLogger(__name__)


def _pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


class TransformersEngine(Engine):
    kind = TRANSFORMERS

    def __init__(
        self,
        entry,
        device: str = "auto",
        limits: SchedulerLimits | None = None,
        prefix_cache_tokens: int = 32768,
        linear_layout: str = AUTO,
    ):
        super().__init__(entry)
        self.linear_layout = linear_layout  # packed_linear.py: CPU float32 linears
        self.limits = limits or SchedulerLimits()
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self.device = _pick_device(device)
        self.model = None
        self.tokenizer = None
        self.info: LoadedModel | None = None
        self._eos_ids: frozenset[int] = frozenset()
        self._banned_ids: torch.Tensor | None = None
        self._special_tokens: tuple[str, ...] = ()
        self.grammars: GrammarCache | None = None
        self._scheduler: Scheduler | None = None
        # Encoding runs on worker threads, decoding on the model thread. A HF
        # tokenizer is not safe to share across threads (its Rust backend
        # raises "Already borrowed"), so the model thread decodes with its own
        # copy and encoders take turns.
        self.decoder = None
        self._encode_lock = threading.Lock()
        self._segments: SegmentTokenizer | None = None
        self._steering: SteeringRuntime | None = None  # known once started
        self._recurrent = False  # a layer keeps a per-row state (kv.py): no prefix reuse

    # -- loading and tokenization -------------------------------------------------

    def load(self) -> LoadedModel:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        path = self.entry.path
        tokenizer = AutoTokenizer.from_pretrained(path)
        config = AutoConfig.from_pretrained(path)
        # A cache the lanes cannot hold is refused now, not at every request.
        self._recurrent = kv.check_servable(config)
        dtype = torch.float32 if self.device.type == "cpu" else "auto"
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device)
        model.eval()
        config = model.config
        packed = pack_linears(model, self.linear_layout)
        if packed:
            log.info("%s: %d linear layers in oneDNN's packed layout", self.entry.id, packed)

        eos = model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        vocab_size = model.get_output_embeddings().weight.shape[0]
        # Generation must never emit a special token other than end-of-sequence
        # (a forged <|im_start|> would open a new turn), nor an id the
        # tokenizer cannot decode (padded embedding rows).
        banned = {i for i in tokenizer.all_special_ids if i not in eos_ids}
        banned.update(range(len(tokenizer), vocab_size))
        self._banned_ids = torch.tensor(sorted(banned), dtype=torch.long, device=self.device)
        self._special_tokens = tuple(sorted(
            {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
            | set(tokenizer.all_special_tokens)))
        self._eos_ids = frozenset(eos_ids)

        quant = getattr(config, "quantization_config", None)
        quantization = "unquantized"
        if quant is not None:
            method = (
                quant.get("quant_method")
                if isinstance(quant, dict)
                else getattr(quant, "quant_method", None)
            )
            quantization = str(method) if method else "unrecorded"
        self.model, self.tokenizer = model, tokenizer
        # A rendered chat tokenized piece by piece, long pieces remembered
        # (segments.py); None: this tokenizer's pieces are not independent.
        self._segments = SegmentTokenizer.for_tokenizer(tokenizer)
        self.decoder = copy.deepcopy(tokenizer)
        self.grammars = GrammarCache.for_huggingface(copy.deepcopy(tokenizer), vocab_size,
                                                     sorted(eos_ids))
        self.info = LoadedModel(
            id=self.entry.id,
            engine=self.kind,
            context_window=int(getattr(config, "max_position_embeddings", 0) or 2048),
            vocab_size=len(tokenizer),
            dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
            quantization=quantization,
            revision=self.entry.revision,
        )
        return self.info

    @property
    def special_tokens(self) -> tuple[str, ...]:
        return self._special_tokens

    @property
    def chat_template(self) -> str:
        template = self.tokenizer.chat_template
        return template if isinstance(template, str) and template else CHATML

    def encode_chat(self, messages: list[dict], partial: str | None = None,
                    tools: list[dict] | None = None, template_kwargs: dict | None = None,
                    *, generation_prompt: bool = True, add_special: bool = False) -> list[int]:
        from jinja2 import TemplateError

        template = None if self.tokenizer.chat_template else CHATML
        with self._encode_lock:
            try:
                text = render_folding_system(
                    lambda turns: self.tokenizer.apply_chat_template(
                        turns, chat_template=template, add_generation_prompt=generation_prompt,
                        tokenize=False, tools=tools, **(template_kwargs or {})), messages)
            except TemplateError as exc:
                # Templates refuse conversations they cannot render (say, roles
                # that do not alternate): the caller's to fix.
                raise invalid_parameter("messages", f"The chat template refused the "
                                        f"conversation: {exc}") from None
            # A truncated answer is continued from where it stopped. The
            # rendered template already holds any BOS it wants.
            if self._segments is not None and not add_special:
                return self._segments.encode(text + (partial or ""))
            return self.tokenizer(text + (partial or ""),
                                  add_special_tokens=add_special)["input_ids"]

    def encode_text(self, text: str, parse_special: bool = False,
                    add_special: bool = True) -> list[int]:
        with self._encode_lock:
            # Unless asked, text that spells a special token stays text.
            return self.tokenizer(text, add_special_tokens=add_special,
                                  split_special_tokens=not parse_special)["input_ids"]

    def _control_ids(self) -> torch.Tensor:
        table = byte_level_table(self.decoder)
        pieces = (table if table is not None else
                  [self.decoder.decode([i]).encode() for i in range(len(self.decoder))])
        ids = control_char_ids(pieces)
        return torch.tensor(ids, dtype=torch.long, device=self.device)

    async def grammar_for(self, constraint):
        return await self.grammars.compiled(constraint)

    # -- running jobs -------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            # Forward hooks on its decoder layers carry per-row SAE steering.
            layers = decoder_layers(self.model)
            steering = SteeringRuntime(self.model, layers.modules)
            log.info("%s: steering hooks on %s (%d layers)", self.entry.id, layers.path,
                     len(layers.modules))
        except LayersNotFound as exc:
            # A layout the hooks cannot reach: served, and steering fields are
            # refused with steering_unavailable (requests/fields.py).
            log.warning("steering unavailable for %s: %s", self.entry.id, exc)
            steering = None
        self._steering = steering
        grouped = grouped_query.choose(self.model, self.device)
        if grouped:
            log.info("%s: prompt passes read grouped K/V heads in place", self.entry.id)
        ctx = ModelContext(
            model=self.model,
            decoder=self.decoder,
            device=self.device,
            vocab_width=self.model.get_output_embeddings().weight.shape[0],
            vocab_size=len(self.tokenizer),
            eos_ids=torch.tensor(sorted(self._eos_ids), dtype=torch.long, device=self.device),
            banned_ids=self._unbanned_markup(),
            eos_set=self._eos_ids,
            token_bytes=byte_level_table(self.decoder),
            control_ids=self._control_ids(),
            batch_matcher=xgrammar.BatchGrammarMatcher(max_threads=1),
            steering=steering,
            reuses_prefixes=not self._recurrent,
            ready_masks=decode_mask.suffices(self.model, self._recurrent),
            grouped_prompts=grouped,
        )
        self._scheduler = Scheduler(ctx, self.limits, self.prefix_cache)
        self._scheduler.start()

    def _unbanned_markup(self) -> torch.Tensor:
        """The banned ids but the special tokens of the model's own call and
        reasoning markup (service/formats), which it must be able to write."""
        if self.format is None:
            return self._banned_ids
        keep = [i for i in self._banned_ids.tolist() if i < len(self.tokenizer)
                and self.format.writes(self.tokenizer.convert_ids_to_tokens(i) or "")]
        if keep:
            log.info("%s: its format's markup tokens may be generated: %s", self.entry.id,
                     self.tokenizer.convert_ids_to_tokens(keep))
        return self._banned_ids[~torch.isin(self._banned_ids, torch.tensor(
            keep, dtype=torch.long, device=self.device))]

    @property
    def capabilities(self) -> EngineCapabilities:
        caps = self.kind_capabilities
        return caps if self._steering is not None else dataclasses.replace(caps, steer=False)

    @property
    def steering(self) -> SteeringRuntime | None:
        return self._steering

    def call(self, fn):
        """Run fn(ModelContext) on the model thread, between decode steps."""
        return self._scheduler.call(fn)

    def divergence(self, ids, start, plan):
        return self.call(lambda ctx: reading.divergence(ctx, ids, start, plan))

    def score(self, prompts, *, temperature, allowed, top, echo, next_token, plan=None,
              recorder=None):
        def run(ctx):
            scored = []
            for ids in prompts:  # one prompt a chunk (engines/model_thread.py)
                scored.append(reading.score_prompt(
                    ctx, ids, temperature=temperature, allowed=allowed, top=top, echo=echo,
                    next_token=next_token, recorder=recorder, plan=plan))
                yield
            return scored

        return self.call(run)

    def embed(self, inputs):
        return self.call(lambda ctx: reading.embed_chunks(ctx, inputs))

    async def clear_prefix_cache(self) -> int:
        def clear(ctx) -> int:  # the cache belongs to the model thread
            freed = self.prefix_cache.cached_tokens
            self.prefix_cache.clear()
            return freed

        return await self.call(clear)

    @property
    def has_chat_template(self) -> bool:
        return bool(self.tokenizer.chat_template)

    def decode(self, ids: list[int]) -> str:
        with self._encode_lock:
            return self.tokenizer.decode(ids)

    def detokenize(self, ids: list[int]) -> str:
        return self.decode(ids)  # special tokens are written out already

    def unembedding(self):
        return self.model.get_output_embeddings().weight.detach().float().cpu()

    def token_strings(self, ids: list[int]) -> list[str]:
        with self._encode_lock:
            return [str(t) for t in self.tokenizer.convert_ids_to_tokens(ids)]

    def submit(self, job: GenerationJob) -> None:
        self._scheduler.submit(job)

    def status(self) -> EngineStatus:
        return self._scheduler.status()

    def shutdown(self) -> None:
        if self._scheduler is not None:
            self._scheduler.stop()
        if self.grammars is not None:
            self.grammars.close()
