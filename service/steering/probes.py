"""Probes: named rules over one SAE's features, and their reading of a
generation on the model thread.

A probe scores every position it reads as Σ weight_f · activation_f over its
features and fires where the score reaches its threshold. Its verdict on one
generation is whether it fired, the peak score and the first position that
reached the threshold. Monitoring (monitoring.py) compiles the probes whose
SAE is attached into a `MonitorSpec` when a request is validated; the batch
hands each monitored row's residual stream at each probe layer to the job's
`ProbeReader`, at pre_steering (before that layer's own steering delta),
prompt positions at prefill and each fed-back token at its decode step. Rows
at one layer under the same spec are encoded together, one matrix product
per step.

Validation lives here, once: the gRPC servicer and the bridge only carry the
fields.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import torch

from service.errors import EngineError, invalid_parameter
from service.state.database import check_storable
from service.steering import documents
from service.steering.sae import SaeInfo, SaeWeights
from service.steering.traffic_contexts import ContextSampler, keep_best

MAX_FEATURES = 64
MAX_WEIGHT = 1000.0
MAX_THRESHOLD = 10000.0
MAX_DESCRIPTION = 1024
# Every monitored generation reads every probe: their number is bounded too.
MAX_PROBES = 64


@dataclass(frozen=True)
class Probe:
    name: str
    sae_id: str
    layer: int
    features: tuple[tuple[int, float], ...]  # (index, weight)
    threshold: float
    description: str = ""
    created: int = 0

    def row(self) -> dict:
        return {"name": self.name, "sae_id": self.sae_id, "layer": self.layer,
                "features": [list(f) for f in self.features], "threshold": self.threshold,
                "description": self.description, "created": self.created}

    @staticmethod
    def from_row(row: dict) -> Probe:
        return Probe(row["name"], row["sae_id"], int(row["layer"]),
                     tuple((int(i), float(w)) for i, w in row["features"]),
                     float(row["threshold"]), row.get("description", ""),
                     int(row.get("created", 0)))


def check_probe(name: str, description: str, info: SaeInfo, layer: int | None,
                features: list[tuple[int, float]] | None, feature: int | None,
                threshold: float | None, created: int) -> Probe:
    """A probe as sent, checked against the SAE it names; 400 naming the field."""
    documents.parse_name(name)
    check_storable(description, "description")
    if info.transcoder:
        raise invalid_parameter("sae_id", f"{info.id} is a transcoder: its features are read "
                                "from its MLP's input, which is not read here.")
    if len(description) > MAX_DESCRIPTION:
        raise invalid_parameter("description", f"'description' is at most {MAX_DESCRIPTION} "
                                "characters.")
    if layer is not None and layer != info.layer:
        raise invalid_parameter("layer", f"{info.id} reads layer {info.layer}, not {layer}; "
                                "leave 'layer' out or send the SAE's.")
    if features and feature is not None:
        raise invalid_parameter("feature", "Send 'features' (with weights) or one 'feature', "
                                "not both.")
    if feature is not None:
        features = [(feature, 1.0)]
    if not features:
        raise invalid_parameter("features", "A probe reads at least one feature: send "
                                "'features' or 'feature'.")
    if len(features) > MAX_FEATURES:
        raise invalid_parameter("features", f"A probe reads at most {MAX_FEATURES} features.")
    seen = set()
    for i, (index, weight) in enumerate(features):
        where = "feature" if feature is not None else f"features[{i}]"
        if not 0 <= index < info.d_sae:
            raise EngineError("invalid_feature_index", f"Feature {index} is past the width of "
                              f"{info.id} ({info.d_sae} features).", where)
        if index in seen:
            raise invalid_parameter(where, f"Feature {index} appears twice.")
        seen.add(index)
        if not math.isfinite(weight) or weight == 0 or abs(weight) > MAX_WEIGHT:
            raise invalid_parameter(f"{where}.weight", f"A weight must be finite, not 0, and "
                                    f"within ±{MAX_WEIGHT:g}; got {weight}.")
    if threshold is None:
        raise invalid_parameter("threshold", "'threshold' is required: the score at which "
                                "the probe fires.")
    if not math.isfinite(threshold) or not 0 < threshold <= MAX_THRESHOLD:
        raise invalid_parameter("threshold", f"'threshold' must be above 0 and at most "
                                f"{MAX_THRESHOLD:g}; got {threshold}.")
    return Probe(name, info.id, info.layer, tuple((int(i), float(w)) for i, w in features),
                 float(threshold), description, created)


class FeatureTally:
    """How many monitored tokens each feature of one SAE was active on: the
    current span and the one before (monitoring.py rotates them), so the
    frequencies cover recent traffic. Added to on the model thread once per
    forward pass, read on the event loop; the lock keeps a read whole."""

    def __init__(self, d_sae: int, device: torch.device):
        self.d_sae = d_sae
        self._lock = threading.Lock()
        self._counts = torch.zeros(d_sae, dtype=torch.int64, device=device)
        self._tokens = 0
        self._previous = (torch.zeros(d_sae, dtype=torch.int64), 0)

    def add(self, active: torch.Tensor) -> None:
        """active [tokens, d_sae] bool."""
        counts = active.sum(dim=0)
        with self._lock:
            self._counts += counts
            self._tokens += active.shape[0]

    def rotate(self) -> None:
        with self._lock:
            self._previous = (self._counts.cpu(), self._tokens)
            self._counts = torch.zeros_like(self._counts)
            self._tokens = 0

    def snapshot(self) -> tuple[torch.Tensor, int]:
        """(tokens each feature was active on, tokens read), both spans."""
        with self._lock:
            return self._counts.cpu() + self._previous[0], self._tokens + self._previous[1]


class LayerProbes:
    """The probes reading one attached SAE, as tensors: the features they
    need and a [features, probes] weight matrix; and the SAE's FeatureTally."""

    def __init__(self, sae: SaeWeights, probes: list[Probe], tally: FeatureTally,
                 contexts: ContextSampler | None = None):
        self.sae = sae
        self.tally = tally
        # Opt in (monitoring's keep_contexts): feature contexts from this traffic.
        self.contexts = contexts
        self.layer = sae.info.layer
        self.probes = tuple(probes)
        columns = sorted({i for p in probes for i, _ in p.features})
        where = {f: c for c, f in enumerate(columns)}
        weights = torch.zeros((len(columns), len(probes)), dtype=torch.float32)
        for j, p in enumerate(probes):
            for i, w in p.features:
                weights[where[i], j] = w
        device = sae.W_enc.device
        self.columns = torch.tensor(columns, dtype=torch.long, device=device)
        self.weights = weights.to(device)
        self.threshold_list = [p.threshold for p in probes]

    def read(self, hidden: torch.Tensor, owners: list | None = None) -> list[list[float]]:
        """Residual vectors [n, d] -> scores [n][probes], counting each
        feature's activity on the way: one encode and one transfer for all.
        `owners` ((ProbeReader, position) per row) receive the activations
        that beat the kept contexts' floor, when contexts are kept."""
        acts = self.sae.encode(hidden.float()).float()
        self.tally.add(acts > 0)
        if self.contexts is not None and owners is not None:
            for row, feature, value in self.contexts.hits(acts):
                reader, position = owners[row]
                reader.keep(self, position, feature, value)
        return (acts[:, self.columns] @ self.weights).tolist()


