"""The one interface every engine implements, and what callers may rely on.

Callers (the data plane, the lifecycle, steering, the status RPCs) see an
`Engine` and its `EngineCapabilities`, never a concrete class: what an engine
can do is data, read from `capabilities`, not found by asking which engine it
is or probing its attributes. `KIND_CAPABILITIES` says what each kind offers at
best, before anything is loaded (so a field no engine of that kind can honour
is refused before a load); a loaded engine's `capabilities` can only be
narrower (a transformers model whose layers the steering hooks cannot reach
does not steer).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from service.engines.capabilities import KIND_CAPABILITIES, EngineCapabilities
from service.models.registry import ModelEntry

if TYPE_CHECKING:
    from service.engines.scores import ScoredPrompt, StepDivergence
    from service.formats import ModelFormat
    from service.generation.job import GenerationJob
    from service.requests.tools import ToolPlan
    from service.steering.plan import SteeringPlan
    from service.steering.recording import ActivationRecorder
    from service.structured_output import Constraint


class ModelSteering(Protocol):
    """What the steering manager needs of an engine that steers: the residual
    stream's width, the blocks an SAE may hook, and where and in which dtype
    an attached SAE's weights live. Each engine applies a plan its own way
    (steering/plan.py)."""

    hidden_size: int
    num_layers: int
    device: object  # a torch.device
    dtype: object  # a torch.dtype


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
    # The longest embedding input, where an engine reads fewer tokens at once
    # for embeddings than it generates over (GGUF: engines/gguf/kv_plan.py).
    embedding_window: int | None = None

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
    """A loaded model plus the thread that runs its work. Blocking methods are
    called from worker threads, or on the event loop when their input is short
    (service/tokenizer_calls.py), so they never wait on the model thread; the
    awaitable ones run on the model thread."""

    kind: str  # TRANSFORMERS or GGUF: the key of KIND_CAPABILITIES
    # The family syntax of its output (service/formats), set by the lifecycle
    # once the model is loaded.
    format: ModelFormat | None = None

    def __init__(self, entry: ModelEntry):
        self.entry = entry

    # -- loading ----------------------------------------------------------------------

    @abc.abstractmethod
    def load(self) -> LoadedModel:
        """Load weights and tokenizer (blocking; call from a worker thread)."""

    @abc.abstractmethod
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the model thread; `capabilities` is final from here on."""

    @property
    def kind_capabilities(self) -> EngineCapabilities:
        """What this kind of engine offers at best (what a refusal before any
        load was judged by)."""
        return KIND_CAPABILITIES[self.kind]

    @property
    def capabilities(self) -> EngineCapabilities:
        """What this engine does with the model it has loaded."""
        return self.kind_capabilities

    @property
    def steering(self) -> ModelSteering | None:
        """How this engine steers its model, when `capabilities.steer`."""
        return None

    def divergence(self, ids: list[int], start: int, plan: SteeringPlan | None
                   ) -> Awaitable[list[StepDivergence]]:
        """ids[start:] (a generated completion) read under `plan` and with no
        steering, one teacher-forced pass each: engines/scores.py's
        divergence of the two (steering_compare)."""
        raise NotImplementedError

    def unembedding(self):
        """The output embedding [vocab, hidden] as a float32 torch tensor on
        the CPU, for a feature card's promoted tokens (blocking; None when
        this engine cannot read it)."""
        return None

    # -- text -------------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def special_tokens(self) -> tuple[str, ...]:
        """The text of every control token, which message text may not spell."""

    @property
    @abc.abstractmethod
    def has_chat_template(self) -> bool:
        """Whether the model brought its own chat template (else ChatML is used)."""

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template renders `tools` and tool turns itself:
        whether it names them at all (the same rule for every engine)."""
        return "tools" in self.chat_template

    @property
    @abc.abstractmethod
    def chat_template(self) -> str:
        """The template text conversations are rendered with (ChatML when
        the model brought none)."""

    @abc.abstractmethod
    def encode_chat(self, messages: list[dict], partial: str | None = None,
                    tools: list[dict] | None = None, template_kwargs: dict | None = None,
                    *, generation_prompt: bool = True, add_special: bool = False) -> list[int]:
        """Render a conversation (Hugging Face template shape, tool turns
        included) with the chat template, `tools`, `template_kwargs` (say
        enable_thinking) and (unless told not to) its generation prompt,
        append `partial` (an answer to continue) raw, and tokenize;
        `add_special` adds the tokenizer's BOS on top of what the template
        writes (POST /tokenize's add_special_tokens)."""

    @abc.abstractmethod
    def encode_text(self, text: str, parse_special: bool = False,
                    add_special: bool = True) -> list[int]:
        """Tokenize a raw prompt; special-token text stays text unless parse_special."""

    @abc.abstractmethod
    def decode(self, ids: list[int]) -> str:
        """Token ids back to text (blocking)."""

    @abc.abstractmethod
    def detokenize(self, ids: list[int]) -> str:
        """Token ids back to text with special tokens written out (POST
        /detokenize; blocking)."""

    @abc.abstractmethod
    def token_strings(self, ids: list[int]) -> list[str]:
        """Each id's string as the vocabulary stores it (byte-level pieces
        such as "Ġthe"), for POST /tokenize's token_strs."""

    async def grammar_for(self, constraint: Constraint | ToolPlan):
        """The compiled grammar of a response_format or a tool plan, from the
        engine's GrammarCache (service/grammars.py: its own thread, a time
        limit). Only called when `capabilities.grammar`."""
        raise NotImplementedError(f"{type(self).__name__} cannot constrain output")

    # -- work ---------------------------------------------------------------------------

    @abc.abstractmethod
    def submit(self, job: GenerationJob) -> None:
        """Queue a generation; its events arrive on the job (queue_full when full)."""

    @abc.abstractmethod
    def score(self, prompts: list[list[int]], *, temperature: float,
              allowed: list[int] | None, top: int, echo: bool, next_token: bool,
              plan: SteeringPlan | None = None,
              recorder: ActivationRecorder | None = None) -> Awaitable[list[ScoredPrompt]]:
        """One reading pass per prompt (engines/scores.py's shapes): the next
        token's score, and with echo every prompt token's. Unsteered unless
        `plan` is given; `recorder` reads activations on the way."""

    @abc.abstractmethod
    def embed(self, inputs: list[list[int]]) -> Awaitable[list[list[float]]]:
        """One mean-pooled last-layer vector per tokenized input, unsteered."""

    @abc.abstractmethod
    async def clear_prefix_cache(self) -> int:
        """Drop every cached prompt prefix; returns the tokens freed."""

    @abc.abstractmethod
    def status(self) -> EngineStatus: ...

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Stop the model thread; work still queued or running is ended."""
