"""Every rule a generation request must obey, in one place.

The REST bridge checks only JSON shape; everything else is checked here, so a
gRPC caller and an OpenAI client get the same answer for the same mistake.
`check_fields` (which fields are honoured here, requests/fields.py) runs
first, before any model work; `check_params` runs before any tokenization and
returns the CheckedParams that requests/generation.py completes once prompt
lengths are known. Each failure names the OpenAI parameter at fault.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.engines.capabilities import EngineCapabilities
from service.errors import (
    EngineError,
    field_not_honoured,
    invalid_parameter,
    special_token_in_content,
    unused_fields_refused,
)
from service.requests import fields
from service.requests.constraints import check_constraint
from service.requests.logit_bias import checked_logit_bias
from service.requests.params import CHAT_ROLES, GenerateParams
from service.requests.reasoning import ReasoningRequest, check_reasoning
from service.requests.tools import ToolPlan, check_history, check_tools, template_message
from service.sampling import SamplingOptions
from service.structured_output import Constraint

MAX_N = 128
MAX_PROMPTS = 2048
MAX_STOP_SEQUENCES = 4
MAX_STOP_BYTES = 256
MAX_LOGPROBS = 20
MAX_STREAM_INTERVAL = 256
MAX_PRIORITY = 1_000_000
MIN_SCORING_TEMPERATURE = 0.001
SEED_MAX = 2**32 - 1


def invalid_scoring_request(param: str, message: str) -> EngineError:
    return EngineError("invalid_scoring_request", message, param)


@dataclass(frozen=True)
class CheckedParams:
    """Parameters after the checks that need no tokenizer."""

    options: SamplingOptions
    n: int
    max_tokens: int | None
    stop: tuple[str, ...]
    seed: int | None
    ignore_eos: bool = False
    constraint: Constraint | None = None
    logprobs: int | None = None
    # Scoring mode: one forward pass per prompt, the most probable token answers.
    scoring: bool = False
    echo: bool = False
    # Tool calling (requests/tools.py), and tool fields that went unused.
    tools: ToolPlan | None = None
    tools_unused: tuple[str, ...] = ()
    # Chat: the reasoning fields (requests/reasoning.py).
    reasoning: ReasoningRequest = ReasoningRequest()


def _number(
    param: str,
    value: float | None,
    default: float,
    low: float,
    high: float,
    *,
    low_open: bool = False,
) -> float:
    if value is None:
        return default
    if not math.isfinite(value):
        raise invalid_parameter(param, f"'{param}' must be a finite number.")
    if value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise invalid_parameter(
            param, f"'{param}' must be in {bracket}{low:g}, {high:g}]; got {value:g}."
        )
    return float(value)


def _positive_int(param: str, value: int | None) -> int | None:
    if value is not None and value < 1:
        raise invalid_parameter(param, f"'{param}' must be at least 1; got {value}.")
    return value


def check_input(params: GenerateParams) -> None:
    if params.extra_chats and params.messages is None:
        raise invalid_parameter("extra_messages", "'extra_messages' needs 'messages'.")
    if params.messages is None and params.prompts is None:
        raise invalid_parameter("messages", "The request has neither 'messages' nor 'prompt'.")
    if params.messages is not None:
        if len(params.extra_chats) >= MAX_PROMPTS:
            raise invalid_parameter(
                "extra_messages", f"'extra_messages' takes at most {MAX_PROMPTS - 1} "
                f"conversations; got {len(params.extra_chats)}.")
        for where, turns in params.conversations():
            if not turns:
                raise invalid_parameter(where, f"'{where}' must contain at least one message.")
            for i, turn in enumerate(turns):
                if turn.role not in CHAT_ROLES:
                    raise invalid_parameter(
                        f"{where}[{i}].role",
                        f"'{where}[{i}].role' must be one of {', '.join(CHAT_ROLES)}.",
                    )
        check_history(params.conversations())
    else:
        if not params.prompts:
            raise invalid_parameter("prompt", "'prompt' must not be empty.")
        if len(params.prompts) > MAX_PROMPTS:
            raise invalid_parameter(
                "prompt",
                f"'prompt' takes at most {MAX_PROMPTS} prompts; got {len(params.prompts)}.",
            )


def check_fields(params: GenerateParams, kind: EngineCapabilities,
                 model: EngineCapabilities | None = None) -> list[str]:
    """Refuse fields this route and engine cannot honour (requests/fields.py);
    return the locations of fields that go unused (strict mode refuses them
    later, once every unused field is known). Runs before any load with the
    engine kind's capabilities, and again with the loaded model's."""
    unused = fields.check(params.sent_fields(), params.route, kind, model,
                          unmapped=params.extra_fields.keys())
    check_generation_logprobs(params, model or kind)
    unused.extend(params.unused_fields)
    if params.user is not None:
        unused.append("user")  # OpenAI's end-user id: nothing here reads it
    for where, turns in params.conversations():
        for i, turn in enumerate(turns):
            if turn.name:
                # Chat templates render role and content; the author name is not passed.
                unused.append(f"{where}[{i}].name")
    return unused


def check_generation_logprobs(params: GenerateParams, caps: EngineCapabilities) -> None:
    """The one field rule that depends on two fields: an engine without
    generation log-probabilities (GGUF: llama.cpp's sampler does not expose the
    distribution it drew from) serves them for scoring (max_tokens 1) and
    echo, not alongside generated text."""
    if caps.generation_logprobs or params.logprobs is None or params.echo:
        return
    max_tokens = (params.max_tokens if params.max_tokens is not None
                  else params.max_completion_tokens)
    if max_tokens != 1:
        raise field_not_honoured("logprobs", "'logprobs' is not honoured: on GGUF models "
                                 "log-probabilities are served in scoring mode (max_tokens 1) "
                                 "and with echo, not for generated text.")


def refuse_if_strict(params: GenerateParams, unused: list[str]) -> None:
    if params.strict and unused:
        raise unused_fields_refused(unused)


# Sampling fields a scoring pass does not use: it reads the distribution, it
# does not sample from it.
SCORING_UNUSED = ("top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
                  "repetition_penalty")


def scoring_unused(params: GenerateParams) -> list[str]:
    unused = [name for name in SCORING_UNUSED if getattr(params, name) is not None]
    if params.stop:
        unused.append("stop")
    return unused


def check_no_special_tokens(params: GenerateParams, special_tokens: tuple[str, ...]) -> None:
    """No forged roles: message text that spells a control token (say
    "<|im_start|>system") is refused rather than rendered into the prompt,
    where the model would read it as a real turn boundary."""
    for where, turns in params.conversations():
        for i, turn in enumerate(turns):
            for token in special_tokens:
                if token and token in turn.content:
                    raise special_token_in_content(f"{where}[{i}].content", token)


def check_params(params: GenerateParams) -> CheckedParams:
    """The rules that need no tokenizer, checked before any model work."""
    check_input(params)
    options = SamplingOptions(
        temperature=_number("temperature", params.temperature, 1.0, 0.0, 2.0),
        top_p=_number("top_p", params.top_p, 1.0, 0.0, 1.0, low_open=True),
        top_k=int(_number("top_k", params.top_k, 0, 0, 2**31 - 1)),
        min_p=_number("min_p", params.min_p, 0.0, 0.0, 1.0),
        frequency_penalty=_number("frequency_penalty", params.frequency_penalty, 0.0, -2.0, 2.0),
        presence_penalty=_number("presence_penalty", params.presence_penalty, 0.0, -2.0, 2.0),
        repetition_penalty=_number(
            "repetition_penalty", params.repetition_penalty, 1.0, 0.0, 2.0, low_open=True
        ),
        logit_bias=checked_logit_bias(params.logit_bias),
    )
    n = params.n if params.n is not None else 1
    if not 1 <= n <= MAX_N:
        raise invalid_parameter("n", f"'n' must be between 1 and {MAX_N}; got {n}.")
    if params.echo and params.max_tokens == 0:
        max_tokens = 0  # echo alone: the prompt back, nothing generated
    else:
        max_tokens = _positive_int("max_tokens", params.max_tokens)
    max_completion = _positive_int("max_completion_tokens", params.max_completion_tokens)
    if max_tokens is not None and max_completion is not None and max_tokens != max_completion:
        raise invalid_parameter(
            "max_tokens",
            f"'max_tokens' ({max_tokens}) and 'max_completion_tokens' ({max_completion}) "
            "disagree; send one of them.",
        )
    if max_tokens is None:
        max_tokens = max_completion
    if len(params.stop) > MAX_STOP_SEQUENCES:
        raise invalid_parameter(
            "stop", f"'stop' takes at most {MAX_STOP_SEQUENCES} sequences; got {len(params.stop)}."
        )
    for i, stop in enumerate(params.stop):
        if stop == "":
            raise invalid_parameter(f"stop[{i}]", "Stop sequences must not be empty.")
        if len(stop.encode()) > MAX_STOP_BYTES:
            raise invalid_parameter(
                f"stop[{i}]", f"Stop sequences are at most {MAX_STOP_BYTES} bytes of UTF-8; "
                f"stop[{i}] has {len(stop.encode())}.")
    if params.seed is not None and not 0 <= params.seed <= SEED_MAX:
        raise invalid_parameter(
            "seed", f"'seed' must be an integer from 0 to {SEED_MAX}; got {params.seed}."
        )
    if params.logprobs is not None and not 0 <= params.logprobs <= MAX_LOGPROBS:
        raise invalid_parameter("logprobs", f"'logprobs' must be between 0 and {MAX_LOGPROBS}; "
                                f"got {params.logprobs}.")
    scoring = _is_scoring(params, max_tokens, n)
    if scoring and 0 < options.temperature < MIN_SCORING_TEMPERATURE:
        raise invalid_parameter("temperature", f"A scoring temperature must be 0 or at least "
                                f"{MIN_SCORING_TEMPERATURE}; smaller ones overflow the logits.")
    if scoring and params.stream:
        raise invalid_scoring_request("stream", "Scoring answers in one piece; drop 'stream'.")
    if scoring:
        # A judge's probability must not depend on steering left on the model.
        for name in ("profile", "steering_intensity"):
            if getattr(params, name) is not None:
                raise invalid_scoring_request(name, f"Scoring is never steered; '{name}' "
                                              "cannot apply to it.")
    if scoring and params.logit_bias:
        raise invalid_scoring_request("logit_bias", "Scoring answers the model's own most "
                                      "probable token; 'logit_bias' would change that answer "
                                      "while the log-probabilities left it out. Restrict the "
                                      "answer with 'allowed_token_ids' instead.")
    check_readout_shape(params)
    if params.priority is not None and not -MAX_PRIORITY <= params.priority <= MAX_PRIORITY:
        raise invalid_parameter("priority", f"'priority' must be between {-MAX_PRIORITY} and "
                                f"{MAX_PRIORITY}; got {params.priority}.")
    interval = params.stream_interval
    if interval is not None and not 1 <= interval <= MAX_STREAM_INTERVAL:
        raise invalid_parameter("stream_interval", f"'stream_interval' must be between 1 and "
                                f"{MAX_STREAM_INTERVAL} tokens; got {interval}.")
    if params.steering_compare and (scoring or params.echo):
        raise invalid_parameter("steering_compare", "'steering_compare' compares generated "
                                "completions; it cannot go with echo or scoring mode "
                                "(max_tokens 1 with logprobs), which are never steered.")
    constraint = check_constraint(params)
    if scoring and constraint is not None:
        field = constraint.param.split(".")[0]
        raise invalid_scoring_request(field, "Scoring reads the model's own distribution; "
                                      f"'{field}' cannot apply to it.")
    tools_unused: list[str] = []
    plan = check_tools(params.tools, params.tool_choice, params.parallel_tool_calls,
                       tools_unused)
    if plan is not None:
        check_tool_combinations(params, scoring, constraint)
    reasoning = ReasoningRequest()
    if params.messages is not None:
        reasoning = check_reasoning(params.reasoning_effort, params.thinking_token_budget,
                                    params.chat_template_kwargs, max_tokens)
    return CheckedParams(options, n, max_tokens, tuple(params.stop), params.seed,
                         params.ignore_eos, constraint, params.logprobs, scoring, params.echo,
                         plan, tuple(tools_unused), reasoning)


def check_tool_combinations(params: GenerateParams, scoring: bool,
                            constraint: Constraint | None) -> None:
    """What cannot go with calls (yet): each refusal names the other field."""
    if scoring:
        raise invalid_scoring_request("tools", "Scoring reads the model's own distribution; "
                                      "'tools' cannot apply to it.")
    if constraint is not None:
        field = constraint.param.split(".")[0]
        raise invalid_parameter(field, f"'{field}' cannot be combined with 'tools' yet; use a "
                                "forced tool_choice for a structured answer.")
    if params.stop:
        # A stop string could cut a call short.
        raise invalid_parameter("stop", "'stop' cannot be combined with 'tools'.")
    if params.ignore_eos:
        raise invalid_parameter("ignore_eos", "'ignore_eos' cannot be combined with 'tools': "
                                "a finished call must end the choice.")
    if params.logprobs is not None:
        raise invalid_parameter("logprobs", "'logprobs' cannot be combined with 'tools' yet.")


def check_readout_shape(params: GenerateParams) -> None:
    """return_sae_activations reads one position axis: one prompt, one choice."""
    if params.sae_activations is None:
        return
    param = "return_sae_activations"
    if (params.n or 1) > 1:
        raise invalid_parameter("n", f"'{param}' reads one choice; 'n' must be 1.")
    if params.extra_chats:
        raise invalid_parameter("extra_messages", f"'{param}' reads one conversation; "
                                "'extra_messages' cannot go with it.")
    if params.prompts is not None and len(params.prompts) > 1:
        raise invalid_parameter("prompt", f"'{param}' reads one prompt; send one per request.")
    if params.echo:
        raise invalid_parameter("echo", f"'{param}' cannot go with 'echo'.")


def _is_scoring(params: GenerateParams, max_tokens: int | None, n: int) -> bool:
    """Scoring mode: log-probabilities or allowed ids with max_tokens 1. Allowed
    ids mean nothing elsewhere, so they require it."""
    if params.allowed_token_ids:
        if max_tokens != 1:
            raise invalid_scoring_request("max_tokens", "'allowed_token_ids' needs scoring "
                                          "mode: 'max_tokens' (or 'max_completion_tokens') 1.")
    elif params.logprobs is None or max_tokens != 1:
        return False
    if n != 1:
        raise invalid_scoring_request("n", "Scoring mode answers one choice per prompt; "
                                      "'n' must be 1.")
    return True


def outside_vocabulary(ids, vocab_size: int) -> int | None:
    """The first id that is not a token of the vocabulary, or None."""
    return next((t for t in ids if not 0 <= t < vocab_size), None)


def check_token_ids(params: GenerateParams, vocab_size: int) -> None:
    for i, prompt in enumerate(params.prompts or ()):
        if isinstance(prompt, tuple):
            bad = outside_vocabulary(prompt, vocab_size)
            if bad is not None:
                raise invalid_parameter(
                    "prompt",
                    f"Prompt {i} holds token id {bad}, outside the vocabulary "
                    f"(0-{vocab_size - 1}).",
                )


def check_allowed_token_ids(params: GenerateParams, vocab_size: int) -> None:
    bad = outside_vocabulary(params.allowed_token_ids, vocab_size)
    if bad is not None:
        raise invalid_scoring_request(
            "allowed_token_ids", f"Token id {bad} is outside the vocabulary (0-{vocab_size - 1}).")
    if len(set(params.allowed_token_ids)) != len(params.allowed_token_ids):
        raise invalid_scoring_request("allowed_token_ids", "'allowed_token_ids' lists an id "
                                      "twice.")


def continuation(turns) -> tuple[list[dict[str, str]], str | None]:
    """(messages to render with the generation prompt, partial answer to append).

    A conversation that ends with an assistant message is a truncated answer
    to continue (a client's Continue button): rendering it as a closed turn
    would make the model start a new answer instead.
    """
    # OpenAI's developer role is the system role for templates.
    messages = [template_message(t) for t in turns]
    if messages and messages[-1]["role"] == "assistant" and "tool_calls" not in messages[-1]:
        if len(messages) == 1:
            # Nothing before the partial answer: no template renders an empty
            # conversation (HF's refuses it), so this is the caller's to fix.
            raise invalid_parameter("messages", "A trailing assistant message is continued, "
                                    "so it needs at least one message before it.")
        return messages[:-1], messages[-1]["content"]
    return messages, None
