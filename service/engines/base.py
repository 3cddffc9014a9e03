"""What every engine offers the rest of the process."""

from __future__ import annotations

import abc
import asyncio
from dataclasses import dataclass

from service.generation_job import GenerationJob
from service.model_registry import ModelEntry


@dataclass(frozen=True)
class LoadedModel:
    """Facts about the loaded model that validation and responses need."""

    id: str
    engine: str
    context_window: int
    vocab_size: int
    dtype: str
    quantization: str
    revision: str | None

    @property
    def system_fingerprint(self) -> str:
        # Parts nobody recorded are written as such, never guessed.
        revision = self.revision or "unrecorded"
        return f"millm:{self.id}@{revision}:{self.dtype}/{self.quantization}:{self.engine}"


@dataclass(frozen=True)
class EngineStatus:
    backend: str
    active_generations: int
    queued_requests: int
    generated_tokens_total: int
    completed_generations_total: int
    cancelled_generations_total: int
    failed_generations_total: int = 0
    running_rows: int = 0
    lanes: int = 0
    max_batch: int = 0
    max_queued: int = 0
    kv_tokens_in_use: int = 0
    kv_padding_tokens: int = 0
    prefix_cache_tokens: int = 0
    prefix_cache_hit_tokens_total: int = 0


class Engine(abc.ABC):
    """A loaded model plus the thread that runs its generations."""

    def __init__(self, entry: ModelEntry):
        self.entry = entry

    @abc.abstractmethod
    def load(self) -> LoadedModel:
        """Load weights and tokenizer (blocking; call from a worker thread)."""

    @property
    @abc.abstractmethod
    def special_tokens(self) -> tuple[str, ...]:
        """The text of every control token, which message text may not spell."""

    @abc.abstractmethod
    def encode_chat(self, messages: list[dict[str, str]], partial: str | None = None) -> list[int]:
        """Render a conversation with the chat template and its generation
        prompt, append `partial` (an answer to continue) raw, and tokenize."""

    @abc.abstractmethod
    def encode_text(self, text: str, parse_special: bool = False,
                    add_special: bool = True) -> list[int]:
        """Tokenize a raw prompt; special-token text stays text unless parse_special."""

    def call(self, fn):
        """Run fn(model context) on the model thread; returns an awaitable."""
        raise NotImplementedError(f"{type(self).__name__} cannot read the model directly")

    def grammar_for(self, constraint):
        """The compiled grammar of a response_format (blocking; worker thread)."""
        raise NotImplementedError(f"{type(self).__name__} cannot constrain output")

    @abc.abstractmethod
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start running submitted jobs."""

    @abc.abstractmethod
    def submit(self, job: GenerationJob) -> None:
        """Queue a job; its events arrive on job.queue."""

    @abc.abstractmethod
    def status(self) -> EngineStatus: ...

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Stop the model thread; jobs still running are cancelled."""