@dataclass(frozen=True)
class MonitorSpec:
    """What monitoring reads in one request: per layer, the probes there."""

    layers: tuple[LayerProbes, ...]
    # Whether its layers keep feature contexts (the generation then hands
    # monitoring its token ids when it ends).
    contexts: bool = False


@dataclass
class _Tally:
    peak: list[float]
    first: list[int]
    positions: int = 0


@dataclass(frozen=True)
class Verdict:
    probe: str
    sae_id: str
    layer: int
    fired: bool
    peak: float
    first_position: int | None
    positions_read: int
    threshold: float


@dataclass
class ProbeReader:
    """One request's readings (every row of it), kept on the model thread
    and read by the event loop once the job is done."""

    spec: MonitorSpec
    tallies: dict[int, _Tally] = field(default_factory=dict)
    # Context candidates (value, sae_id, feature, position), when kept.
    found: list = field(default_factory=list)

    def keep(self, layer: LayerProbes, position: int, feature: int, value: float) -> None:
        keep_best(self.found, (value, layer.sae.info.id, feature, position))

    def read(self, layer: LayerProbes, positions: list[int], scores: list[list[float]]) -> None:
        """Scores [position][probe] at `layer` (plain Python: no tensor work per row)."""
        tally = self.tallies.get(id(layer))
        if tally is None:
            count = len(layer.probes)
            tally = self.tallies[id(layer)] = _Tally([-math.inf] * count, [-1] * count)
        tally.positions += len(positions)
        peak, first, thresholds = tally.peak, tally.first, layer.threshold_list
        for position, row in zip(positions, scores, strict=True):
            for j, value in enumerate(row):
                if value > peak[j]:
                    peak[j] = value
                if value >= thresholds[j] and (first[j] < 0 or position < first[j]):
                    first[j] = position

    def verdicts(self) -> tuple[Verdict, ...]:
        out = []
        for layer in self.spec.layers:
            tally = self.tallies.get(id(layer))
            for j, p in enumerate(layer.probes):
                if tally is None:
                    out.append(Verdict(p.name, p.sae_id, p.layer, False, 0.0, None, 0,
                                       p.threshold))
                    continue
                first = tally.first[j]
                out.append(Verdict(p.name, p.sae_id, p.layer, first >= 0, tally.peak[j],
                                   first if first >= 0 else None, tally.positions, p.threshold))
        return tuple(out)


@dataclass
class MonitorRead:
    """One row's positions at one layer in one forward pass: batch row, the
    first column holding its tokens, their absolute positions."""

    row: int
    column: int
    positions: list[int]
    reader: ProbeReader
    layer: LayerProbes


def read_layer(hidden: torch.Tensor, reads: list[MonitorRead]) -> None:
    """Hand each monitored row its activations at this layer (pre_steering).
    Single-position reads (decode steps) under the same probes are encoded
    together, one matrix product and one transfer per step."""
    batched: dict[int, list[MonitorRead]] = {}
    for r in reads:
        if len(r.positions) == 1 and hidden.shape[1] - r.column == 1:
            batched.setdefault(id(r.layer), []).append(r)
        else:
            owners = ([(r.reader, p) for p in r.positions] if r.layer.contexts is not None
                      else None)
            r.reader.read(r.layer, r.positions, r.layer.read(hidden[r.row, r.column:], owners))
    for group in batched.values():
        rows = torch.tensor([r.row for r in group], dtype=torch.long, device=hidden.device)
        layer = group[0].layer
        owners = ([(r.reader, r.positions[0]) for r in group] if layer.contexts is not None
                  else None)
        scores = layer.read(hidden[rows, -1], owners)
        for k, r in enumerate(group):
            r.reader.read(r.layer, r.positions, scores[k:k + 1])


def add_reads(monitors: dict[int, list[MonitorRead]], reader: ProbeReader | None, row: int,
              column: int, positions: list[int]) -> None:
    """Register one row's positions with every probe layer its request reads."""
    if reader is None:
        return
    for layer in reader.spec.layers:
        monitors.setdefault(layer.layer, []).append(
            MonitorRead(row, column, positions, reader, layer))
