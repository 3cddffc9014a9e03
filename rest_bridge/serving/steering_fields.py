"""The steering fields of the generation routes, both ways: the request's
profile, dial and return_sae_activations into GenerateRequest, and the
steering headers and the `millm` object (sae_activations, probe_verdicts) out
of the response. The fields arrive typed (protocol/base.py SharedFields); a
route with no place for activations (/v1/responses) lists them as UNMAPPED
and they reach the engine as an extra field instead."""

from __future__ import annotations

from millm.v1 import generation_pb2, monitoring_pb2, steering_pb2
from rest_bridge.errors import OpenAIError

INTENSITY_HEADER = "X-miLLM-Steering-Intensity"
RUNG_HEADER = "X-miLLM-Circuit-Rung"
STEERING_HEADER = "X-miLLM-Steering"

_SELECTORS = {
    "last": steering_pb2.POSITION_SELECTOR_LAST,
    "prompt": steering_pb2.POSITION_SELECTOR_PROMPT,
    "completion": steering_pb2.POSITION_SELECTOR_COMPLETION,
    "all": steering_pb2.POSITION_SELECTOR_ALL,
}
_READ_POINTS = {
    "post_steering": steering_pb2.READ_POINT_POST_STEERING,
    "pre_steering": steering_pb2.READ_POINT_PRE_STEERING,
}
_READ_POINT_NAMES = {
    steering_pb2.READ_POINT_POST_STEERING: "post_steering",
    steering_pb2.READ_POINT_PRE_STEERING: "pre_steering",
    steering_pb2.READ_POINT_UNSTEERED: "unsteered",
}
PARAM = "return_sae_activations"


def _one_of(value: str, choices: dict, param: str) -> int:
    if value not in choices:
        raise OpenAIError(400, f"'{param}' must be one of {', '.join(choices)}; got {value!r}.",
                          param=param, code="invalid_parameter")
    return choices[value]


def add_to_request(request, pb) -> None:
    if request.profile is not None:
        pb.profile = request.profile
    dial = request.steering_intensity
    if isinstance(dial, str):
        pb.steering_intensity.symbol = dial
    elif dial is not None:
        pb.steering_intensity.level = dial
    compare = getattr(request, "steering_compare", None)
    if compare and "steering_compare" not in getattr(request, "UNMAPPED", ()):
        pb.steering_compare = True
    # (The Messages API's schema declares no activations field: one sent
    # there is an extra field, for the engine to judge, not a spec.)
    spec = getattr(request, PARAM) if PARAM in type(request).model_fields else None
    if spec is None or PARAM in request.UNMAPPED:
        return
    out = pb.return_sae_activations
    out.SetInParent()
    out.sae_id = spec.sae_id or ""
    if spec.features is not None:
        # An empty list must reach the engine as sent (it refuses it), so it
        # travels in a message whose presence survives the wire.
        out.feature_selection.SetInParent()
        out.feature_selection.indices.extend(spec.features)
    if spec.top_k is not None:
        out.top_k = spec.top_k
    if isinstance(spec.positions, str):
        out.selector = _one_of(spec.positions, _SELECTORS, f"{PARAM}.positions")
    elif spec.positions is not None:
        out.range.start = spec.positions.start
        out.range.end = spec.positions.end
    if spec.read_point is not None:
        out.read_point = _one_of(spec.read_point, _READ_POINTS, f"{PARAM}.read_point")


def _quoted(text: str) -> str:
    """An RFC 8941 sf-string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def headers(meta: generation_pb2.ResponseMetadata) -> dict[str, str]:
    out = {}
    if meta.HasField("steering_intensity"):
        out[INTENSITY_HEADER] = repr(meta.steering_intensity)
    if meta.HasField("circuit_rung"):
        out[RUNG_HEADER] = (f"{meta.circuit_rung.rung}; "
                            f"language={_quoted(meta.circuit_rung.language)}")
    if meta.unsteered:
        out[STEERING_HEADER] = "none"
    return out


def activations_json(a: steering_pb2.SaeActivations) -> dict:
    return {
        "sae_id": a.sae_id,
        "layer": a.layer,
        "read_point": _READ_POINT_NAMES.get(a.read_point, "post_steering"),
        "positions": [
            {"position": p.position, "token_id": p.token_id,
             "features": [{"index": f.index, "value": f.value} for f in p.features]}
            for p in a.positions],
        "note": a.note,
    }


def millm_object(a: steering_pb2.SaeActivations) -> dict:
    return {"sae_activations": activations_json(a)}


def divergence_json(c: generation_pb2.SteeringComparison) -> list[dict]:
    """millm.divergence: per steered choice, each token's log-probability
    steered and unsteered, their difference and the KL divergence."""
    return [{"index": choice.index, "tokens": [
        {"token": t.token, "token_id": t.token_id, "logprob": t.logprob,
         "unsteered_logprob": t.unsteered_logprob,
         "logprob_diff": t.logprob - t.unsteered_logprob, "kl": t.kl} for t in choice.tokens]}
        for choice in c.choices]


def verdicts_json(v: monitoring_pb2.ProbeVerdicts) -> list[dict]:
    return [{"probe": x.probe, "sae_id": x.sae_id, "layer": x.layer, "fired": x.fired,
             "peak": x.peak, "threshold": x.threshold,
             "first_position": x.first_position if x.HasField("first_position") else None,
             "positions_read": x.positions_read} for x in v.verdicts]
