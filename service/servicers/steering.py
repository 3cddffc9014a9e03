"""millm.v1.SteeringService: protobuf in, SteeringManager calls, protobuf out.

A write's liveness is the manager's (this replica) combined with the other
replicas' acknowledgements (steering/acks.py), waited for after the manager
call returned, so after the cluster write lock was released."""

from __future__ import annotations

import asyncio
import json

from millm.v1 import steering_pb2, steering_service_pb2, steering_service_pb2_grpc
from service import json_text
from service.errors import EngineError
from service.servicers.error_handling import unary_errors
from service.servicers.steering_features import FeatureRpcs
from service.servicers.steering_vectors import VectorRpcs
from service.steering import acks, documents, manager
from service.steering.explanations import Explanations
from service.steering.features import FeatureRecords
from service.steering.manager import SteeringManager
from service.steering.meaning import MeaningIndex
from service.steering.vector_builds import VectorBuilds

MAX_DOCUMENT_BYTES = 1 << 20

_KINDS = {
    manager.FEATURES: steering_service_pb2.PROFILE_KIND_FEATURES,
    manager.CLUSTER: steering_service_pb2.PROFILE_KIND_CLUSTER,
    manager.CIRCUIT: steering_service_pb2.PROFILE_KIND_CIRCUIT,
}
_MODES = {
    documents.FULL: steering_service_pb2.CIRCUIT_MODE_FULL,
    documents.SLICE_FALLBACK: steering_service_pb2.CIRCUIT_MODE_SLICE_FALLBACK,
}


def _entry_dict(e: steering_pb2.SteeringEntry) -> dict:
    """An entry as the document parser reads it: a control-vector entry's
    unset SAE fields stay out, so one that sets them is refused by name."""
    if e.HasField("abort_when"):
        return {"abort_when": _condition_dict(e.abort_when),
                **({"layer": e.layer} if e.layer else {}),
                **({"feature": e.feature} if e.feature else {}),
                **({"control_vector": e.control_vector} if e.control_vector else {})}
    common = {**({"mode": e.mode} if e.mode else {}),
              **({"value": e.value} if e.HasField("value") else {}),
              **({"when": _condition_dict(e.when)} if e.HasField("when") else {})}
    if e.control_vector:
        return {"control_vector": e.control_vector,
                **({"scale": e.scale} if e.HasField("scale") else {}),
                **({"layer": e.layer} if e.layer else {}),
                **({"feature": e.feature} if e.feature else {}),
                **({"strength": e.strength} if e.HasField("strength") else {}),
                **({"sae_id": e.sae_id} if e.sae_id else {}), **common}
    return {"layer": e.layer, "feature": e.feature,
            **({"strength": e.strength} if e.HasField("strength") else {}),
            **({"sae_id": e.sae_id} if e.sae_id else {}),
            **({"scale": e.scale} if e.HasField("scale") else {}), **common}


def _condition_dict(c: steering_pb2.SteeringCondition) -> dict:
    kind = c.WhichOneof("kind")
    out = {kind: getattr(c, kind)} if kind else {}
    for name in ("above", "layer"):
        if c.HasField(name):
            out[name] = getattr(c, name)
    return out


def _condition_pb(c) -> steering_pb2.SteeringCondition:
    return steering_pb2.SteeringCondition(**c.to_json())


def entries_from_pb(entries, where: str, when=None) -> tuple[documents.SteeringEntry, ...]:
    """`when`: a SteeringCondition for every entry without its own (a profile's)."""
    raw = [_entry_dict(e) for e in entries]
    if when is not None:
        raw = documents.under_condition(raw, _condition_dict(when), "when")
    return documents.parse_entries(raw, where)


def entry_to_pb(e: documents.SteeringEntry) -> steering_pb2.SteeringEntry:
    if e.mode == documents.ABORT:
        return steering_pb2.SteeringEntry(abort_when=_condition_pb(e.when))
    if e.control_vector:
        out = steering_pb2.SteeringEntry(control_vector=e.control_vector)
        if e.mode == documents.ADD:
            out.scale = e.strength
    else:
        out = steering_pb2.SteeringEntry(layer=e.layer, feature=e.feature, sae_id=e.sae_id)
        if e.mode == documents.ADD:
            out.strength = e.strength
    if e.mode != documents.ADD:
        out.mode = e.mode
    if e.mode == documents.CLAMP:
        out.value = e.value
    if e.when is not None:
        out.when.CopyFrom(_condition_pb(e.when))
    return out


