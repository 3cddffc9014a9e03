"""What a running generation tells its caller, in order: GenerationStarted
(or, for echo, Echoed first), StepOutputs (generation/job.py), then
GenerationFinished, then ProbesRead when the model is monitored and
ActivationsRead when activations were asked for.
The servicers turn each into one protobuf response."""

from __future__ import annotations

from dataclasses import dataclass

from service.engines.scores import TokenScore
from service.steering import readout
from service.steering.probes import Verdict
from service.structured_output import Constraint


@dataclass(frozen=True)
class GenerationStarted:
    id: str
    created: int
    model: str
    system_fingerprint: str
    seed: int | None
    seed_scope: str | None
    prompt_tokens: int
    ignored_fields: tuple[str, ...] = ()
    constraint: Constraint | None = None
    # Steering headers: the resolved dial of a dialed request, the rung of a
    # circuit genuinely steering, and whether the pass is unsteered by rule (scoring).
    steering_echo: float | None = None
    circuit_rung: int | None = None
    unsteered: bool = False
    # (asked, applied) when max_tokens was capped to the window's room.
    max_tokens_cap: tuple[int, int] | None = None


@dataclass(frozen=True)
class EchoedPrompt:
    index: int
    text: str
    scores: tuple[TokenScore, ...]  # one per prompt token, or () without logprobs


@dataclass(frozen=True)
class Echoed:
    """Echoed prompts, before anything generated."""

    prompts: tuple[EchoedPrompt, ...]


@dataclass(frozen=True)
class ActivationsRead:
    """return_sae_activations' answer, after everything else."""

    result: readout.ActivationResult


@dataclass(frozen=True)
class ProbesRead:
    """The monitoring probes' verdicts, after GenerationFinished and before
    ActivationsRead."""

    verdicts: tuple[Verdict, ...]


@dataclass(frozen=True)
class GenerationFinished:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reasoning_tokens: int = 0  # of completion_tokens, those inside reasoning blocks
