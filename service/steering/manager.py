"""The steering state operators manage, and the resolution of a request's
steering against it.

State: SAEs (on disk; which are attached), the live values and whether
steering is enabled, profiles, clusters (with their dial), circuits (with
theirs) and the active profile. Every write goes to SQLite first, then
replaces the in-memory snapshot; requests read the snapshot when they are
validated and carry what they resolved (a SteeringPlan) into the batch, so no
request ever writes global state and an operator's change is never undone by
one. A change applies to requests validated after it.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import time
from dataclasses import dataclass, replace

from service.errors import EngineError
from service.steering import documents, intensity
from service.steering.documents import Circuit, Cluster, SteeringEntry
from service.steering.runtime import LayerSteering, SteeringPlan
from service.steering.sae import SaeDirectory, SaeInfo, SaeWeights
from service.steering.store import Snapshot, SteeringStore

log = logging.getLogger(__name__)

FEATURES, CLUSTER, CIRCUIT = "features", "cluster", "circuit"


def not_found(code: str, what: str, name: str) -> EngineError:
    return EngineError(code, f"No {what} named '{name}'.", "name")


def steering_unavailable(message: str) -> EngineError:
    return EngineError("steering_unavailable", message)


@dataclass(frozen=True)
class Profile:
    name: str
    kind: str  # FEATURES, CLUSTER or CIRCUIT
    entries: tuple[SteeringEntry, ...] = ()
    target: str = ""  # the cluster's or circuit's name
    description: str = ""
    created: int = 0
    updated: int = 0

    def row(self) -> dict:
        return {"name": self.name, "description": self.description, "kind": self.kind,
                "entries": [e.to_json() for e in self.entries], "target": self.target,
                "created": self.created, "updated": self.updated}


@dataclass(frozen=True)
class Resolved:
    """A request's steering: the plan (None: unsteered), the λ to echo in
    X-miLLM-Steering-Intensity (None: omit), and the circuit's rung when a
    circuit is genuinely steering (None: omit X-miLLM-Circuit-Rung)."""

    plan: SteeringPlan | None = None
    echo: float | None = None
    rung: int | None = None

    @property
    def language(self) -> str:
        return documents.RUNG_LANGUAGE[self.rung] if self.rung is not None else ""


UNSTEERED = Resolved()


@dataclass(frozen=True)
class Live:
    """Whether a management write is what steers the next request (with
    replicas: on every replica that answered, steering/acks.py)."""

    live: bool
    reason: str = ""
    replicas: int = 1
    replicas_applied: int = 1


@dataclass(frozen=True)
class CircuitSteering:
    steering: bool
    rung: int | None
    language: str
    intensity: float
    reason: str


@dataclass(frozen=True)
class _Base:
    """What a request's steering starts from, with the rule its dial follows."""

    rule: str  # CLUSTER (numeric λ capped above) or CIRCUIT (clamped both ends)
    entries: tuple[SteeringEntry, ...]
    stored: float
    declared: tuple[float, float] | None
    rung: int | None = None


