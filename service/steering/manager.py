"""The steering state operators manage, and the resolution of a request's
steering against it.

State: SAEs (on disk; which are attached), the live values and whether
steering is enabled, profiles, clusters (with their dial), circuits (with
theirs) and the active profile. Every write goes to the state database
first (SQLite, or the PostgreSQL replicas share), then replaces the
in-memory snapshot; requests read the snapshot when they are
validated and carry what they resolved (a SteeringPlan) into the batch, so no
request ever writes global state and an operator's change is never undone by
one. A change applies to requests validated after it.

This module is the part that owns the state: the snapshot (and following
other replicas' snapshots), binding to the loaded model, attaching SAEs, and
the live values. Two mixins of SteeringManager hold the rest: resolving a
request's steering into a plan is resolution.py's, writes to profiles,
clusters and circuits are profiles.py's. The values they all build and answer
with are records.py's, exported here too for the callers that import them
from here.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib

import torch

from service.errors import EngineError
from service.steering import control_vectors, documents, intensity
from service.steering.completion import completes
from service.steering.control_vectors import ControlVector, ControlVectorDirectory
from service.steering.documents import Circuit, Cluster, SteeringEntry
from service.steering.profiles import ProfileWrites
from service.steering.records import (  # noqa: F401 - re-exported (module docstring)
    CIRCUIT,
    CLUSTER,
    FEATURES,
    UNSTEERED,
    Live,
    Profile,
    Resolved,
    steering_unavailable,
)
from service.steering.resolution import SteeringResolution
from service.steering.sae import SaeDirectory, SaeInfo, SaeWeights
from service.steering.store import Snapshot, SteeringStore

log = logging.getLogger(__name__)


class SteeringManager(ProfileWrites, SteeringResolution):
    def __init__(self, store: SteeringStore, saes_dir: pathlib.Path,
                 limits: intensity.IntensityLimits | None = None,
                 vectors_dir: pathlib.Path | None = None):
        self.store = store
        self.saes = SaeDirectory(saes_dir)
        self.vectors = ControlVectorDirectory(vectors_dir)
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
        # Stored entries naming a control vector this model cannot take steer
        # nothing (as an SAE that does not fit is not re-attached): say so.
        control_vectors.warn_unfit(
            [self.values, *(p.entries for p in self.profiles.values()),
             *(c.members for c in [*self.clusters.values(), *self.circuits.values()])],
            self.vectors, self._model)

    # -- SAEs ---------------------------------------------------------------------------

    def list_saes(self) -> tuple[list[SaeInfo], list[tuple[str, str]]]:
        return self.saes.scan()

    def list_control_vectors(self) -> tuple[list[ControlVector], list[tuple[str, str]]]:
        return self.vectors.scan()

    def vector_mismatch(self, vector: ControlVector) -> str:
        """Why `vector` cannot steer the loaded model ('' when it can, or
        when no steerable model is loaded)."""
        return vector.mismatch(self._model) if self._model is not None else ""

    def sae_info(self, sae_id: str) -> SaeInfo:
        """An SAE on disk, attached or not (sae_not_found, invalid_sae)."""
        return self._info(sae_id)

    def decoder(self, info: SaeInfo) -> torch.Tensor:
        """`info`'s decoder rows [d_sae, d_in]: the attached copy, or read
        from disk (a blocking read: call it off the event loop)."""
        attached = self.attached.get(info.id)
        if attached is not None:
            return attached.W_dec
        return SaeWeights(info, torch.device("cpu"), torch.float32).W_dec

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
                                       "loaded, or its engine cannot reach its residual stream).")
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

    @completes
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

    @completes
    async def detach(self, sae_id: str) -> Live:
        async with self._lock:
            if sae_id not in self.attached:
                self._info(sae_id)  # 404 when it does not exist at all
            await self.store.set_attached(sae_id, False)
            self.attached.pop(sae_id, None)
            if sae_id in self.attached_ids:
                self.attached_ids.remove(sae_id)
            return self.default_live()

    # -- live values ------------------------------------------------------------------------

    @completes
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

