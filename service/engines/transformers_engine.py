"""The transformers engine: any HF causal-LM checkpoint directory.

All model work happens on one model thread, so torch is never called from the
event loop. The thread runs the prompt groups it holds round-robin, one
forward pass per group per turn: a new request starts at the next turn instead
of waiting for the running ones, and a cancelled group leaves before its next
step. Within a group the n choices share each forward pass as rows of one
batch (they share the prompt, so no padding is needed).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import queue
import threading

import torch

from service.engines.base import Engine, EngineStatus, LoadedModel
from service.errors import internal_error
from service.generation_job import (
    ChoiceDelta,
    FinishReason,
    GenerationJob,
    GroupDone,
    GroupFailed,
    PromptGroup,
    StepOutput,
)
from service.sampling import apply_penalties, choose_tokens
from service.text_output import IncrementalDetokenizer, StopMatcher

log = logging.getLogger(__name__)

# Used when a checkpoint ships no chat template of its own.
CHATML_FALLBACK = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


class TransformersEngine(Engine):
    kind = "transformers"

    def __init__(self, entry, device: str = "auto"):
        super().__init__(entry)
        self.device = _pick_device(device)
        self.model = None
        self.tokenizer = None
        self.info: LoadedModel | None = None
        self._eos_ids: frozenset[int] = frozenset()
        self._banned_ids: torch.Tensor | None = None
        self._worker: _ModelThread | None = None
        # Encoding runs on worker threads, decoding on the model thread. A HF
        # tokenizer is not safe to share across threads (its Rust backend
        # raises "Already borrowed"), so the model thread decodes with its own
        # copy and encoders take turns.
        self.decoder = None
        self._encode_lock = threading.Lock()

    # -- loading and tokenization -------------------------------------------------

    def load(self) -> LoadedModel:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = self.entry.path
        tokenizer = AutoTokenizer.from_pretrained(path)
        dtype = torch.float32 if self.device.type == "cpu" else "auto"
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device)
        model.eval()
        config = model.config

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
        self._eos_ids = frozenset(eos_ids)

        quant = getattr(config, "quantization_config", None)
        quantization = "unquantized"
        if quant is not None:
            method = quant.get("quant_method") if isinstance(quant, dict) else getattr(
                quant, "quant_method", None
            )
            quantization = str(method) if method else "unrecorded"
        self.model, self.tokenizer = model, tokenizer
        self.decoder = copy.deepcopy(tokenizer)
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

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        template = None if self.tokenizer.chat_template else CHATML_FALLBACK
        with self._encode_lock:
            text = self.tokenizer.apply_chat_template(
                messages, chat_template=template, add_generation_prompt=True, tokenize=False
            )
            # The rendered template already holds any BOS it wants.
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode_text(self, text: str) -> list[int]:
        with self._encode_lock:
            return self.tokenizer(text, add_special_tokens=True)["input_ids"]

    # -- running jobs -------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._worker = _ModelThread(self)
        self._worker.start()

    def submit(self, job: GenerationJob) -> None:
        self._worker.submit(job)

    def status(self) -> EngineStatus:
        return self._worker.status()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.stop()


class _Row:
    """One choice: its generator, its text pipeline and its token count."""

    def __init__(self, engine: TransformersEngine, group: PromptGroup, offset: int):
        self.index = group.first_index + offset
        self.generator = torch.Generator(device=engine.device).manual_seed(group.row_seeds[offset])
        self.detokenizer = IncrementalDetokenizer(engine.decoder, list(group.prompt_ids))
        self.stopper: StopMatcher | None = None
        self.generated = 0
        self.last_token = -1

    def final_text(self) -> str:
        text, hit = self.stopper.push(self.detokenizer.flush())
        return text if hit else text + self.stopper.flush()


class _GroupRun:
    """The live state of one prompt group: rows, KV cache, repeat counts."""

    def __init__(self, engine: TransformersEngine, job: GenerationJob, group: PromptGroup):
        from transformers import DynamicCache

        self.engine, self.job, self.group = engine, job, group
        spec = job.spec
        self.options = spec.options
        self.rows = [_Row(engine, group, i) for i in range(group.n)]
        for row in self.rows:
            row.stopper = StopMatcher(spec.stop)
        vocab = engine.model.get_output_embeddings().weight.shape[0]
        device = engine.device
        self.output_counts = torch.zeros((group.n, vocab), dtype=torch.float32, device=device)
        self.seen = torch.zeros((group.n, vocab), dtype=torch.bool, device=device)
        prompt = torch.tensor(group.prompt_ids, dtype=torch.long, device=device)
        self.seen[:, prompt] = True
        self.banned = engine._banned_ids
        if spec.ignore_eos:
            eos = torch.tensor(sorted(engine._eos_ids), dtype=torch.long, device=device)
            self.banned = torch.cat([self.banned, eos])
        self.cache = DynamicCache()
        self.prefilled = False
        self.completion_tokens = 0

    def step(self) -> bool:
        """Run one forward pass; post the deltas; return True when every row is done."""
        engine = self.engine
        if not self.prefilled:
            ids = torch.tensor([self.group.prompt_ids] * len(self.rows), device=engine.device)
            self.prefilled = True
        else:
            ids = torch.tensor([[r.last_token] for r in self.rows], device=engine.device)
        out = engine.model(
            input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=1
        )
        logits = out.logits[:, -1, :].float()
        logits = apply_penalties(logits, self.options, self.output_counts, self.seen)
        logits[:, self.banned] = float("-inf")
        tokens = choose_tokens(
            logits, [self.options] * len(self.rows), [r.generator for r in self.rows]
        )

        deltas, keep = [], []
        for i, (row, token) in enumerate(zip(self.rows, tokens, strict=True)):
            row.generated += 1
            self.completion_tokens += 1
            if token in engine._eos_ids:
                deltas.append(ChoiceDelta(row.index, row.final_text(), (token,), FinishReason.STOP))
                continue
            self.output_counts[i, token] += 1
            self.seen[i, token] = True
            text, hit = row.stopper.push(row.detokenizer.push(token))
            if hit:
                deltas.append(ChoiceDelta(row.index, text, (token,), FinishReason.STOP))
            elif row.generated >= self.group.max_tokens:
                text += row.final_text()
                deltas.append(ChoiceDelta(row.index, text, (token,), FinishReason.LENGTH))
            else:
                deltas.append(ChoiceDelta(row.index, text, (token,)))
                row.last_token = token
                keep.append(i)
        if len(keep) < len(self.rows) and keep:
            # Finished rows leave the batch: their KV and counts are dropped.
            index = torch.tensor(keep, dtype=torch.long, device=engine.device)
            self.cache.batch_select_indices(index)
            self.output_counts = self.output_counts[index]
            self.seen = self.seen[index]
            self.rows = [self.rows[i] for i in keep]
        self.job.post(StepOutput(tuple(deltas)))
        return not keep


class _ModelThread:
    """Owns the model: takes jobs from an inbox, steps their groups in turn."""

    BACKEND = "transformers/round-robin"

    def __init__(self, engine: TransformersEngine):
        self.engine = engine
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="millm-model", daemon=True)
        self._stopping = False
        self._queued = 0
        self._active_jobs: dict[int, int] = {}  # id(job) -> groups still running
        self._generated = 0
        self._completed = 0
        self._cancelled = 0
        self._failed = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._inbox.put(None)
        self._thread.join(timeout=10)

    def submit(self, job: GenerationJob) -> None:
        with self._lock:
            self._queued += 1
        self._inbox.put(job)

    def status(self) -> EngineStatus:
        with self._lock:
            return EngineStatus(
                backend=self.BACKEND,
                active_generations=len(self._active_jobs),
                queued_requests=self._queued,
                generated_tokens_total=self._generated,
                completed_generations_total=self._completed,
                cancelled_generations_total=self._cancelled,
            )

    def _admit(self, job: GenerationJob, running: list[_GroupRun]) -> None:
        with self._lock:
            self._queued -= 1
            if job.cancelled.is_set():
                # The caller left while the job waited: drop it without running.
                self._cancelled += 1
                return
            self._active_jobs[id(job)] = len(job.spec.groups)
        for group in job.spec.groups:
            running.append(_GroupRun(self.engine, job, group))

    def _leave(self, run: _GroupRun, outcome: str) -> None:
        """A group leaves: "done", "cancelled" (caller gone) or "failed"."""
        key = id(run.job)
        with self._lock:
            if key not in self._active_jobs:
                return  # another group of the same job already ended it
            if outcome != "done":
                del self._active_jobs[key]
                self._cancelled += outcome == "cancelled"
                self._failed += outcome == "failed"
                return
            self._active_jobs[key] -= 1
            if self._active_jobs[key] == 0:
                del self._active_jobs[key]
                self._completed += 1

    def _run(self) -> None:
        # Every tensor of every job lives on this thread, in inference mode.
        with torch.inference_mode():
            self._loop()

    def _loop(self) -> None:
        running: list[_GroupRun] = []
        while not self._stopping:
            try:
                item = self._inbox.get(block=not running)
                while item is not None:
                    self._admit(item, running)
                    item = self._inbox.get_nowait()
            except queue.Empty:
                pass
            for run in list(running):
                if run.job.cancelled.is_set():
                    running.remove(run)
                    self._leave(run, "cancelled")
                    continue
                try:
                    before = run.completion_tokens
                    done = run.step()
                    with self._lock:
                        self._generated += run.completion_tokens - before
                except Exception:
                    log.exception("generation step failed (request %s)", run.job.spec.request_id)
                    run.job.post(GroupFailed(internal_error()))
                    running.remove(run)
                    # The job's other groups stop too: the request has failed.
                    run.job.cancelled.set()
                    self._leave(run, "failed")
                    continue
                if done:
                    running.remove(run)
                    run.job.post(GroupDone(run.completion_tokens))
                    self._leave(run, "done")
        for run in running:
            run.job.cancelled.set()
