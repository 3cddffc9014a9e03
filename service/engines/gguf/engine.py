"""The GGUF engine: a .gguf file served through llama-cpp-python (llama.cpp).

Behind the same Engine interface as the transformers engine, so servicers and
the bridge cannot tell which one answers. One model thread owns the llama.cpp
contexts (they are not thread-safe) and serves jobs one at a time, first in,
first out; a job whose caller left is dropped between two tokens, so the next
one starts at once.

The *generation* context keeps the KV cache of the last sequence it ran; a
new prompt that starts with the same tokens (a system prompt, a chat's earlier
turns) evaluates only the rest, and the reused count is reported as
usage.prompt_tokens_details.cached_tokens. Scoring and embeddings read through
contexts of their own (engines/gguf/reading.py); the sampler chain is built by
engines/gguf/sampling.py.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading

from service.chat_template import CHATML, render_folding_system
from service.engines.base import Engine, EngineStatus, LoadedModel
from service.engines.gguf.constraint import GrammarMask
from service.engines.gguf.reading import Readers
from service.engines.gguf.sampling import sampler_chain
from service.engines.model_thread import ModelCall, answer_unrun
from service.engines.scores import TokenTable, score_logits
from service.errors import (
    EngineError,
    internal_error,
    invalid_parameter,
    queue_full,
)
from service.generation.job import (
    ChoiceDelta,
    FinishReason,
    GenerationJob,
    GroupDone,
    GroupFailed,
    StepOutput,
)
from service.models.registry import GGUF
from service.requests.generation import PromptGroup
from service.structured_output import GrammarCache
from service.text_output import ByteLevelDetokenizer, StopMatcher, control_char_ids

log = logging.getLogger(__name__)

_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def token_piece(vocab, token: int, special: bool) -> bytes:
    """A token's bytes. (llama-cpp-python's own token_to_piece returns its
    whole 32-byte buffer, NUL padding included.)"""
    import ctypes

    from llama_cpp import llama_cpp as lib

    size = 64
    while True:
        buffer = ctypes.create_string_buffer(size)
        n = lib.llama_token_to_piece(vocab, token, buffer, size, 0, special)
        if n >= 0:
            return buffer.raw[:n]
        size = -n  # too small: llama.cpp says how much it needs


class GgufEngine(Engine):
    kind = GGUF

    def __init__(self, entry, threads: int = 1, max_queued: int = 256, context: int = 0):
        super().__init__(entry)
        self.threads = threads
        self.max_queued = max_queued
        self.requested_context = context
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
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._running = 0
        self._generated = self._completed = self._cancelled = self._failed = 0
        self._cache_hits = 0
        self._thread: threading.Thread | None = None
        self._stopping = False

    # -- loading and tokenization -------------------------------------------------

    def _open(self, **kwargs):
        from llama_cpp import Llama

        return Llama(model_path=str(self.entry.path), n_threads=self.threads,
                     n_threads_batch=self.threads, verbose=False, **kwargs)

    def load(self) -> LoadedModel:
        from llama_cpp import llama_cpp as lib
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        probe = self._open(vocab_only=True)
        trained = int(probe.metadata.get("llama.context_length")
                      or next((v for k, v in probe.metadata.items()
                               if k.endswith(".context_length")), 0) or 2048)
        probe.close()
        n_ctx = min(self.requested_context, trained) if self.requested_context else trained
        self.llm = llm = self._open(n_ctx=n_ctx, n_batch=min(512, n_ctx))
        model = llm._model
        vocab = model.vocab
        n_vocab = llm.n_vocab()
        self._token_bytes = [token_piece(vocab, i, special=False) for i in range(n_vocab)]
        self._tokens = TokenTable(n_vocab, self._token_bytes)
        self._control_char_ids = control_char_ids(self._token_bytes)
        self._eog = frozenset(i for i in range(n_vocab) if lib.llama_vocab_is_eog(vocab, i))
        self._control = frozenset(i for i in range(n_vocab)
                                  if lib.llama_vocab_is_control(vocab, i))
        self._special_tokens = tuple(sorted({
            token_piece(vocab, i, special=True).decode("utf-8", errors="replace")
            for i in self._control} - {""}))
        template = llm.metadata.get("tokenizer.chat_template")
        self._template_from_file = bool(template)
        self._template = template or CHATML
        # A file may have no BOS (or EOS): llama.cpp says -1, and the template gets "".
        eos, bos = (token_piece(vocab, i, special=True).decode("utf-8", "replace")
                    if 0 <= i < n_vocab else "" for i in (llm.token_eos(), llm.token_bos()))
        # llama-cpp-python's Jinja formatter, as its own server uses it.
        self._formatter = Jinja2ChatFormatter(template or CHATML, eos_token=eos, bos_token=bos,
                                              add_generation_prompt=True)
        quant = self.entry.quantization
        self.info = LoadedModel(
            id=self.entry.id,
            engine=self.kind,
            context_window=llm.n_ctx(),
            vocab_size=n_vocab,
            dtype=_DTYPES.get(quant, "unrecorded"),
            quantization=quant or "unrecorded",
            revision=self.entry.revision,
        )
        self._readers = Readers(self._open, self.info.context_window)
        # The same grammar compiler as the transformers engine, over llama.cpp's pieces.
        self._grammars = GrammarCache.for_token_bytes(self._token_bytes, sorted(self._eog))
        return self.info

    @property
    def special_tokens(self) -> tuple[str, ...]:
        return self._special_tokens

    @property
    def has_chat_template(self) -> bool:
        return self._template_from_file

    @property
    def renders_tools(self) -> bool:
        return "tools" in self._template

    def encode_chat(self, messages: list[dict], partial: str | None = None,
                    tools: list[dict] | None = None) -> list[int]:
        from jinja2 import TemplateError

        try:
            rendered = render_folding_system(
                lambda turns: self._formatter(messages=turns, tools=tools).prompt, messages)
        except TemplateError as exc:
            raise invalid_parameter("messages", f"The chat template refused the "
                                    f"conversation: {exc}") from None
        # The rendered template holds any BOS it wants; its markers are special
        # tokens (message text cannot spell them: check_no_special_tokens).
        return self.llm.tokenize((rendered + (partial or "")).encode(), add_bos=False,
                                 special=True)

    def encode_text(self, text: str, parse_special: bool = False,
                    add_special: bool = True) -> list[int]:
        add_bos = add_special and self.llm._model.add_bos_token()
        return self.llm.tokenize(text.encode(), add_bos=add_bos, special=parse_special)

    def grammar_for(self, constraint):
        return self._grammars.get(constraint)

    def decode(self, ids: list[int]) -> str:
        return b"".join(self._token_bytes[i] for i in ids).decode("utf-8", errors="replace")

    # -- the model thread ---------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._thread = threading.Thread(target=self._run, name="millm-gguf", daemon=True)
        self._thread.start()

    def submit(self, job: GenerationJob) -> None:
        with self._lock:
            if self._waiting >= self.max_queued:
                raise queue_full(self.max_queued)
            self._waiting += 1
        self._inbox.put(job)

    def _call(self, fn):
        """Run fn(engine) on the model thread; await the returned future."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._inbox.put(ModelCall(fn, future, loop))
        return future

    def _run(self) -> None:
        while not self._stopping:
            item = self._inbox.get()
            if item is None:
                break
            if isinstance(item, ModelCall):
                if not item.future.cancelled():
                    item.run(self)
                continue
            with self._lock:
                self._waiting -= 1
                self._running = 1
            try:
                self._run_job(item)
            finally:
                with self._lock:
                    self._running = 0
        # Whatever still waits is cancelled; its callers see the engine go.
        answer_unrun(self._inbox)

    def _end(self, outcome: str) -> None:
        with self._lock:
            if outcome == "done":
                self._completed += 1
            elif outcome == "cancelled":
                self._cancelled += 1
            else:
                self._failed += 1

    def _run_job(self, job: GenerationJob) -> None:
        if job.cancelled.is_set():
            self._end("cancelled")
            return
        try:
            for group in job.spec.groups:
                if not self._run_group(job, group):
                    self._end("cancelled")
                    return
        except EngineError as exc:
            job.post(GroupFailed(exc))
            self._end("failed")
            return
        except Exception:
            log.exception("GGUF generation failed")
            job.post(GroupFailed(internal_error()))
            self._end("failed")
            return
        self._end("done")

    def _reuse_prefix(self, prompt: list[int]) -> int:
        """Keep the KV of the longest prefix this prompt shares with what the
        context holds; at least one prompt token is evaluated again so its
        logits are fresh. Returns the tokens reused."""
        llm = self.llm
        held = llm.input_ids[: llm.n_tokens]
        limit = min(len(held), len(prompt) - 1)
        same = 0
        while same < limit and held[same] == prompt[same]:
            same += 1
        if same > 0 and llm._ctx.kv_cache_seq_rm(-1, same, -1):
            llm.n_tokens = same
            return same
        llm.reset()
        llm._ctx.kv_cache_clear()
        return 0

    def _sampler(self, spec, seed: int):
        # Control tokens other than end-of-generation must never be generated
        # (a forged <|im_start|> would open a new turn); ignore_eos bans those too.
        banned = set(self._control - self._eog)
        if spec.ignore_eos:
            banned |= self._eog
        return sampler_chain(spec.options, self.llm.n_vocab(), banned, seed,
                             history=self.llm.n_ctx())

    def _run_group(self, job: GenerationJob, group: PromptGroup) -> bool:
        """Generate one prompt's choice; False when the caller left."""
        llm, spec = self.llm, job.spec
        prompt = list(group.prompt_ids)
        if spec.seed is None:
            cached = self._reuse_prefix(prompt)
        else:
            # A seeded request evaluates its whole prompt from an empty cache:
            # a reused prefix changes the batch shapes, and with them the last
            # bits of the logits, so its text would depend on what ran before.
            self.llm.reset()
            self.llm._ctx.kv_cache_clear()
            cached = 0
        with self._lock:
            self._cache_hits += cached
        llm.eval(prompt[cached:])
        seed = group.row_seeds[0] & 0xFFFFFFFF
        sampler = self._sampler(spec, seed)
        # A JSON document holds no raw control character; a tool call's syntax has newlines.
        mask = (GrammarMask(spec.grammar, llm.n_vocab(),
                            self._control_char_ids if spec.constraint is not None else [])
                if spec.grammar is not None else None)
        detokenizer = ByteLevelDetokenizer(self._token_bytes)
        stopper = StopMatcher(spec.stop)
        generated = 0
        index = group.first_index
        while True:
            if job.cancelled.is_set() or self._stopping:
                return False
            if mask is not None:
                mask.apply(llm._ctx)
            token = sampler.sample(llm._ctx, -1)
            if mask is not None and not mask.accept(token):
                # The mask allowed only tokens the grammar accepts; the document
                # check after the choice ends refuses the output.
                log.error("grammar refused a token its own mask allowed")
            generated += 1
            with self._lock:
                self._generated += 1
            if token in self._eog and not spec.ignore_eos:
                text, hit = stopper.push(detokenizer.flush())
                text = text if hit else text + stopper.flush()
                job.post(StepOutput((ChoiceDelta(index, text, (token,), FinishReason.STOP),)))
                break
            text, hit = stopper.push(detokenizer.push(token))
            if hit:
                job.post(StepOutput((ChoiceDelta(index, text, (token,), FinishReason.STOP),)))
                break
            if generated >= group.max_tokens:
                tail, hit = stopper.push(detokenizer.flush())
                text += tail if hit else tail + stopper.flush()
                job.post(StepOutput((ChoiceDelta(index, text, (token,), FinishReason.LENGTH),)))
                break
            job.post(StepOutput((ChoiceDelta(index, text, (token,)),)))
            llm.eval([token])
        job.post(GroupDone(generated, cached))
        return True

    # -- reading (engines/gguf/reading.py) ----------------------------------------------

    def score(self, prompts, *, temperature, allowed, top, echo, next_token, plan=None,
              recorder=None):
        """llama.cpp's logits through engines/scores.py, as on the transformers
        engine. Never steered: the field table refuses steering on GGUF."""
        import torch

        def run(engine: GgufEngine):
            return [score_logits(engine._tokens, ids,
                                 torch.from_numpy(engine._readers.prompt_logits(ids)),
                                 temperature=temperature, allowed=allowed, top=top, echo=echo,
                                 next_token=next_token)
                    for ids in prompts]

        return self._call(run)

    def embed(self, inputs: list[list[int]]):
        """One mean-pooled vector per tokenized input; await the result."""
        return self._call(lambda engine: engine._readers.embed(inputs))

    # -- status and shutdown ----------------------------------------------------------

    async def clear_prefix_cache(self) -> int:
        def clear(engine: GgufEngine) -> int:
            held = engine.llm.n_tokens
            engine.llm.reset()
            engine.llm._ctx.kv_cache_clear()
            return held

        return await self._call(clear)

    def status(self) -> EngineStatus:
        with self._lock:
            return EngineStatus(
                backend="gguf/serial",
                active_generations=self._running,
                queued_requests=self._waiting,
                generated_tokens_total=self._generated,
                completed_generations_total=self._completed,
                cancelled_generations_total=self._cancelled,
                failed_generations_total=self._failed,
                running_rows=self._running,
                lanes=self._running,
                max_batch=1,
                max_queued=self.max_queued,
                prefix_cache_tokens=self.llm.n_tokens if self.llm is not None else 0,
                prefix_cache_hit_tokens_total=self._cache_hits,
            )

    def shutdown(self) -> None:
        self._stopping = True
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._readers is not None:
            self._readers.close()
        if self.llm is not None:
            self.llm.close()
        self.llm = self._readers = None
