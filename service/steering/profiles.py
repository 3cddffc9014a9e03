"""Profiles, and the clusters and circuits operators import, each stored
with the profile that names it: create, update, delete and activate a
profile; import, dial and delete a cluster or circuit; which circuit is
active and whether it genuinely steers.

Why a module of its own: these are the named steering bases operators
write, apart from how they are used. The manager (manager.py) owns the
snapshot they are kept in and the attached SAEs, and resolution.py how a
request's steering resolves; ProfileWrites is a mixin of SteeringManager and
relies on its state
(store, _lock, profiles, clusters, circuits, active, enabled, attached,
limits) and its checks (_check_entries, _base_of, _plan, _level,
_default_profile, default_live, resolve). Every write takes the write lock
and goes to the store before the snapshot changes, as everywhere in the
manager.
"""

from __future__ import annotations

import time
from dataclasses import replace

from service.errors import EngineError
from service.state.database import check_storable
from service.steering import documents, intensity
from service.steering.completion import completes
from service.steering.documents import Circuit, Cluster, SteeringEntry
from service.steering.records import (
    CIRCUIT,
    CLUSTER,
    FEATURES,
    CircuitSteering,
    Live,
    Profile,
    not_found,
)
from service.steering.store import SteeringStore


class ProfileWrites:
    """Profiles, clusters and circuits: SteeringManager's management of them."""

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

    @completes
    async def create_profile(self, name: str, description: str,
                             entries: tuple[SteeringEntry, ...]) -> tuple[Profile, Live]:
        async with self._lock:
            documents.parse_name(name)
            check_storable(description, "description")
            if name in self.profiles:
                raise EngineError("already_exists", f"A profile named '{name}' exists.", "name")
            self._check_entries(entries, "entries")
            now = int(time.time())
            profile = Profile(name, FEATURES, entries, "", description, now, now)
            await self.store.put_profile(profile.row())
            self.profiles[name] = profile
            return profile, self._profile_live(name)

    @completes
    async def update_profile(self, name: str, description: str | None,
                             entries: tuple[SteeringEntry, ...] | None) -> tuple[Profile, Live]:
        async with self._lock:
            profile = self.get_profile(name)
            if description is not None:
                check_storable(description, "description")
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

    @completes
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

    @completes
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

    @completes
    async def import_cluster(self, document) -> tuple[Cluster, Live]:
        async with self._lock:
            cluster = documents.parse_cluster(document, self.limits.cluster_max)
            return cluster, await self._add_imported(CLUSTER, cluster, self.clusters)

    @completes
    async def set_cluster_intensity(self, name: str, level: float) -> tuple[Cluster, Live]:
        async with self._lock:
            cluster = self.get_cluster(name)
            high = intensity.cluster_bounds(cluster.intensity_range, self.limits)[1]
            cluster = await self._store_dial(CLUSTER, cluster, high, level, self.clusters)
            return cluster, self._written_live(self._backs_default(name), f"cluster '{name}'")

    @completes
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

    @completes
    async def import_circuit(self, document) -> tuple[Circuit, Live]:
        async with self._lock:
            circuit = documents.parse_circuit(document, self.limits.circuit_max)
            if circuit.mode == documents.SLICE_FALLBACK and \
                    circuit.fallback_cluster not in self.clusters:
                raise documents.invalid_document("fallback_cluster", f"No cluster named "
                                                 f"'{circuit.fallback_cluster}' to fall back to.")
            return circuit, await self._add_imported(CIRCUIT, circuit, self.circuits)

    @completes
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

    @completes
    async def delete_circuit(self, name: str) -> None:
        async with self._lock:
            self.get_circuit(name)
            await self._delete_profiles(
                [p.name for p in self.profiles.values() if p.kind == CIRCUIT and p.target == name],
                SteeringStore.delete_document_sql("circuits", name))
            del self.circuits[name]

    @completes
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
        if not any(m.layer in layers or m.control_vector for m in circuit.members):
            return off("no SAE is attached on any member layer")
        try:
            resolved = self.resolve(None, None)
        except EngineError as exc:
            return off(exc.message)
        if resolved.plan is None or resolved.rung is None:
            return off("the circuit's dial is 0")
        return circuit, CircuitSteering(True, circuit.rung, circuit.language, circuit.intensity,
                                        "")
