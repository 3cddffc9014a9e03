"""The value a generation runs as: one frozen, typed request with every
default resolved and every rule checked (TGI's ValidGenerateRequest).

`fit_groups` fits each prompt and its completion into the context window once
prompt lengths are known; `ValidatedGeneration` is then built once, by
InferenceService.prepare, already holding the steering plan, the readout spec,
the structured-output constraint and its grammar. Nothing changes it
afterwards: the engines, the scheduler and the servicers only read it.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from service.errors import context_length_exceeded, invalid_parameter
from service.requests.checks import CheckedParams, invalid_scoring_request
from service.requests.params import GenerateParams
from service.requests.reasoning import ReasoningPlan
from service.requests.tools import ToolPlan
from service.sampling import SamplingOptions
from service.structured_output import Constraint

if TYPE_CHECKING:
    from xgrammar import CompiledGrammar

    from service.steering.manager import Resolved
    from service.steering.plan import ActivationSpec, SteeringPlan
    from service.steering.probes import MonitorSpec


@dataclass(frozen=True)
class PromptGroup:
    """One prompt and the n choices sampled from it."""

    prompt_ids: tuple[int, ...]
    n: int
    max_tokens: int
    # Choice index of this group's first row (prompt i starts at i * n).
    first_index: int
    # One seed per row: rows never share a random generator.
    row_seeds: tuple[int, ...]


@dataclass(frozen=True)
class ValidatedGeneration:
    """A request with every default resolved and every rule checked."""

    request_id: str
    model: str
    groups: tuple[PromptGroup, ...]
    options: SamplingOptions
    stop: tuple[str, ...]
    seed: int | None
    ignore_eos: bool = False
    # Locations of fields the request carried but nothing used (reported back).
    ignored_fields: tuple[str, ...] = ()
    # response_format, and its compiled grammar (each row gets a matcher of it).
    constraint: Constraint | None = None
    grammar: CompiledGrammar | None = None
    # Log-probabilities: alternatives per token, None when not asked for.
    logprobs: int | None = None
    # Scoring mode: one forward pass per prompt, nothing sampled.
    scoring: bool = False
    echo: bool = False
    allowed_token_ids: tuple[int, ...] | None = None
    prompt_texts: tuple[str, ...] = ()  # echo: each prompt as text
    # This request's own steering; None: unsteered.
    steering: SteeringPlan | None = None
    # What the steering headers report: the resolved dial (None: no echo) and
    # the circuit rung when a circuit genuinely steers.
    steering_echo: float | None = None
    circuit_rung: int | None = None
    # return_sae_activations, checked.
    activations: ActivationSpec | None = None
    # Tool calling: the tools and the choice (its grammar is `grammar`).
    tools: ToolPlan | None = None
    # Monitoring: the probes that read this generation (None: not monitored).
    monitoring: MonitorSpec | None = None
    # A model with a reasoning format: where its answer starts, and the budget.
    reasoning: ReasoningPlan | None = None
    # max_tokens as the request asked it (None: unset).
    max_tokens_asked: int | None = None
    # Read whole by its caller: the model thread holds its steps and posts
    # them joined as each group ends (generation/step_posts.py), one wake of
    # the caller a group instead of one a step.
    whole: bool = False
    # Scheduling class: lower starts first; above 0 is background
    # (engines/admission.py).
    priority: int = 0

    @property
    def prompt_tokens(self) -> int:
        return sum(len(g.prompt_ids) for g in self.groups)

    @property
    def max_tokens_cap(self) -> tuple[int, int] | None:
        """(asked, the most any choice may now generate) when the window
        left less than max_tokens beside a prompt; None when it fit."""
        if self.max_tokens_asked is None or self.scoring:
            return None
        used = min(g.max_tokens for g in self.groups)
        return (self.max_tokens_asked, used) if used < self.max_tokens_asked else None


def row_seeds(seed: int | None, n: int) -> tuple[int, ...]:
    """One generator seed per choice. Choice 0 uses the seed itself; the others
    derive theirs from (seed, choice) so choices differ but stay reproducible."""
    if seed is None:
        return tuple(secrets.randbits(63) for _ in range(n))
    seeds = [seed]
    for j in range(1, n):
        digest = hashlib.sha256(f"millm-seed:{seed}:{j}".encode()).digest()
        seeds.append(int.from_bytes(digest[:8], "big") >> 1)
    return tuple(seeds)


# Choices one request may ask to generate (n x prompts or conversations): a
# request holds at most MILLM_MAX_ROWS_PER_REQUEST of them at once and runs the
# rest in parts (engines/transformers/scheduler.py); past this it is refused.
MAX_REQUEST_ROWS = 2048

# OpenAI's legacy completions stop after 16 tokens unless told otherwise; chat
# completions run until the model ends its turn or the context is full.
RAW_PROMPT_DEFAULT_MAX_TOKENS = 16


def _default_max_tokens(what: str, room: int) -> int:
    return room if what == "messages" else min(RAW_PROMPT_DEFAULT_MAX_TOKENS, room)


def fit_groups(params: GenerateParams, checked: CheckedParams,
               prompt_ids: list[list[int]], context_window: int) -> tuple[PromptGroup, ...]:
    """Fit each prompt and its completion into the context window."""
    what = "messages" if params.messages is not None else "prompt"
    labels = ([where for where, _ in params.conversations()] if params.messages is not None
              else [what if len(prompt_ids) == 1 else f"prompt[{i}]"
                    for i in range(len(prompt_ids))])
    groups = []
    for i, ids in enumerate(prompt_ids):
        label = labels[i]
        if not ids:
            refuse = invalid_scoring_request if checked.scoring else invalid_parameter
            raise refuse(what, f"The {label} tokenizes to no tokens.")
        room = context_window - len(ids)
        wanted = checked.max_tokens if checked.max_tokens is not None else 1
        # A prompt that fits with room to spare runs, its max_tokens capped to
        # that room (finish_reason "length" when a choice reaches it, the cap
        # reported: ResponseMetadata.max_tokens_cap); strict mode refuses it.
        if (room < 1 and wanted > 0) or (wanted > room and params.strict):
            raise context_length_exceeded(
                what,
                f"This model's maximum context length is {context_window} tokens. However, you "
                f"requested {len(ids) + wanted} tokens ({len(ids)} in the {label}, "
                f"{wanted} in the completion). Please reduce the length of the "
                f"{what} or of the completion.",
            )
        groups.append(
            PromptGroup(
                prompt_ids=tuple(ids),
                n=checked.n,
                max_tokens=(min(checked.max_tokens, room) if checked.max_tokens is not None
                            else _default_max_tokens(what, room)),
                first_index=i * checked.n,
                # Each prompt is seeded separately: its text does not depend on
                # where it sits in the list.
                row_seeds=row_seeds(checked.seed, checked.n),
            )
        )
    rows = checked.n * len(groups)
    if rows > MAX_REQUEST_ROWS and not checked.scoring and groups[0].max_tokens > 0:
        param = ("n" if checked.n > 1 else "extra_messages" if params.messages is not None
                 else "prompt")
        raise invalid_parameter(param, f"This request asks for {rows} choices ({checked.n} "
                                f"per prompt x {len(groups)}); one request may generate at "
                                f"most {MAX_REQUEST_ROWS}. Lower 'n' or split the request.")
    return tuple(groups)


def validated(params: GenerateParams, checked: CheckedParams, groups: tuple[PromptGroup, ...],
              request_id: str, *, ignored_fields: tuple[str, ...] = (),
              grammar: CompiledGrammar | None = None, prompt_texts: tuple[str, ...] = (),
              steering: Resolved | None = None,
              activations: ActivationSpec | None = None,
              monitoring: MonitorSpec | None = None,
              reasoning: ReasoningPlan | None = None) -> ValidatedGeneration:
    """The one place a ValidatedGeneration is built, from the checked
    parameters, the fitted groups and what needed the model."""
    return ValidatedGeneration(
        request_id=request_id,
        model=params.model,
        groups=groups,
        options=checked.options,
        stop=checked.stop,
        seed=checked.seed,
        ignore_eos=checked.ignore_eos,
        ignored_fields=ignored_fields,
        constraint=checked.constraint,
        grammar=grammar,
        logprobs=checked.logprobs,
        scoring=checked.scoring,
        echo=checked.echo,
        allowed_token_ids=tuple(params.allowed_token_ids) or None,
        prompt_texts=prompt_texts,
        steering=steering.plan if steering else None,
        steering_echo=steering.echo if steering else None,
        circuit_rung=steering.rung if steering else None,
        activations=activations,
        tools=checked.tools,
        monitoring=None if checked.scoring else monitoring,
        reasoning=reasoning,
        max_tokens_asked=checked.max_tokens,
        # steering_compare pairs the two jobs' steps as they come; a reasoning
        # split counts each token on its side of the block's end.
        whole=params.whole and not params.steering_compare and reasoning is None,
        priority=params.priority or 0,
    )


def resolve(params: GenerateParams, checked: CheckedParams, prompt_ids: list[list[int]],
            context_window: int, request_id: str) -> ValidatedGeneration:
    """An unsteered request's value from its prompts alone (unit tests)."""
    return validated(params, checked, fit_groups(params, checked, prompt_ids, context_window),
                     request_id)
