"""Monitoring of live traffic: the probes, the per-model switch, and what
monitored generations reported.

An operator defines probes (probes.py) and switches monitoring on for a
model; it is off by default, and on with no probe whose SAE is attached it
reads nothing (GetMonitoring says so). Probes and the switch live in the state
store beside the rest of the steering state. Every generation validated while
its model is monitored carries a MonitorSpec (the probes compiled against the
attached SAEs, rebuilt only when probes or attachments change); scoring and
embeddings never do. When a monitored generation ends, its verdicts are
recorded here: totals since start (the Prometheus counters) and a window of
the last WINDOW generations (hit rates). Feature activity is counted per SAE
as the batch reads it (probes.FeatureTally): at a decode step once for all
the step's monitored rows, at prefill per monitored prompt; over the tokens
of the last one to two windows.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

import torch

from service.errors import EngineError, invalid_parameter
from service.steering import probes as probe_rules
from service.steering.completion import completes
from service.steering.manager import SteeringManager
from service.steering.probes import (
    FeatureTally,
    LayerProbes,
    MonitorSpec,
    Probe,
    ProbeReader,
    Verdict,
)
from service.steering.traffic_contexts import ContextSampler, resolve

WINDOW = 256
TOP_FEATURES = 16  # feature frequencies reported per SAE


@dataclass(frozen=True)
class ProbeStatus:
    probe: Probe
    reading: bool
    reason: str


@dataclass(frozen=True)
class ProbeStats:
    probe: str
    requests: int
    fired: int
    total_requests: int
    total_fired: int

    @property
    def hit_rate(self) -> float:
        return self.fired / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class FeatureFrequency:
    sae_id: str
    layer: int
    index: int
    tokens: int
    frequency: float


@dataclass(frozen=True)
class MonitoringState:
    model: str
    enabled: bool
    active: bool
    reason: str
    probes: tuple[ProbeStatus, ...]
    window_requests: int
    total_requests: int
    probe_stats: tuple[ProbeStats, ...]
    feature_frequencies: tuple[FeatureFrequency, ...]
    keep_contexts: bool = False


class MonitoringManager:
    def __init__(self, steering: SteeringManager):
        self.steering = steering
        self.store = steering.store
        self._take(self.store.probes(), self.store.settings())
        # Steering conditions on a probe (steering/conditions.py) read its rule here.
        steering.find_probe = lambda name: self.probes.get(name)
        # Another replica's change arrives as a new snapshot (replication.py).
        steering.followers.append(lambda snapshot: self._take(snapshot.probes,
                                                              snapshot.settings))
        self._compiled: tuple[tuple | None, MonitorSpec | None] = (None, None)
        self._window: collections.deque[tuple[Verdict, ...]] = collections.deque(maxlen=WINDOW)
        # Per SAE: feature activity over the monitored tokens of the last one
        # to two windows (rotated every WINDOW generations).
        self._tallies: dict[str, FeatureTally] = {}
        # Per SAE: feature contexts kept from traffic (opt in: keep_contexts).
        self._samplers: dict[str, ContextSampler] = {}
        self.total_requests = 0
        # probe -> (read, fired) since start; replaced whole on each change, so
        # the metrics thread never iterates a dict the event loop is changing.
        self.totals: dict[str, tuple[int, int]] = {}

    def _take(self, probes: list[dict], settings: dict) -> None:
        self.probes: dict[str, Probe] = {row["name"]: Probe.from_row(row) for row in probes}
        self.enabled: dict[str, bool] = {
            str(k): bool(v) for k, v in settings.get("monitoring", {}).items()}
        self.keep: dict[str, bool] = {
            str(k): bool(v) for k, v in settings.get("monitoring_contexts", {}).items()}
        if not any(self.keep.values()):
            for sampler in getattr(self, "_samplers", {}).values():
                sampler.clear()

    # -- probes --------------------------------------------------------------------------

    def _status(self, probe: Probe) -> ProbeStatus:
        sae = self.steering.attached.get(probe.sae_id)
        if sae is None:
            return ProbeStatus(probe, False, f"{probe.sae_id} is not attached")
        return ProbeStatus(probe, True, "")

    def list_probes(self) -> tuple[ProbeStatus, ...]:
        return tuple(self._status(p) for _, p in sorted(self.probes.items()))

    @completes
    async def create_probe(self, name: str, description: str, sae_id: str, layer: int | None,
                           features: list[tuple[int, float]] | None, feature: int | None,
                           threshold: float | None) -> ProbeStatus:
        async with self.steering.write_lock:
            try:
                info = self.steering.sae_info(sae_id)
            except EngineError as exc:
                # A probe that names no usable SAE is a bad probe: 400, not 404.
                raise invalid_parameter("sae_id", exc.message) from None
            probe = probe_rules.check_probe(name, description, info, layer, features, feature,
                                            threshold, int(time.time()))
            if name in self.probes:
                raise EngineError("already_exists", f"A probe named '{name}' exists.", "name")
            if len(self.probes) >= probe_rules.MAX_PROBES:
                raise invalid_parameter("name", f"There are already {probe_rules.MAX_PROBES} "
                                        "probes, the most kept; delete one first.")
            await self.store.put_probe(probe.name, probe.row())
            self.probes = {**self.probes, name: probe}
            return self._status(probe)

    @completes
    async def delete_probe(self, name: str) -> None:
        async with self.steering.write_lock:
            if name not in self.probes:
                raise EngineError("probe_not_found", f"No probe named '{name}'.", "name")
            await self.store.delete_probe(name)
            self.probes = {k: p for k, p in self.probes.items() if k != name}

    # -- the switch ------------------------------------------------------------------------

    @completes
    async def set_enabled(self, model: str, enabled: bool,
                          keep_contexts: bool | None = None) -> None:
        async with self.steering.write_lock:
            wanted = {**self.enabled, model: enabled}
            keep = self.keep if keep_contexts is None else {**self.keep, model: keep_contexts}
            await self.store.put_settings(monitoring=wanted, monitoring_contexts=keep)
            self.enabled, self.keep = wanted, keep
            if keep_contexts is False:
                for sampler in self._samplers.values():
                    sampler.clear()

    def spec_for(self, model: str) -> MonitorSpec | None:
        """What a generation of `model` validated now reads; None when it is
        not monitored or nothing would be read."""
        if not self.enabled.get(model):
            return None
        attached = self.steering.attached
        # Probes are replaced, never changed in place, so the dict itself is the
        # key (held, so its id cannot be reused); every request comes here.
        keep = bool(self.keep.get(model))
        key = (self.probes, tuple((i, id(w)) for i, w in attached.items()), keep)
        cached = self._compiled[0]
        if cached is None or cached[0] is not key[0] or cached[1:] != key[1:]:
            by_sae: dict[str, list[Probe]] = {}
            for _, p in sorted(self.probes.items()):
                if p.sae_id in attached:
                    by_sae.setdefault(p.sae_id, []).append(p)
            layers = tuple(LayerProbes(attached[s], ps, self._tally(attached[s]),
                                       self._sampler(attached[s]) if keep else None)
                           for s, ps in sorted(by_sae.items()))
            self._compiled = (key, MonitorSpec(layers, keep) if layers else None)
        return self._compiled[1]

    def _tally(self, sae) -> FeatureTally:
        tally = self._tallies.get(sae.info.id)
        if tally is None or tally.d_sae != sae.info.d_sae:
            tally = self._tallies[sae.info.id] = FeatureTally(sae.info.d_sae, sae.W_enc.device)
        return tally

    def _sampler(self, sae) -> ContextSampler:
        sampler = self._samplers.get(sae.info.id)
        if sampler is None or sampler.d_sae != sae.info.d_sae:
            sampler = self._samplers[sae.info.id] = ContextSampler(sae.info.d_sae,
                                                                   sae.W_enc.device)
        return sampler

    def contexts_of(self, sae_id: str, index: int) -> list:
        """A feature's contexts kept from traffic, strongest first."""
        sampler = self._samplers.get(sae_id)
        return sampler.of(index) if sampler is not None else []

    # -- what monitored traffic reported ---------------------------------------------------

    def record(self, reader: ProbeReader, ids: list[int] | None = None,
               decode=None) -> tuple[Verdict, ...]:
        """A monitored generation ended; returns its verdicts. With its token
        ids (a single-choice generation whose spec keeps contexts), its
        context candidates are offered to the samplers."""
        if ids is not None and reader.found and decode is not None:
            for sae_id, feature, context in resolve(reader.found, ids, decode):
                sampler = self._samplers.get(sae_id)
                if sampler is not None:
                    sampler.offer(feature, context)
        verdicts = reader.verdicts()
        self._window.append(verdicts)
        self.total_requests += 1
        if self.total_requests % WINDOW == 0:
            for tally in self._tallies.values():
                tally.rotate()
        totals = dict(self.totals)
        for v in verdicts:
            read, fired = totals.get(v.probe, (0, 0))
            totals[v.probe] = (read + 1, fired + int(v.fired))
        self.totals = totals
        return verdicts

    def state(self, model: str, loaded: str | None) -> MonitoringState:
        enabled = bool(self.enabled.get(model))
        reason = ""
        if not enabled:
            reason = "monitoring is off for this model"
        elif loaded != model:
            reason = "this model is not the one loaded"
        elif not self.steering.hookable:
            reason = "the loaded model's residual stream cannot be reached, so nothing can be read"
        elif not self.probes:
            reason = "no probes are defined: monitoring reads nothing (a no-op)"
        elif self.spec_for(model) is None:
            reason = "no probe's SAE is attached: monitoring reads nothing (a no-op)"
        window = list(self._window)
        stats = []
        for name in sorted(self.probes):
            seen = [v for verdicts in window for v in verdicts if v.probe == name]
            total = self.totals.get(name, (0, 0))
            stats.append(ProbeStats(name, len(seen), sum(v.fired for v in seen), *total))
        return MonitoringState(model, enabled, not reason, reason, self.list_probes(),
                               len(window), self.total_requests, tuple(stats),
                               self._frequencies(), bool(self.keep.get(model)))

    def _frequencies(self) -> tuple[FeatureFrequency, ...]:
        """The most active features of each SAE read (attached ones only)."""
        out = []
        for sae_id, tally in sorted(self._tallies.items()):
            sae = self.steering.attached.get(sae_id)
            counts, tokens = tally.snapshot()
            if sae is None or not tokens:
                continue
            top = torch.topk(counts, min(TOP_FEATURES, counts.numel()))
            for n, index in zip(top.values.tolist(), top.indices.tolist(), strict=True):
                if n > 0:
                    out.append(FeatureFrequency(sae_id, sae.info.layer, index, n, n / tokens))
        return tuple(out)
