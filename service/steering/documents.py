"""The shapes operators write: steering entries (live values and profiles),
and the cluster and circuit documents they import (docs/steering.md).

Each parser checks everything at once it can without the model and names the
location of the first problem (`members[3].strength`). Checks that need the
attached SAEs (a feature past an SAE's width) happen when steering applies.

An entry is of one of two kinds: an SAE feature (layer, feature, strength) or
a llama.cpp control vector (control_vector, scale; steering/control_vectors.py),
which needs no SAE and adds at every layer its file has a direction for.
Either has a mode: `add` (the default: strength or scale), `clamp` (`value`:
the feature's activation, or the stream's component along the vector's
direction, set to it) or `ablate` (the feature driven to zero, the direction
projected out); and may hold a condition (`when`, steering/conditions.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from service.errors import EngineError
from service.state.database import check_storable
from service.steering import conditions
from service.steering.conditions import Condition
from service.steering.intensity import ENVELOPE, MAX_STRENGTH
from service.steering.plan import ABLATE, ADD, CLAMP
from service.steering.plan import MODES as ENTRY_MODES

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_ENTRIES = 4096
CLUSTER_FORMAT = "millm.cluster.v1"
CIRCUIT_FORMAT = "millm.circuit.v1"
FULL, SLICE_FALLBACK = "full", "slice_fallback"
MODES = (FULL, SLICE_FALLBACK)
# The evidence ladder: a rung's language is rendered from here, never composed
# per request, and nothing below rung 2 is called causal.
RUNG_LANGUAGE = {
    0: "associated",
    1: "suggested (attribution-supported)",
    2: "causally validated (edge)",
    3: "faithfulness-tested (circuit)",
}


def invalid_document(param: str, message: str) -> EngineError:
    return EngineError("invalid_document", message, param)


@dataclass(frozen=True)
class SteeringEntry:
    """Feature `feature` of the SAE attached at `layer`, added at `strength`.
    `sae_id`, when given, pins the SAE the index was chosen on.

    With `control_vector` set, the entry is that control vector at scale
    `strength` (the dial scales it the same way), and `layer` and `feature`
    are -1: it belongs to no SAE layer."""

    layer: int
    feature: int
    strength: float  # add only (0 for the other modes)
    sae_id: str = ""
    control_vector: str = ""
    mode: str = ADD
    value: float = 0.0  # clamp only
    when: Condition | None = None

    @property
    def key(self) -> tuple:
        """What two entries of one list must not share."""
        if self.mode == ABORT:
            return ("abort", self.when)
        return ("vector", self.control_vector) if self.control_vector else (
            self.layer, self.feature)

    def to_json(self) -> dict:
        if self.mode == ABORT:
            return {"abort_when": self.when.to_json()}
        if self.control_vector:
            out = {"control_vector": self.control_vector}
            if self.mode == ADD:
                out["scale"] = self.strength
        else:
            out = {"layer": self.layer, "feature": self.feature}
            if self.mode == ADD:
                out["strength"] = self.strength
            if self.sae_id:
                out["sae_id"] = self.sae_id
        if self.mode != ADD:
            out["mode"] = self.mode
        if self.mode == CLAMP:
            out["value"] = self.value
        if self.when is not None:
            out["when"] = self.when.to_json()
        return out


def _int(value, where: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise invalid_document(where, f"'{where}' must be an integer of at least {low}.")
    return value


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise invalid_document(where, f"'{where}' must be a finite number.")
    return float(value)


def _only(doc: dict, where: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()):
    prefix = f"{where}." if where else ""
    for key in doc:
        if key not in allowed:
            raise invalid_document(f"{prefix}{key}", f"Unknown field '{prefix}{key}' (allowed: "
                                   f"{', '.join(allowed)}).")
    for key in required:
        if key not in doc:
            raise invalid_document(f"{prefix}{key}", f"Missing field '{prefix}{key}'.")


def parse_name(value, where: str = "name") -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise invalid_document(where, f"'{where}' must be 1-64 letters, digits, '_', '.' or '-', "
                               "starting with a letter or digit.")
    return value


def _strength(raw: dict, where: str, key: str) -> float:
    strength = _number(raw[key], f"{where}.{key}")
    if abs(strength) > MAX_STRENGTH:
        raise invalid_document(f"{where}.{key}", f"'{where}.{key}' must be within "
                               f"±{MAX_STRENGTH:g}; got {strength:g}.")
    return strength


def _mode(raw: dict, where: str, amount: str, vector: bool) -> tuple[str, float, float]:
    """(mode, strength, value): add needs `amount` (strength or scale), clamp
    needs `value` and takes no amount, ablate takes neither."""
    mode = raw.get("mode", ADD)
    if mode not in ENTRY_MODES:
        raise invalid_document(f"{where}.mode", f"'{where}.mode' must be one of "
                               f"{', '.join(ENTRY_MODES)}; got {mode!r}.")
    if mode == ADD:
        if amount not in raw:
            raise invalid_document(f"{where}.{amount}", f"Missing field '{where}.{amount}'.")
        if "value" in raw:
            raise invalid_document(f"{where}.value", f"'{where}.value' is for mode clamp.")
        return mode, _strength(raw, where, amount), 0.0
    if amount in raw:
        raise invalid_document(f"{where}.{amount}", f"'{where}.{amount}' is for mode add; "
                               f"an {mode} entry " + ("takes no amount." if mode == ABLATE
                                                       else "sets 'value'."))
    if mode == ABLATE:
        if "value" in raw:
            raise invalid_document(f"{where}.value", f"'{where}.value' is for mode clamp.")
        return mode, 0.0, 0.0
    if "value" not in raw:
        raise invalid_document(f"{where}.value", f"Missing field '{where}.value' (mode clamp).")
    value = _number(raw["value"], f"{where}.value")
    if abs(value) > MAX_STRENGTH:
        raise invalid_document(f"{where}.value", f"'{where}.value' must be within "
                               f"±{MAX_STRENGTH:g}; got {value:g}.")
    if value < 0 and not vector:
        raise invalid_document(f"{where}.value", f"'{where}.value' must be 0 or more: an SAE "
                               f"feature's activation is never negative; got {value:g}.")
    return mode, 0.0, value


def _when(raw: dict, where: str, layer: int = -1) -> Condition | None:
    return conditions.parse(raw["when"], f"{where}.when", layer) if "when" in raw else None


def _abort_entry(raw: dict, where: str) -> SteeringEntry:
    """`{"abort_when": condition}`: the row ends (finish reason
    content_filter) where the condition holds. Only conditions read from the
    stream end a row: a text is what `stop` is for, a position `max_tokens`."""
    _only(raw, where, ("abort_when", "label"), ("abort_when",))
    when = conditions.parse(raw["abort_when"], f"{where}.abort_when")
    if when.kind not in conditions.SCORED:
        raise invalid_document(f"{where}.abort_when", f"'{where}.abort_when' takes a probe or "
                               "feature condition (end on a text with 'stop', at a length "
                               "with 'max_tokens').")
    return SteeringEntry(-1, -1, 0.0, mode=ABORT, when=when)


_COMMON = ("mode", "value", "when", "label")
ABORT = "abort"  # an abort_when entry's mode (it steers nothing)


def _vector_entry(raw: dict, where: str) -> SteeringEntry:
    _only(raw, where, ("control_vector", "scale", *_COMMON), ("control_vector",))
    name = raw["control_vector"]
    if not isinstance(name, str) or not name:
        raise invalid_document(f"{where}.control_vector", f"'{where}.control_vector' must be "
                               "a control vector's id.")
    mode, strength, value = _mode(raw, where, "scale", vector=True)
    return SteeringEntry(-1, -1, strength, control_vector=name, mode=mode, value=value,
                         when=_when(raw, where))


def parse_entry(raw, where: str) -> SteeringEntry:
    if not isinstance(raw, dict):
        raise invalid_document(where, f"'{where}' must be an object.")
    if "control_vector" in raw:
        return _vector_entry(raw, where)
    if "abort_when" in raw:
        return _abort_entry(raw, where)
    _only(raw, where, ("layer", "feature", "strength", "sae_id", *_COMMON),
          ("layer", "feature"))
    layer, feature = _int(raw["layer"], f"{where}.layer"), _int(raw["feature"],
                                                                f"{where}.feature")
    sae_id = raw.get("sae_id", "")
    if not isinstance(sae_id, str):
        raise invalid_document(f"{where}.sae_id", f"'{where}.sae_id' must be a string.")
    mode, strength, value = _mode(raw, where, "strength", vector=False)
    return SteeringEntry(layer, feature, strength, sae_id, mode=mode, value=value,
                         when=_when(raw, where, layer))


def under_condition(raw: list, when, where: str) -> list:
    """A profile's condition (`when` beside its entries) given to every entry
    without one of its own; abort_when entries are conditions themselves.
    Checked here first, so a bad one is named where it was written."""
    conditions.parse(when, where, layer=0)
    return [{**e, "when": when} if isinstance(e, dict) and "when" not in e
            and "abort_when" not in e else e for e in raw]


def parse_entries(raw, where: str, allow_empty: bool = True) -> tuple[SteeringEntry, ...]:
    if not isinstance(raw, list):
        raise invalid_document(where, f"'{where}' must be a list.")
    if not raw and not allow_empty:
        raise invalid_document(where, f"'{where}' must hold at least one member.")
    if len(raw) > MAX_ENTRIES:
        raise invalid_document(where, f"'{where}' holds at most {MAX_ENTRIES} entries.")
    entries = tuple(parse_entry(e, f"{where}[{i}]") for i, e in enumerate(raw))
    distinct = {e.when for e in entries if e.when is not None}
    if len(distinct) > conditions.MAX_CONDITIONS:
        raise invalid_document(where, f"'{where}' holds at most {conditions.MAX_CONDITIONS} "
                               "distinct conditions.")
    seen: dict[tuple, int] = {}
    for i, e in enumerate(entries):
        if e.key in seen:
            what = (f"control vector {e.control_vector}" if e.control_vector
                    else "abort_when" if e.mode == ABORT
                    else f"layer {e.layer} feature {e.feature}")
            raise invalid_document(f"{where}[{i}]", f"'{where}[{i}]' repeats {what} of "
                                   f"{where}[{seen[e.key]}].")
        seen[e.key] = i
    return entries


def parse_range(raw, where: str = "intensity_range") -> tuple[float, float] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != 2:
        raise invalid_document(where, f"'{where}' must be [min, max].")
    low, high = _number(raw[0], f"{where}[0]"), _number(raw[1], f"{where}[1]")
    if not 0 <= low <= high:
        raise invalid_document(where, f"'{where}' must satisfy 0 <= min <= max; got "
                               f"[{low:g}, {high:g}].")
    return low, high


def check_dial(value, high: float, where: str = "intensity") -> float:
    """A stored dial: management bounds [0, max]."""
    level = _number(value, where)
    if not 0 <= level <= high:
        raise invalid_document(where, f"'{where}' must be from 0 to {high:g}; got {level:g}.")
    return level


@dataclass(frozen=True)
class Cluster:
    name: str
    members: tuple[SteeringEntry, ...]
    intensity_range: tuple[float, float] | None
    intensity: float
    description: str = ""

    def document(self) -> dict:
        doc = {"format": CLUSTER_FORMAT, "name": self.name, "description": self.description,
               "members": [m.to_json() for m in self.members], "intensity": self.intensity}
        if self.intensity_range is not None:
            doc["intensity_range"] = list(self.intensity_range)
        return doc


@dataclass(frozen=True)
class Circuit:
    name: str
    rung: int
    members: tuple[SteeringEntry, ...]
    intensity_range: tuple[float, float] | None
    intensity: float
    mode: str = FULL
    fallback_cluster: str = ""
    description: str = ""
    edges: list = field(default_factory=list)

    @property
    def language(self) -> str:
        return RUNG_LANGUAGE[self.rung]

    def document(self) -> dict:
        doc = {"format": CIRCUIT_FORMAT, "name": self.name, "description": self.description,
               "rung": self.rung, "members": [m.to_json() for m in self.members],
               "intensity": self.intensity, "mode": self.mode, "edges": self.edges}
        if self.intensity_range is not None:
            doc["intensity_range"] = list(self.intensity_range)
        if self.fallback_cluster:
            doc["fallback_cluster"] = self.fallback_cluster
        return doc


def _common(doc, fmt: str, extra: tuple[str, ...], stored: bool) -> None:
    if not isinstance(doc, dict):
        raise invalid_document("", "The document must be a JSON object.")
    _only(doc, "", ("format", "name", "description", "members", "intensity_range", "intensity",
                    *extra), ("name", "members"))
    if "format" in doc and doc["format"] != fmt:
        raise invalid_document("format", f"'format' must be {fmt!r}; got {doc['format']!r}.")
    if not isinstance(doc.get("description", ""), str):
        raise invalid_document("description", "'description' must be a string.")
    if not stored:  # the profile made from it stores it as text
        check_storable(doc.get("description", ""), "description", invalid_document)


def _declared_max(declared, default_max: float) -> float:
    if declared is None:
        return default_max
    return min(max(declared[1], ENVELOPE[0]), ENVELOPE[1])


def _dial(doc, high: float, stored: bool) -> float:
    value = doc.get("intensity", min(1.0, high))
    if stored:  # written under older limits: clamp into today's
        return max(0.0, min(float(value), high))
    return check_dial(value, high)


def parse_cluster(doc, cluster_max: float, stored: bool = False) -> Cluster:
    _common(doc, CLUSTER_FORMAT, (), stored)
    declared = parse_range(doc.get("intensity_range"))
    high = _declared_max(declared, cluster_max)
    return Cluster(
        name=parse_name(doc["name"]),
        members=parse_entries(doc["members"], "members", allow_empty=False),
        intensity_range=declared,
        intensity=_dial(doc, high, stored),
        description=doc.get("description", ""),
    )


def parse_circuit(doc, circuit_max: float, stored: bool = False) -> Circuit:
    _common(doc, CIRCUIT_FORMAT, ("rung", "mode", "fallback_cluster", "edges"), stored)
    rung = doc.get("rung")
    if isinstance(rung, bool) or rung not in RUNG_LANGUAGE:
        raise invalid_document("rung", "'rung' must be 0, 1, 2 or 3 (the evidence ladder).")
    mode = doc.get("mode", FULL)
    if mode not in MODES:
        raise invalid_document("mode", f"'mode' must be one of {', '.join(MODES)}.")
    fallback = doc.get("fallback_cluster", "")
    if mode == SLICE_FALLBACK:
        fallback = parse_name(fallback, "fallback_cluster")
    elif fallback:
        raise invalid_document("fallback_cluster", "'fallback_cluster' is for mode "
                               "slice_fallback only.")
    edges = doc.get("edges", [])
    if not isinstance(edges, list):
        raise invalid_document("edges", "'edges' must be a list.")
    declared = parse_range(doc.get("intensity_range"))
    high = _declared_max(declared, circuit_max)
    return Circuit(
        name=parse_name(doc["name"]),
        rung=rung,
        members=parse_entries(doc["members"], "members", allow_empty=False),
        intensity_range=declared,
        intensity=_dial(doc, high, stored),
        mode=mode,
        fallback_cluster=fallback,
        description=doc.get("description", ""),
        edges=edges,
    )
