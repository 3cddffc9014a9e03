"""The GGUF engine: a .gguf file served through llama-cpp-python (llama.cpp).

Behind the same Engine interface as the transformers engine, so servicers and
the bridge cannot tell which one answers. One model thread owns the llama.cpp
contexts (they are not thread-safe). How many sequences (`slots`) and cells
each (the context window) it opens is planned to fit memory before the load
(engines/gguf/kv_plan.py). Generation is continuously batched over
the slots' sequences of one context (engines/gguf/batch.py): a request joins at
the next step, a finished one or one whose caller left frees its slot at
once, and a prompt that starts like one a slot still holds (a system prompt,
a chat's earlier turns) evaluates only the rest, reported as
usage.prompt_tokens_details.cached_tokens. A seeded request's rows decode in
lanes, contexts of their own (engines/gguf/lanes.py), between the shared
batch's steps: a seed keeps its text without holding anyone back. A request's
n choices share its prompt's cells (engines/gguf/forks.py). Scoring and
embeddings read through contexts of their own (engines/gguf/reading.py); the
sampler chain is built by engines/gguf/sampling.py; the vocabulary, the chat
template and tokenization are engines/gguf/vocab.py's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading

from service.engines import faults, scores
from service.engines.admission import SchedulerLimits
from service.engines.base import Engine, EngineStatus, LoadedModel
from service.engines.gguf.batch import Runner
from service.engines.gguf.constraint import GrammarMask, Scratch
from service.engines.gguf.forks import part_count
from service.engines.gguf.kv_plan import KvPlan
from service.engines.gguf.lanes import Lanes, lane_opener
from service.engines.gguf.logprobs import TokenScorer
from service.engines.gguf.reading import GGML_TYPE_F32, Readers
from service.engines.gguf.sampling import row_sampler
from service.engines.gguf.slots import Slots
from service.engines.gguf.steer_load import new_steerer, reachable
from service.engines.gguf.vocab import GgufVocab
from service.engines.model_thread import Inbox, own_torch_threads, report_death, run_one_chunk
from service.engines.scores import score_logits
from service.errors import EngineError, batch_reset, thread_died
from service.formats.base import CLOSED
from service.generation.job import GenerationJob
from service.generation.reasoning import CloseWatch
from service.grammars import GrammarCache
from service.models.registry import GGUF

log = logging.getLogger(__name__)

_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


class GgufEngine(GgufVocab, Engine):
    kind = GGUF

    def __init__(self, entry, kv: KvPlan, threads: int = 1, flash_attn: bool = False,
                 kv_f32: bool = False,
                 limits: SchedulerLimits | None = None, prefix_cache_tokens: int = 32768):
        super().__init__(entry)
        self.threads = threads
        self.flash_attn = flash_attn  # every context of the model: generation, lanes, reads
        # Generation cells (the shared context and the lanes) in f32 instead of
        # llama.cpp's f16: MILLM_GGUF_KV_TYPE=f32, the exact setting.
        self.kv_types = ({"type_k": GGML_TYPE_F32, "type_v": GGML_TYPE_F32} if kv_f32
                         else {})
        # The slots and window, sized to memory (engines/gguf/kv_plan.py); the
        # slots are at most MILLM_MAX_BATCH (engines/kinds.py).
        self.kv = kv
        self.slots = kv.slots
        # Admission as on the transformers engine (engines/admission.py), over the slots.
        self.limits = limits or SchedulerLimits()
        self.max_queued = self.limits.max_queued
        self.stall_s = self.limits.stall_s
        self._unembedding = None  # read from the file on first use (unembedding())
        # 0: no prompt reuses a slot's cells (the slots' cells are reserved at
        # load whatever the budget, so a positive one changes nothing here).
        self.keep_prefixes = prefix_cache_tokens > 0
        self.llm = None
        self._readers: Readers | None = None
        self.info: LoadedModel | None = None
        self._formatter = None
        self._template = ""
        self._template_from_file = False
        self._token_bytes: list[bytes] = []
        self._special_tokens: tuple[str, ...] = ()
        self._eog: frozenset[int] = frozenset()
        self._control: frozenset[int] = frozenset()
        self._control_char_ids: list[int] = []
        self._grammars: GrammarCache | None = None
        self._scratch: Scratch | None = None  # the model thread's grammar bitmask
        # Jobs and reads in, from the event loop (engines/model_thread.py).
        self._inbox = Inbox(self.limits.max_queued)
        self._lock = threading.Lock()  # the counters status() reports
        self._running = 0
        self._generated = self._completed = self._cancelled = self._failed = 0
        self._cache_hits = 0
        self._runner: Runner | None = None
        self._ctx = self._batch = None  # the generation context and its batch
        # Per-row steering (engines/gguf/steering.py); None: this model is not steerable.
        self._steerer = None
        self._ctx_steer = None  # the generation context's callback tables (kept alive)
        self._thread: threading.Thread | None = None
        self._stopping = False

    # -- loading and tokenization -------------------------------------------------

    def _open(self, **kwargs):
        from llama_cpp import Llama

        return Llama(model_path=str(self.entry.path), n_threads=self.threads,
                     n_threads_batch=self.threads, flash_attn=self.flash_attn, verbose=False,
                     **kwargs)

    def load(self) -> LoadedModel:
        if self.kv.refusal:
            raise EngineError("insufficient_memory", f"The model '{self.entry.id}' cannot be "
                              f"loaded: {self.kv.refusal}.", "model")
        n_ctx = self.kv.window
        log.info("%s: %s", self.entry.id, self.kv.describe())
        # The model and its vocabulary; generation runs in a context of its own.
        # (Its context parameters, types included, are the generation
        # context's and the lanes' starting point.)
        self.llm = llm = self._open(n_ctx=64, n_batch=64, **self.kv_types)
        n_vocab = self.read_vocab(llm)
        quant = self.entry.quantization
        self.info = LoadedModel(
            id=self.entry.id,
            engine=self.kind,
            context_window=n_ctx,
            vocab_size=n_vocab,
            dtype=_DTYPES.get(quant, "unrecorded"),
            quantization=quant or "unrecorded",
            revision=self.entry.revision,
            embedding_window=self.kv.embed_window,
        )
        # The same grammar compiler as the transformers engine, over llama.cpp's pieces.
        self._grammars = GrammarCache.for_token_bytes(self._token_bytes, sorted(self._eog))
        self._scratch = Scratch(n_vocab)
        self._open_batch_context(n_ctx)
        return self.info

    def _open_batch_context(self, window: int) -> None:
        """The generation context: `slots` sequences over a unified KV cache of
        slots x window cells (one sequence may use its whole window), with the
        same parameters as llama-cpp-python's own context otherwise."""
        from llama_cpp import llama_cpp as lib
        from llama_cpp._internals import LlamaBatch, LlamaContext

        params = lib.llama_context_params.from_buffer_copy(self.llm.context_params)
        cells = window * self.slots
        n_batch = min(512, cells)
        params.n_ctx, params.n_batch, params.n_ubatch = cells, n_batch, n_batch
        params.n_seq_max, params.kv_unified = self.slots, True
        steerer = new_steerer(self.llm._model.model, self.entry.id)
        self._ctx_steer = steerer.hook(params, n_batch) if steerer is not None else None
        self._ctx = LlamaContext(model=self.llm._model, params=params, verbose=False)
        self._batch = LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=1, verbose=False)
        if steerer is not None and not reachable(self._ctx, self._batch, self._ctx_steer,
                                                 self.llm.token_bos(), self.entry.id):
            steerer = None
        self._steerer = steerer
        self._readers = Readers(self._open, window, self.kv.embed_window, steerer,
                                self._token_bytes)
        lanes = Lanes(lane_opener(self.llm._model, self.llm.context_params, window, steerer))
        model = self.llm._model.model
        whole_only = bool(lib.llama_model_is_recurrent(model) or lib.llama_model_is_hybrid(model))
        self._runner = Runner(self._ctx, self._batch, n_batch,
                              Slots(self.slots, cells, whole_only, self.keep_prefixes), lanes,
                              self._eog, self._row_tools, self._token_bytes, self._count,
                              self.stall_s, steerer, self._ctx_steer if steerer else None,
                              self.limits)

    @property
    def capabilities(self):
        caps = self.kind_capabilities
        return caps if self._steerer is not None else dataclasses.replace(caps, steer=False)

    @property
    def steering(self):
        return self._steerer

    async def grammar_for(self, constraint):
        return await self._grammars.compiled(constraint)

    def unembedding(self):
        """Read from the file with the gguf package (llama.cpp keeps no
        float copy to hand out), dequantized; the token embedding when the
        output is tied to it. Kept once read."""
        if self._unembedding is None:
            import gguf
            import torch

            tensors = {t.name: t for t in gguf.GGUFReader(str(self.entry.path)).tensors}
            tensor = tensors.get("output.weight") or tensors.get("token_embd.weight")
            if tensor is None:
                return None
            rows = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            width = int(tensor.shape[0])  # GGUF lists the fastest dimension first
            self._unembedding = torch.from_numpy(rows.reshape(-1, width).astype("float32"))
        return self._unembedding

    # -- the model thread ---------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._thread = threading.Thread(target=self._run, name="millm-gguf", daemon=True)
        self._thread.start()

    def submit(self, job: GenerationJob) -> None:
        # Its piles() count one GroupDone a choice.
        self._inbox.submit(job, part_count(job.spec.groups))

    def _call(self, fn):
        """Run fn(engine) on the model thread; await the returned future."""
        return self._inbox.call(fn)

    _COUNTERS = {"running": "_running", "generated": "_generated",
                 "cache_hits": "_cache_hits", "done": "_completed", "cancelled": "_cancelled",
                 "failed": "_failed"}

    def _count(self, what: str, amount: int) -> None:
        """Move one of the counters status() reports (the runner's only way in)."""
        if what == "waiting":
            self._inbox.dequeued(-amount)
            return
        attribute = self._COUNTERS[what]
        with self._lock:
            setattr(self, attribute, getattr(self, attribute) + amount)

    def _run(self) -> None:
        own_torch_threads()  # SAE encodes for readout and probes run here
        try:
            self._serve(self._runner)
        except BaseException:
            # A row's or a read's own failures are handled where they happen;
            # this is the thread itself.
            log.critical("GGUF model thread died; the engine stops serving", exc_info=True)
            self._inbox.die()
            error = thread_died()
            self._runner.fail_all(error)
            self._inbox.answer_unrun(error)
            report_death()
            return
        # Whatever still waits or runs is cancelled; its callers see the engine go.
        self._runner.stop()
        self._inbox.answer_unrun()

    def _serve(self, runner: Runner) -> None:
        """Each turn: take the inbox, drop what callers left, one chunk of the
        oldest read (reads take turns between decode steps), admit, one step."""
        inbox = self._inbox
        while not self._stopping and inbox.take(
                runner.add, block=not runner.waiting and not runner.rows and not inbox.reads):
            runner.drop_cancelled()
            run_one_chunk(inbox.reads, self)
            faults.hit("turn")
            try:
                runner.admit()
                if runner.rows:
                    runner.step()
            except Exception:
                log.exception("GGUF model thread: a turn failed in shared batch state; "
                              "failing the running rows")
                runner.fail_running(batch_reset())

    def _row_tools(self, spec, seed: int):
        """A row's sampler chain, grammar mask and, when it asked for
        log-probabilities, their scorer. Control tokens other than
        end-of-generation must never be generated (a forged <|im_start|> would
        open a new turn); ignore_eos bans those too."""
        banned = set(self._control - self._eog)
        if spec.ignore_eos:
            banned |= self._eog
        sampler = row_sampler(spec.options, self.llm.n_vocab(), banned, seed,
                              history=self.info.context_window)
        # A JSON document holds no raw control character; a tool call's syntax
        # has newlines, and a pattern or grammar says which characters it takes.
        # Reasoning before a JSON document is free text: its ban waits for the close.
        json = spec.constraint is not None and spec.constraint.is_json
        watch = None
        if spec.reasoning is not None and spec.reasoning.mode != CLOSED:
            watch = CloseWatch(spec.reasoning.syntax.close)
        mask = (GrammarMask(spec.grammar, self.llm.n_vocab(),
                            self._control_char_ids if json else [], self._scratch, watch,
                            self._token_bytes)
                if spec.grammar is not None else None)
        scorer = (TokenScorer(spec.options, self.llm.n_vocab(), banned, seed,
                              history=self.info.context_window, tokens=self._tokens,
                              top=spec.logprobs)
                  if spec.logprobs is not None else None)
        return sampler, mask, scorer

    # -- reading (engines/gguf/reading.py) ----------------------------------------------

    def score(self, prompts, *, temperature, allowed, top, echo, next_token, plan=None,
              recorder=None):
        """llama.cpp's logits through engines/scores.py, as on the transformers
        engine: unsteered unless `plan` is given (an echo's prompt under its
        completion's steering); `recorder` reads activations on the way."""
        import torch

        def run(engine: GgufEngine):
            scored = []
            for ids in prompts:  # one prompt a chunk (engines/model_thread.py)
                scored.append(score_logits(
                    engine._tokens, ids,
                    torch.from_numpy(engine._readers.prompt_logits(ids, plan, recorder)),
                    temperature=temperature, allowed=allowed, top=top, echo=echo,
                    next_token=next_token))
                yield
            return scored

        return self._call(run)

    def divergence(self, ids, start, plan):
        import torch

        def run(engine: GgufEngine):
            rows = slice(start - 1, len(ids) - 1)
            readers = engine._readers
            plain = torch.from_numpy(readers.prompt_logits(ids)[rows])
            steered = (torch.from_numpy(readers.prompt_logits(ids, plan,
                                                              generated_from=start)[rows])
                       if plan is not None else plain)
            return scores.divergence(engine._tokens, ids, start, steered, plain)

        return self._call(run)

    def embed(self, inputs: list[list[int]]):
        """One mean-pooled vector per tokenized input; await the result."""
        return self._call(lambda engine: engine._readers.embed_chunks(inputs))

    # -- status and shutdown ----------------------------------------------------------

    async def clear_prefix_cache(self) -> int:
        return await self._call(lambda engine: engine._runner.clear_idle())

    def status(self) -> EngineStatus:
        with self._lock:
            runner = self._runner
            slots = runner.slots if runner is not None else None
            shared = len(slots.rows) if slots is not None else 0
            lanes = len(runner.lanes.running()) if runner is not None else 0
            return EngineStatus(
                backend="gguf/" + ("serial" if self.limits.serial else "continuous-batching"),
                active_generations=self._running,
                queued_requests=self._inbox.queued,
                generated_tokens_total=self._generated,
                completed_generations_total=self._completed,
                cancelled_generations_total=self._cancelled,
                failed_generations_total=self._failed,
                running_rows=shared + lanes,
                lanes=(1 if shared else 0) + lanes,
                max_batch=self.slots,
                max_queued=self.max_queued,
                kv_tokens_in_use=slots.held() + runner.lanes.held() if slots is not None else 0,
                prefix_cache_tokens=slots.idle_tokens() if slots is not None else 0,
                prefix_cache_hit_tokens_total=self._cache_hits,
            )

    def shutdown(self) -> None:
        self._stopping = True
        self._inbox.close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._readers is not None:
            self._readers.close()
        if self._runner is not None:
            self._runner.lanes.close()
        if self._grammars is not None:
            self._grammars.close()
        for native in (self._batch, self._ctx, self.llm):
            if native is not None:
                native.close()
        self.llm = self._readers = self._ctx = self._batch = self._runner = None