class SteeringManager:
    def __init__(self, store: SteeringStore, saes_dir: pathlib.Path,
                 limits: intensity.IntensityLimits | None = None):
        self.store = store
        self.saes = SaeDirectory(saes_dir)
        self.limits = limits or intensity.IntensityLimits()
        # Others holding parts of the stored state (monitoring.py): called with
        # every snapshot taken after this one.
        self.followers: list = []
        self._apply(store.snapshot())
        self.attached: dict[str, SaeWeights] = {}
        self._engine = None
        self._model: tuple[int, int] | None = None  # (hidden size, layers)
        # One management write at a time; with replicas, one in the whole
        # cluster (steering/replication.py replaces it with its WriteGate).
        self._lock = asyncio.Lock()

    # -- the stored state ---------------------------------------------------------------

    def _apply(self, snapshot: Snapshot) -> None:
        """Replace the snapshot at once (no await: a request validated on the
        event loop sees all of the old state or all of the new)."""
        settings = snapshot.settings
        self.enabled: bool = bool(settings.get("enabled", True))
        self.values: tuple[SteeringEntry, ...] = documents.parse_entries(
            settings.get("values", []), "values")
        self.active: str = str(settings.get("active_profile", ""))
        self.profiles: dict[str, Profile] = {
            p["name"]: Profile(p["name"], p["kind"], documents.parse_entries(p["entries"],
                               "entries"), p["target"], p["description"], p["created"],
                               p["updated"])
            for p in snapshot.profiles}
        # Stored dials are clamped, not refused, if the configured maxima were
        # lowered since they were written.
        self.clusters: dict[str, Cluster] = {
            d["name"]: documents.parse_cluster(d, self.limits.cluster_max, stored=True)
            for d in snapshot.clusters}
        self.circuits: dict[str, Circuit] = {
            d["name"]: documents.parse_circuit(d, self.limits.circuit_max, stored=True)
            for d in snapshot.circuits}
        # The SAEs to attach whenever a model they fit is loaded.
        self.attached_ids: list[str] = list(snapshot.attached)
        for follower in self.followers:
            follower(snapshot)

    async def follow(self, snapshot: Snapshot) -> None:
        """Another replica changed the state: take its snapshot, and attach
        and detach SAEs to match (write lock held)."""
        self._apply(snapshot)
        for sae_id in [s for s in self.attached if s not in self.attached_ids]:
            del self.attached[sae_id]
        if self._model is not None:
            await self._reattach()

    async def _reattach(self) -> None:
        infos = {i.id: i for i in self.saes.scan()[0]}
        for sae_id in self.attached_ids:
            if sae_id in self.attached:
                continue
            info = infos.get(sae_id)
            try:
                if info is None:
                    raise EngineError("sae_not_found", f"{sae_id} is no longer on disk")
                await self._attach(info)
            except EngineError as exc:
                # Kept in the store: it re-attaches when a model it fits is loaded.
                log.warning("not re-attaching %s: %s", sae_id, exc.message)

    # -- the loaded model -------------------------------------------------------------

    async def bind(self, engine) -> None:
        """The loaded model is `engine`'s: re-attach the SAEs attached before
        the last restart that fit it. None unbinds."""
        self.attached = {}
        self._engine, self._model = engine, None
        runtime = engine.steering if engine is not None else None
        if runtime is None:
            return
        self._model = (runtime.hidden_size, runtime.num_layers)
        # Not under the write lock: a model must load while the database is away.
        await self._reattach()

    # -- SAEs ---------------------------------------------------------------------------

    def list_saes(self) -> tuple[list[SaeInfo], list[tuple[str, str]]]:
        return self.saes.scan()

    def sae_info(self, sae_id: str) -> SaeInfo:
        """An SAE on disk, attached or not (sae_not_found, invalid_sae)."""
        return self._info(sae_id)

    @property
    def write_lock(self):
        """The lock every write to the stored state takes (with replicas, the
        cluster-wide gate of replication.py)."""
        return self._lock

    @property
    def hookable(self) -> bool:
        """Whether the loaded model has steering hooks."""
        return self._model is not None

    def _info(self, sae_id: str) -> SaeInfo:
        found, broken = self.saes.scan()
        for info in found:
            if info.id == sae_id:
                return info
        for bad_id, problem in broken:
            if bad_id == sae_id:
                raise EngineError("invalid_sae", problem, "sae_id")
        raise EngineError("sae_not_found", f"No SAE with id '{sae_id}' is on disk.", "sae_id")

    def _check_fits(self, info: SaeInfo) -> None:
        if self._model is None:
            raise steering_unavailable("The loaded model cannot be steered (no model is "
                                       "loaded, or its engine has no steering hooks).")
        hidden, layers = self._model
        if info.d_in != hidden:
            raise EngineError("sae_mismatch", f"{info.id} reads d_in={info.d_in}, but the "
                              f"model's residual stream has {hidden} dimensions.", "sae_id")
        if info.layer >= layers:
            raise EngineError("sae_mismatch", f"{info.id} hooks layer {info.layer}, but the "
                              f"model has layers 0-{layers - 1}.", "sae_id")
        for other in self.attached.values():
            if other.info.layer == info.layer and other.info.id != info.id:
                raise EngineError("sae_mismatch", f"{other.info.id} is attached at layer "
                                  f"{info.layer} already; detach it first.", "sae_id")

    async def _attach(self, info: SaeInfo) -> None:
        self._check_fits(info)
        runtime = self._engine.steering
        weights = await asyncio.to_thread(SaeWeights, info, runtime.device, runtime.dtype)
        self.attached[info.id] = weights
        try:
            # The default steering (active profile, live values) must still
            # apply with this SAE attached, or every plain request would fail.
            self._check_default_base()
        except EngineError as exc:
            del self.attached[info.id]
            raise EngineError("sae_mismatch", f"Attaching {info.id} would break the default "
                              f"steering: {exc.message} Change it first.", "sae_id") from None

    def _check_default_base(self) -> None:
        base = self._base_of(self._default_profile())
        if base is not None:
            self._plan(base.entries, 1.0, "steering")

    async def attach(self, sae_id: str) -> Live:
        async with self._lock:
            info = self._info(sae_id)
            if sae_id not in self.attached:
                await self._attach(info)
                try:
                    await self.store.set_attached(sae_id, True)
                except EngineError:
                    del self.attached[sae_id]
                    raise
            if sae_id not in self.attached_ids:
                self.attached_ids.append(sae_id)
            return self.default_live()

    async def detach(self, sae_id: str) -> Live:
        async with self._lock:
            if sae_id not in self.attached:
                self._info(sae_id)  # 404 when it does not exist at all
            await self.store.set_attached(sae_id, False)
            self.attached.pop(sae_id, None)
            if sae_id in self.attached_ids:
                self.attached_ids.remove(sae_id)
            return self.default_live()

    def _by_layer(self) -> dict[int, SaeWeights]:
        return {w.info.layer: w for w in self.attached.values()}

    # -- applying entries to the attached SAEs --------------------------------------------

    def _plan(self, entries: tuple[SteeringEntry, ...], level: float,
              where: str) -> SteeringPlan | None:
        """Entries at dial λ on the SAEs attached now; entries at layers with
        no SAE attached do not steer. A feature past the SAE's width, or an
        entry pinned to another SAE than the one attached, is refused."""
        by_layer = self._by_layer()
        per_layer: dict[int, tuple[list[int], list[float]]] = {}
        for i, e in enumerate(entries):
            sae = by_layer.get(e.layer)
            if sae is None:
                continue
            if e.sae_id and e.sae_id != sae.info.id:
                raise EngineError("invalid_feature_index", f"{where}[{i}] was chosen on "
                                  f"{e.sae_id}, but {sae.info.id} is attached at layer "
                                  f"{e.layer}.", where)
            if e.feature >= sae.info.d_sae:
                raise EngineError("invalid_feature_index", f"{where}[{i}] names feature "
                                  f"{e.feature}, past the width of {sae.info.id} "
                                  f"({sae.info.d_sae} features).", where)
            strength = intensity.scaled(e.strength, level)
            if strength == 0.0:
                continue
            features, strengths = per_layer.setdefault(e.layer, ([], []))
            features.append(e.feature)
            strengths.append(strength)
        if not per_layer:
            return None
        return SteeringPlan(tuple(
            LayerSteering(layer, by_layer[layer], tuple(f), tuple(s))
            for layer, (f, s) in sorted(per_layer.items())))

    def _base_of(self, profile: Profile | None) -> _Base | None:
        if profile is None:
            return _Base(CLUSTER, self.values, 1.0, None) if self.values else None
        if profile.kind == FEATURES:
            return _Base(CLUSTER, profile.entries, 1.0, None)
        if profile.kind == CLUSTER:
            cluster = self.clusters.get(profile.target)
            if cluster is None:
                return None
            return _Base(CLUSTER, cluster.members, cluster.intensity, cluster.intensity_range)
        circuit = self.circuits.get(profile.target)
        if circuit is None:
            return None
        if circuit.mode == documents.SLICE_FALLBACK:
            # Served by its backing cluster, under the cluster rule, with no rung.
            cluster = self.clusters.get(circuit.fallback_cluster)
            if cluster is None:
                return None
            return _Base(CLUSTER, cluster.members, cluster.intensity, cluster.intensity_range)
        return _Base(CIRCUIT, circuit.members, circuit.intensity, circuit.intensity_range,
                     circuit.rung)

    def _default_profile(self) -> Profile | None:
        return self.profiles.get(self.active) if self.active else None

    def _level(self, base: _Base, dial) -> float:
        if base.rule == CIRCUIT:
            return intensity.resolve_circuit(dial, base.stored, base.declared, self.limits)
        return intensity.resolve_cluster(dial, base.stored, base.declared, self.limits)

    def resolve(self, profile_name: str | None, dial) -> Resolved:
        """A request's steering. `dial` is what parse_dial returned."""
        if dial is not None and intensity.is_off(dial):
            # Off is off: the base is not validated (not even that it exists).
            return self._turned_off(profile_name)
        if profile_name is not None:
            profile = self.profiles.get(profile_name)
            if profile is None:
                raise EngineError("profile_not_found", f"No steering profile named "
                                  f"'{profile_name}'.", "profile")
        elif not self.enabled:
            return UNSTEERED  # disabled: neither the active profile nor the live values
        else:
            profile = self._default_profile()
        if not self.attached:
            return UNSTEERED
        base = self._base_of(profile)
        if base is None:
            return UNSTEERED
        level = self._level(base, dial)
        if level <= 0:  # "min" can resolve to 0 too
            return self._turned_off(profile_name) if dial is not None else UNSTEERED
        where = "profile" if profile_name is not None else "steering"
        plan = self._plan(base.entries, level, where)
        if plan is None:
            return UNSTEERED
        return Resolved(plan, level if dial is not None else None, base.rung)

    def _turned_off(self, profile_name: str | None) -> Resolved:
        """Unsteered by the dial; the echo says 0 only when the dial did turn
        steering off (the same request without a dial would have steered)."""
        try:
            would = self.resolve(profile_name, None)
        except EngineError:
            would = UNSTEERED
        return Resolved(None, 0.0 if would.plan is not None else None)

    # -- live values ------------------------------------------------------------------------

    def default_live(self) -> Live:
        """Whether the default steering (active profile, else live values)
        steers the next request that names no profile."""
        if not self.enabled:
            return Live(False, "steering is disabled")
        if not self.attached:
            return Live(False, "no SAE is attached")
        profile = self._default_profile()
        base = self._base_of(profile)
        if base is None:
            return Live(False, "the steering base is empty")
        try:
            plan = self._plan(base.entries, self._level(base, None), "steering")
        except EngineError as exc:
            return Live(False, exc.message)
        if plan is None:
            return Live(False, "no entry is at a layer with an SAE attached, or the dial is 0")
        return Live(True)

    def _check_entries(self, entries: tuple[SteeringEntry, ...], where: str) -> None:
        """Entries the attached SAEs refuse now are refused when written."""
        self._plan(entries, 1.0, where)
        if self._model is not None:
            for i, e in enumerate(entries):
                if e.layer >= self._model[1]:
                    raise EngineError("invalid_feature_index", f"{where}[{i}] is at layer "
                                      f"{e.layer}; the model has layers 0-{self._model[1] - 1}.",
                                      where)

    async def set_steering(self, values: tuple[SteeringEntry, ...] | None,
                           enabled: bool | None) -> Live:
        async with self._lock:
            if values is not None:
                self._check_entries(values, "values")
            new_values = self.values if values is None else values
            new_enabled = self.enabled if enabled is None else enabled
            await self.store.put_settings(values=[v.to_json() for v in new_values],
                                          enabled=new_enabled)
            self.values, self.enabled = new_values, new_enabled
            if self.active:
                return Live(False, f"profile '{self.active}' is active; it steers instead of "
                            "the live values")
            return self.default_live()

    # -- profiles ---------------------------------------------------------------------------

    def get_profile(self, name: str) -> Profile:
        profile = self.profiles.get(name)
        if profile is None:
            raise EngineError("profile_not_found", f"No steering profile named '{name}'.", "name")
        return profile

    def _profile_live(self, name: str) -> Live:
        if self.active != name:
            return Live(False, f"profile '{name}' is not active")
        return self.default_live()

    async def create_profile(self, name: str, description: str,
                             entries: tuple[SteeringEntry, ...]) -> tuple[Profile, Live]:
        async with self._lock:
            documents.parse_name(name)
            if name in self.profiles:
                raise EngineError("already_exists", f"A profile named '{name}' exists.", "name")
            self._check_entries(entries, "entries")
            now = int(time.time())
            profile = Profile(name, FEATURES, entries, "", description, now, now)
            await self.store.put_profile(profile.row())
            self.profiles[name] = profile
            return profile, self._profile_live(name)

    async def update_profile(self, name: str, description: str | None,
                             entries: tuple[SteeringEntry, ...] | None) -> tuple[Profile, Live]:
        async with self._lock:
            profile = self.get_profile(name)
            if entries is not None:
                if profile.kind != FEATURES:
                    raise EngineError("invalid_parameter", f"Profile '{name}' is backed by "
                                      f"{profile.kind} '{profile.target}'; change that instead.",
                                      "entries")
                self._check_entries(entries, "entries")
            profile = replace(profile, entries=profile.entries if entries is None else entries,
                              description=profile.description if description is None
                              else description, updated=int(time.time()))
            await self.store.put_profile(profile.row())
            self.profiles[name] = profile
            return profile, self._profile_live(name)

    async def delete_profile(self, name: str) -> None:
        async with self._lock:
            profile = self.get_profile(name)
            if profile.kind != FEATURES:
                raise EngineError("invalid_parameter", f"Profile '{name}' belongs to "
                                  f"{profile.kind} '{profile.target}'; delete that instead.",
                                  "name")
            await self._delete_profiles([name])

    async def _delete_profiles(self, names: list[str], *also) -> None:
        deactivate = self.active in names
        statements = [*(SteeringStore.delete_profile_sql(n) for n in names), *also]
        if deactivate:
            statements.append(SteeringStore.setting_sql("active_profile", ""))
        await self.store.write(*statements)
        for n in names:
            self.profiles.pop(n, None)
        if deactivate:
            self.active = ""

    async def activate_profile(self, name: str | None) -> Live:
        """Make `name` the default steering base; None deactivates."""
        async with self._lock:
            if name:
                profile = self.get_profile(name)
                base = self._base_of(profile)
                if base is not None:
                    self._plan(base.entries, self._level(base, None), "profile")
            await self.store.put_settings(active_profile=name or "")
            self.active = name or ""
            return self.default_live()

    # -- clusters -------------------------------------------------------------------------

    def get_cluster(self, name: str) -> Cluster:
        cluster = self.clusters.get(name)
        if cluster is None:
            raise not_found("cluster_not_found", "cluster", name)
        return cluster

    def _backs_default(self, cluster_name: str) -> bool:
        profile = self._default_profile()
        if profile is None:
            return False
        if profile.kind == CLUSTER:
            return profile.target == cluster_name
        circuit = self.circuits.get(profile.target) if profile.kind == CIRCUIT else None
        return (circuit is not None and circuit.mode == documents.SLICE_FALLBACK
                and circuit.fallback_cluster == cluster_name)

    def _written_live(self, steers_default: bool, what: str) -> Live:
        if not steers_default:
            return Live(False, f"{what} is not the active steering base")
        return self.default_live()

    async def _add_imported(self, kind: str, item, held: dict) -> Live:
        """Store an imported cluster or circuit with the profile that names it
        (one transaction). Lock held."""
        if item.name in held or item.name in self.profiles:
            raise EngineError("already_exists", f"A {kind} or profile named '{item.name}' "
                              "exists.", "name")
        self._check_entries(item.members, "members")
        now = int(time.time())
        profile = Profile(item.name, kind, (), item.name, item.description, now, now)
        await self.store.write(SteeringStore.put_document_sql(f"{kind}s", item.document()),
                         SteeringStore.profile_sql(profile.row()))
        held[item.name] = item
        self.profiles[item.name] = profile
        # Imported is not active: nothing steers with it until its profile is.
        return self._written_live(False, f"{kind} '{item.name}'")

    async def _store_dial(self, kind: str, item, high: float, level: float, held: dict):
        """A cluster's or circuit's dial, within [0, high]. Lock held."""
        item = replace(item, intensity=documents.check_dial(level, high))
        await self.store.write(SteeringStore.put_document_sql(f"{kind}s", item.document()))
        held[item.name] = item
        return item

    async def import_cluster(self, document) -> tuple[Cluster, Live]:
        async with self._lock:
            cluster = documents.parse_cluster(document, self.limits.cluster_max)
            return cluster, await self._add_imported(CLUSTER, cluster, self.clusters)

    async def set_cluster_intensity(self, name: str, level: float) -> tuple[Cluster, Live]:
        async with self._lock:
            cluster = self.get_cluster(name)
            high = intensity.cluster_bounds(cluster.intensity_range, self.limits)[1]
            cluster = await self._store_dial(CLUSTER, cluster, high, level, self.clusters)
            return cluster, self._written_live(self._backs_default(name), f"cluster '{name}'")

    async def delete_cluster(self, name: str) -> None:
        async with self._lock:
            self.get_cluster(name)
            users = [c.name for c in self.circuits.values() if c.fallback_cluster == name]
            if users:
                raise EngineError("invalid_parameter", f"Circuit(s) {', '.join(users)} fall "
                                  f"back to cluster '{name}'; delete them first.", "name")
            await self._delete_profiles(
                [p.name for p in self.profiles.values() if p.kind == CLUSTER and p.target == name],
                SteeringStore.delete_document_sql("clusters", name))
            del self.clusters[name]

    # -- circuits -------------------------------------------------------------------------

    def get_circuit(self, name: str) -> Circuit:
        circuit = self.circuits.get(name)
        if circuit is None:
            raise not_found("circuit_not_found", "circuit", name)
        return circuit

    async def import_circuit(self, document) -> tuple[Circuit, Live]:
        async with self._lock:
            circuit = documents.parse_circuit(document, self.limits.circuit_max)
            if circuit.mode == documents.SLICE_FALLBACK and \
                    circuit.fallback_cluster not in self.clusters:
                raise documents.invalid_document("fallback_cluster", f"No cluster named "
                                                 f"'{circuit.fallback_cluster}' to fall back to.")
            return circuit, await self._add_imported(CIRCUIT, circuit, self.circuits)

    async def set_circuit_intensity(self, name: str, level: float) -> tuple[Circuit, Live]:
        async with self._lock:
            circuit = self.get_circuit(name)
            high = intensity.circuit_bounds(circuit.intensity_range, self.limits)[1]
            circuit = await self._store_dial(CIRCUIT, circuit, high, level, self.circuits)
            if circuit.mode == documents.SLICE_FALLBACK:
                return circuit, Live(False, f"circuit '{name}' is served by cluster "
                                     f"'{circuit.fallback_cluster}' (slice_fallback); its dial "
                                     "applies")
            return circuit, self._written_live(self.active == name, f"circuit '{name}'")

    async def delete_circuit(self, name: str) -> None:
        async with self._lock:
            self.get_circuit(name)
            await self._delete_profiles(
                [p.name for p in self.profiles.values() if p.kind == CIRCUIT and p.target == name],
                SteeringStore.delete_document_sql("circuits", name))
            del self.circuits[name]

    async def activate_circuit(self, name: str | None) -> Live:
        """Activate a circuit's profile; None deactivates the active circuit,
        never another kind of active profile."""
        if name:
            self.get_circuit(name)
            return await self.activate_profile(name)
        profile = self._default_profile()
        if profile is not None and profile.kind == CIRCUIT:
            return await self.activate_profile(None)
        return self.default_live()

    def active_circuit(self) -> tuple[Circuit | None, CircuitSteering]:
        """The circuit whose profile is active, and whether it is genuinely
        steering (what X-miLLM-Circuit-Rung reports per response)."""
        profile = self._default_profile()
        circuit = (self.circuits.get(profile.target)
                   if profile is not None and profile.kind == CIRCUIT else None)
        if circuit is None:
            return None, CircuitSteering(False, None, "", 0.0, "no circuit is active")

        def off(reason: str) -> tuple[Circuit, CircuitSteering]:
            return circuit, CircuitSteering(False, None, "", circuit.intensity, reason)

        if circuit.mode == documents.SLICE_FALLBACK:
            return off(f"served in slice_fallback mode by cluster '{circuit.fallback_cluster}'")
        if not self.enabled:
            return off("steering is disabled")
        layers = {w.info.layer for w in self.attached.values()}
        if not any(m.layer in layers for m in circuit.members):
            return off("no SAE is attached on any member layer")
        try:
            resolved = self.resolve(None, None)
        except EngineError as exc:
            return off(exc.message)
        if resolved.plan is None or resolved.rung is None:
            return off("the circuit's dial is 0")
        return circuit, CircuitSteering(True, circuit.rung, circuit.language, circuit.intensity,
                                        "")