def _live(live: manager.Live) -> steering_service_pb2.Liveness:
    return steering_service_pb2.Liveness(live=live.live, reason=live.reason,
                                         replicas=live.replicas,
                                         replicas_applied=live.replicas_applied)


def _range(pb, declared) -> None:
    if declared is not None:
        pb.intensity_range.min, pb.intensity_range.max = declared


def document_from_pb(text: str):
    if len(text.encode()) > MAX_DOCUMENT_BYTES:
        raise documents.invalid_document("document_json", f"The document is larger than "
                                         f"{MAX_DOCUMENT_BYTES} bytes.")
    try:
        return json_text.loads(text)
    except ValueError as exc:
        raise documents.invalid_document("document_json", f"The document is not JSON: "
                                         f"{exc}.") from None


class SteeringServicer(FeatureRpcs, VectorRpcs, steering_service_pb2_grpc.SteeringServiceServicer):
    def __init__(self, steering: SteeringManager, replicas: acks.Registry | None,
                 inference):
        self._m = steering
        self._replicas = replicas
        self._inference = inference  # runs a search's example and a vector build's prompts
        self._builds = VectorBuilds(steering.vectors)
        self._meanings = MeaningIndex()
        self._features = FeatureRecords()
        self._explanations = Explanations(steering.store.db)

    def _liveness(self, live: manager.Live, wait_s: float = acks.ACK_WAIT_S):
        """Awaitable: `live` across the replicas, as protobuf. Called right
        after the manager's write returned (no await between), so the version
        read here is the one that write produced; 0 s: look once (a read)."""
        version = self._m.store.version or 0

        async def wait() -> steering_service_pb2.Liveness:
            found = acks.LONE if self._replicas is None else await self._replicas.wait(
                version, wait_s)
            return _live(acks.across(live, found))

        return wait()

    # -- conversions ---------------------------------------------------------------------

    def _sae(self, info) -> steering_service_pb2.Sae:
        return steering_service_pb2.Sae(
            id=info.id, d_in=info.d_in, d_sae=info.d_sae, architecture=info.architecture,
            hook_name=info.hook_name, layer=info.layer, model_name=info.model_name,
            attached=info.id in self._m.attached, layout=info.layout,
            transcoder=info.transcoder)

    def _state(self) -> steering_service_pb2.SteeringState:
        return steering_service_pb2.SteeringState(
            enabled=self._m.enabled, values=[entry_to_pb(v) for v in self._m.values],
            active_profile=self._m.active, attached_sae_ids=sorted(self._m.attached))

    def _profile(self, p: manager.Profile) -> steering_service_pb2.Profile:
        return steering_service_pb2.Profile(
            name=p.name, description=p.description, kind=_KINDS[p.kind],
            entries=[entry_to_pb(e) for e in p.entries], target=p.target,
            active=self._m.active == p.name, created=p.created, updated=p.updated)

    @staticmethod
    def _cluster(c: documents.Cluster) -> steering_service_pb2.Cluster:
        pb = steering_service_pb2.Cluster(
            name=c.name, description=c.description, members=[entry_to_pb(m) for m in c.members],
            intensity=c.intensity, document_json=json.dumps(c.document()))
        _range(pb, c.intensity_range)
        return pb

    @staticmethod
    def _circuit(c: documents.Circuit) -> steering_service_pb2.Circuit:
        pb = steering_service_pb2.Circuit(
            name=c.name, description=c.description, rung=c.rung, rung_language=c.language,
            members=[entry_to_pb(m) for m in c.members], intensity=c.intensity,
            mode=_MODES[c.mode], fallback_cluster=c.fallback_cluster,
            document_json=json.dumps(c.document()))
        _range(pb, c.intensity_range)
        return pb

    def _info(self, sae_id: str):
        return self._m._info(sae_id)

    def _vector(self, v) -> steering_service_pb2.ControlVector:
        return steering_service_pb2.ControlVector(
            id=v.id, file=v.path.name, n_embd=v.n_embd, layers=list(v.layers),
            model_hint=v.model_hint, layer_count=v.layer_count, size_bytes=v.size_bytes,
            mismatch=self._m.vector_mismatch(v))

    # -- SAEs ------------------------------------------------------------------------------

    @unary_errors
    async def ListSaes(self, request, context):
        found, broken = self._m.list_saes()
        return steering_service_pb2.ListSaesResponse(
            saes=[self._sae(i) for i in found],
            broken=[steering_service_pb2.BrokenSae(id=i, problem=p) for i, p in broken])

    @unary_errors
    async def AttachSae(self, request, context):
        live = await self._m.attach(request.sae_id)
        return steering_service_pb2.AttachSaeResponse(sae=self._sae(self._info(request.sae_id)),
                                                      liveness=await self._liveness(live))

    @unary_errors
    async def DetachSae(self, request, context):
        live = await self._m.detach(request.sae_id)
        return steering_service_pb2.DetachSaeResponse(sae=self._sae(self._info(request.sae_id)),
                                                      liveness=await self._liveness(live))

    @unary_errors
    async def ListControlVectors(self, request, context):
        found, broken = await asyncio.to_thread(self._m.list_control_vectors)
        return steering_service_pb2.ListControlVectorsResponse(
            control_vectors=[self._vector(v) for v in found],
            broken=[steering_service_pb2.BrokenControlVector(id=i, problem=p)
                    for i, p in broken])

    # -- live values ----------------------------------------------------------------------------

    @unary_errors
    async def GetSteering(self, request, context):
        # A read: whether the default steering is live on every replica now.
        state = self._state()
        liveness = await self._liveness(self._m.default_live(), 0)
        return steering_service_pb2.GetSteeringResponse(steering=state, liveness=liveness)

    @unary_errors
    async def SetSteering(self, request, context):
        values = entries_from_pb(request.values, "values") if request.replace_values else None
        if request.values and not request.replace_values:
            raise EngineError("invalid_parameter", "'values' needs 'replace_values': true.",
                              "values")
        enabled = request.enabled if request.HasField("enabled") else None
        live = await self._m.set_steering(values, enabled)
        return steering_service_pb2.SetSteeringResponse(steering=self._state(),
                                                        liveness=await self._liveness(live))

    # -- profiles -------------------------------------------------------------------------------

    @unary_errors
    async def ListProfiles(self, request, context):
        return steering_service_pb2.ListProfilesResponse(
            profiles=[self._profile(p) for p in sorted(self._m.profiles.values(),
                                                       key=lambda p: p.name)])

    @unary_errors
    async def GetProfile(self, request, context):
        return steering_service_pb2.GetProfileResponse(
            profile=self._profile(self._m.get_profile(request.name)))

    @unary_errors
    async def CreateProfile(self, request, context):
        profile, live = await self._m.create_profile(
            request.name, request.description, entries_from_pb(
                request.entries, "entries",
                request.when if request.HasField("when") else None))
        return steering_service_pb2.CreateProfileResponse(profile=self._profile(profile),
                                                          liveness=await self._liveness(live))

    @unary_errors
    async def UpdateProfile(self, request, context):
        if request.entries and not request.replace_entries:
            raise EngineError("invalid_parameter", "'entries' needs 'replace_entries': true.",
                              "entries")
        if request.HasField("when") and not request.replace_entries:
            raise EngineError("invalid_parameter", "'when' applies to new entries: send them "
                              "with 'replace_entries': true.", "when")
        profile, live = await self._m.update_profile(
            request.name,
            request.description if request.HasField("description") else None,
            entries_from_pb(request.entries, "entries",
                            request.when if request.HasField("when") else None)
            if request.replace_entries else None)
        return steering_service_pb2.UpdateProfileResponse(profile=self._profile(profile),
                                                          liveness=await self._liveness(live))

    @unary_errors
    async def DeleteProfile(self, request, context):
        await self._m.delete_profile(request.name)
        return steering_service_pb2.DeleteProfileResponse()

    @unary_errors
    async def ActivateProfile(self, request, context):
        live = await self._m.activate_profile(request.name or None)
        return steering_service_pb2.ActivateProfileResponse(steering=self._state(),
                                                            liveness=await self._liveness(live))

    # -- clusters ---------------------------------------------------------------------------------

    @unary_errors
    async def ImportCluster(self, request, context):
        cluster, live = await self._m.import_cluster(document_from_pb(request.document_json))
        return steering_service_pb2.ImportClusterResponse(cluster=self._cluster(cluster),
                                                          liveness=await self._liveness(live))

    @unary_errors
    async def ListClusters(self, request, context):
        return steering_service_pb2.ListClustersResponse(
            clusters=[self._cluster(c) for _, c in sorted(self._m.clusters.items())])

    @unary_errors
    async def GetCluster(self, request, context):
        return steering_service_pb2.GetClusterResponse(
            cluster=self._cluster(self._m.get_cluster(request.name)))

    @unary_errors
    async def SetClusterIntensity(self, request, context):
        cluster, live = await self._m.set_cluster_intensity(request.name, request.intensity)
        return steering_service_pb2.SetClusterIntensityResponse(cluster=self._cluster(cluster),
                                                                liveness=await self._liveness(live))

    @unary_errors
    async def DeleteCluster(self, request, context):
        await self._m.delete_cluster(request.name)
        return steering_service_pb2.DeleteClusterResponse()

    # -- circuits ---------------------------------------------------------------------------------

    @unary_errors
    async def ImportCircuit(self, request, context):
        circuit, live = await self._m.import_circuit(document_from_pb(request.document_json))
        return steering_service_pb2.ImportCircuitResponse(circuit=self._circuit(circuit),
                                                          liveness=await self._liveness(live))

    @unary_errors
    async def ListCircuits(self, request, context):
        return steering_service_pb2.ListCircuitsResponse(
            circuits=[self._circuit(c) for _, c in sorted(self._m.circuits.items())])

    @unary_errors
    async def GetCircuit(self, request, context):
        return steering_service_pb2.GetCircuitResponse(
            circuit=self._circuit(self._m.get_circuit(request.name)))

    @unary_errors
    async def SetCircuitIntensity(self, request, context):
        circuit, live = await self._m.set_circuit_intensity(request.name, request.intensity)
        return steering_service_pb2.SetCircuitIntensityResponse(circuit=self._circuit(circuit),
                                                                liveness=await self._liveness(live))

    @unary_errors
    async def DeleteCircuit(self, request, context):
        await self._m.delete_circuit(request.name)
        return steering_service_pb2.DeleteCircuitResponse()

    @unary_errors
    async def ActivateCircuit(self, request, context):
        live = await self._m.activate_circuit(request.name or None)
        return steering_service_pb2.ActivateCircuitResponse(steering=self._state(),
                                                            liveness=await self._liveness(live))

    @unary_errors
    async def GetActiveCircuit(self, request, context):
        circuit, state = self._m.active_circuit()
        out = steering_service_pb2.GetActiveCircuitResponse(
            steering=steering_service_pb2.CircuitSteeringState(
                steering=state.steering, language=state.language, intensity=state.intensity,
                reason=state.reason))
        if state.rung is not None:
            out.steering.rung = state.rung
        if circuit is not None:
            out.circuit.CopyFrom(self._circuit(circuit))
        return out


# Every RPC that changes steering state: admin scope when keys are configured.
MUTATING = ("AttachSae", "DetachSae", "SetFeatureExplanation", "ImportFeatureExplanations",
            "CreateControlVector", "CancelControlVectorBuild", "DeleteControlVector",
            "SetSteering", "CreateProfile", "UpdateProfile",
            "DeleteProfile", "ActivateProfile", "ImportCluster", "SetClusterIntensity",
            "DeleteCluster", "ImportCircuit", "SetCircuitIntensity", "DeleteCircuit",
            "ActivateCircuit")
ADMIN_METHODS = frozenset(f"/millm.v1.SteeringService/{name}" for name in MUTATING)
