"""return_sae_activations: the request as sent, its checks, and the result.

The checks that need no model run in `check_request`; those that need the
prompt's length (the worst-case number of entries) in `check_size`, after
tokenization. Both refuse with 400 before anything is generated.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.errors import invalid_parameter
from service.steering import plan as runtime
from service.steering.recording import ActivationRecorder
from service.steering.sae import SaeWeights, check_feature_index

MAX_TOP_K = 64  # SAE_ACTIVATIONS_MAX_TOP_K
MAX_ENTRIES = 65536  # SAE_ACTIVATIONS_MAX_ENTRIES
DEFAULT_TOP_K = 8
MAX_FEATURES = 4096
PARAM = "return_sae_activations"
POSITION_KINDS = (runtime.LAST, runtime.PROMPT, runtime.COMPLETION, runtime.ALL)
READ_POINTS = (runtime.POST_STEERING, runtime.PRE_STEERING)
NOTE = {
    runtime.POST_STEERING: "post_steering is what the model computed at this layer for this "
    "request, after this layer's steering delta; it is not an unsteered counterfactual: "
    "steering at earlier layers and tokens generated under steering shaped it too.",
    runtime.PRE_STEERING: "pre_steering is the residual before this layer's own steering "
    "delta; it is not an unsteered counterfactual: steering at earlier layers and tokens "
    "generated under steering shaped it too.",
    runtime.UNSTEERED: "scoring is never steered: these are the unmodified model's "
    "activations for the prompt.",
}


@dataclass(frozen=True)
class ActivationRequest:
    sae_id: str = ""
    features: tuple[int, ...] | None = None
    top_k: int | None = None
    positions: str = runtime.LAST  # a POSITION_KINDS entry, or runtime.RANGE
    start: int = 0
    end: int = 0
    read_point: str = runtime.POST_STEERING


@dataclass(frozen=True)
class ActivationResult:
    sae_id: str
    layer: int
    read_point: str
    # (position, token id, ((feature, value), ...))
    positions: tuple
    note: str


def check_request(request: ActivationRequest, attached: dict[str, SaeWeights]
                  ) -> runtime.ActivationSpec:
    if not attached:
        raise invalid_parameter(f"{PARAM}.sae_id", "No SAE is attached, so there are no "
                                "activations to return; attach one first.")
    if request.sae_id:
        sae = attached.get(request.sae_id)
        if sae is None:
            raise invalid_parameter(f"{PARAM}.sae_id", f"No attached SAE has id "
                                    f"'{request.sae_id}'; attached: {', '.join(sorted(attached))}.")
    elif len(attached) > 1:
        raise invalid_parameter(f"{PARAM}.sae_id", "Several SAEs are attached; name one in "
                                f"'sae_id': {', '.join(sorted(attached))}.")
    else:
        sae = next(iter(attached.values()))
    if sae.info.transcoder:
        raise invalid_parameter(f"{PARAM}.sae_id", f"{sae.info.id} is a transcoder: its "
                                "features are read from its MLP's input, which is not read "
                                "here; it steers only.")
    features = None
    if request.features is not None:
        if not request.features:
            raise invalid_parameter(f"{PARAM}.features", "'features' must not be empty; leave "
                                    "it out to rank every feature.")
        if len(request.features) > MAX_FEATURES:
            raise invalid_parameter(f"{PARAM}.features", f"'features' takes at most "
                                    f"{MAX_FEATURES} indices.")
        for i, f in enumerate(request.features):
            check_feature_index(sae.info, f, f"{PARAM}.features[{i}]")
        features = tuple(dict.fromkeys(request.features))
    top_k = DEFAULT_TOP_K if request.top_k is None else request.top_k
    if not 1 <= top_k <= MAX_TOP_K:
        raise invalid_parameter(f"{PARAM}.top_k", f"'top_k' must be from 1 to {MAX_TOP_K}; "
                                f"got {top_k}.")
    if request.positions == runtime.RANGE:
        if request.start < 0 or request.end <= request.start:
            raise invalid_parameter(f"{PARAM}.positions", "'positions' as {start, end} needs "
                                    "0 <= start < end (end exclusive).")
    elif request.positions not in POSITION_KINDS:
        raise invalid_parameter(f"{PARAM}.positions", "'positions' must be last, prompt, "
                                "completion, all or {\"start\": int, \"end\": int}.")
    if request.read_point not in READ_POINTS:
        raise invalid_parameter(f"{PARAM}.read_point", "'read_point' must be post_steering or "
                                "pre_steering.")
    return runtime.ActivationSpec(sae, features, top_k, request.positions, request.start,
                                  request.end, request.read_point)


def check_size(spec: runtime.ActivationSpec, prompt_len: int, max_tokens: int) -> None:
    """The worst case, positions × top_k, counting max_tokens in full."""
    counts = {runtime.LAST: 1, runtime.PROMPT: prompt_len, runtime.COMPLETION: max_tokens,
              runtime.ALL: prompt_len + max_tokens, runtime.RANGE: spec.end - spec.start}
    worst = counts[spec.positions] * spec.top_k
    if worst > MAX_ENTRIES:
        raise invalid_parameter(PARAM, f"This readout could return {worst} entries "
                                f"(positions × top_k); the most is {MAX_ENTRIES}. Narrow "
                                "'positions', lower 'top_k' or 'max_tokens'.")


def result(spec: runtime.ActivationSpec, recorder: ActivationRecorder | None,
           read_point: str | None = None) -> ActivationResult:
    point = read_point or spec.read_point
    return ActivationResult(spec.sae.info.id, spec.layer, point,
                            tuple(recorder.entries) if recorder else (), NOTE[point])
