"""How a request's steering resolves against the managed state: from the
profile it names (or the active profile, or the live values) and its dial to
a SteeringPlan on the SAEs attached now; and whether the default steering
would steer at all (default_live).

Why a module of its own: this is the read side of the steering state, run for
every request at validation, apart from the writes that change the state.
SteeringResolution is a mixin of SteeringManager (manager.py) and reads its
state (attached, values, enabled, active, profiles, clusters, circuits,
vectors, limits, _model); it writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.errors import EngineError
from service.steering import control_vectors, documents, intensity
from service.steering.conditions import PROBE, SCORED, Condition
from service.steering.documents import ABORT, SteeringEntry
from service.steering.plan import ABLATE, ADD, LayerSteering, ScoreRule, SteeringPlan
from service.steering.records import CIRCUIT, CLUSTER, FEATURES, UNSTEERED, Live, Profile, Resolved
from service.steering.sae import SaeWeights


@dataclass(frozen=True)
class _Base:
    """What a request's steering starts from, with the rule its dial follows."""

    rule: str  # CLUSTER (numeric λ capped above) or CIRCUIT (clamped both ends)
    entries: tuple[SteeringEntry, ...]
    stored: float
    declared: tuple[float, float] | None
    rung: int | None = None



class SteeringResolution:
    """Resolving steering: SteeringManager's read side."""

    # Set while checking entries being written (which may name SAEs not attached yet).
    _writing = False

    def find_probe(self, name: str):
        """A monitoring probe by name (monitoring.py sets the lookup); None: none."""
        return None

    def _by_layer(self) -> dict[int, SaeWeights]:
        return {w.info.layer: w for w in self.attached.values()}

    def _plan(self, entries: tuple[SteeringEntry, ...], level: float,
              where: str) -> SteeringPlan | None:
        """Entries at dial λ on the SAEs attached now; entries at layers with
        no SAE attached do not steer. A feature past the SAE's width, or an
        entry pinned to another SAE than the one attached, is refused.
        Control-vector entries steer on top (control_vectors.py), with or
        without an SAE. Entries with a condition form one block per distinct
        condition, in the order they first appear."""
        groups: dict = {}  # condition (None: always) -> its steering entries
        aborts: dict = {}  # abort_when condition -> its entry
        for i, e in enumerate(entries):
            if e.mode == ABORT:
                aborts[e.when] = i
                groups.setdefault(e.when, [])
            else:
                groups.setdefault(e.when, []).append(i)
        always, conditional, rules = (), [], []
        for when, indices in groups.items():
            layers = self._layers(entries, indices, level, where)
            if when is None:
                always = layers
                continue
            if not layers and when not in aborts:
                continue
            first = aborts.get(when, indices[0] if indices else 0)
            rule = self._rule(when, f"{where}[{first}]", when in aborts)
            if rule is False:
                continue  # unreadable now: its entries do not steer, as at a layer with no SAE
            conditional.append((when, layers))
            rules.append(rule)
        if not always and not conditional:
            return None
        return SteeringPlan(always, tuple(conditional), tuple(rules),
                            tuple(c in aborts for c, _ in conditional))

    def _rule(self, when: Condition, where: str, aborts: bool) -> ScoreRule | None | bool:
        """A feature or probe condition bound to the SAE attached now (None for
        the other kinds). An unknown probe, or a feature past the SAE's width,
        is refused; one whose SAE is not attached is False (its entries do not
        steer) unless it ends rows, which must not silently stop."""
        if when.kind not in SCORED:
            return None
        if when.kind == PROBE:
            probe = self.find_probe(when.text)
            if probe is None:
                raise EngineError("invalid_steering_condition", f"{where} names probe "
                                  f"'{when.text}', which does not exist.", f"{where}.when")
            sae = self.attached.get(probe.sae_id)
            layer, features, threshold = probe.layer, probe.features, probe.threshold
        else:
            sae = self._by_layer().get(when.layer)
            layer, features, threshold = when.layer, ((when.feature, 1.0),), when.above
            if sae is not None and when.feature >= sae.info.d_sae:
                raise EngineError("invalid_feature_index", f"{where}'s condition names feature "
                                  f"{when.feature}, past the width of {sae.info.id} "
                                  f"({sae.info.d_sae} features).", f"{where}.when.feature")
        if sae is not None and sae.info.transcoder:
            raise EngineError("invalid_steering_condition", f"{where}'s condition reads "
                              f"{sae.info.id}, a transcoder, whose features are not read here.",
                              f"{where}.when")
        if sae is None:
            if aborts and not self._writing:
                raise EngineError("invalid_steering_condition", f"{where}'s condition reads "
                                  f"layer {layer}, where its SAE is not attached now; attach it "
                                  "or remove the entry.", where)
            return False
        return ScoreRule(layer, sae, features, threshold, when.kind == PROBE, sae.info.id)

    def _layers(self, entries: tuple[SteeringEntry, ...], indices: list[int], level: float,
                where: str) -> tuple[LayerSteering, ...]:
        by_layer = self._by_layer()
        # layer -> (features, strengths, added vector, edits in entry order)
        per_layer: dict[int, tuple[list[int], list[float], list, list]] = {}
        for i in indices:
            e = entries[i]
            if e.control_vector:
                for layer, (add, edit) in control_vectors.entry_ops(
                        e, level, self.vectors, self._model).items():
                    _, _, adds, edits = per_layer.setdefault(layer, ([], [], [], []))
                    if add is not None:
                        adds.append(add)
                    if edit is not None:
                        edits.append(edit)
                continue
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
            if e.mode != ADD:
                edit = sae.edit(e.feature, e.value, e.mode == ABLATE, level, f"{where}[{i}]")
                per_layer.setdefault(e.layer, ([], [], [], []))[3].append(edit)
                continue
            strength = intensity.scaled(e.strength, level)
            if strength == 0.0:
                continue
            features, strengths, _, _ = per_layer.setdefault(e.layer, ([], [], [], []))
            features.append(e.feature)
            strengths.append(strength)
        layers = []
        for layer in sorted(per_layer):
            features, strengths, adds, edits = per_layer[layer]
            vector = (by_layer[layer].direction(features, strengths).float().cpu().numpy()
                      if features else None)
            for add in adds:
                vector = add if vector is None else vector + add
            if vector is None and not edits:
                continue
            layers.append(LayerSteering(layer, by_layer[layer].info.id if features else "",
                                        tuple(features), tuple(strengths), vector,
                                        tuple(edits)))
        return tuple(layers)

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

    def default_live(self) -> Live:
        """Whether the default steering (active profile, else live values)
        steers the next request that names no profile."""
        if not self.enabled:
            return Live(False, "steering is disabled")
        profile = self._default_profile()
        base = self._base_of(profile)
        vectors = base is not None and any(e.control_vector for e in base.entries)
        if not self.attached and not vectors:
            return Live(False, "no SAE is attached")
        if base is None:
            return Live(False, "the steering base is empty")
        try:
            plan = self._plan(base.entries, self._level(base, None), "steering")
        except EngineError as exc:
            return Live(False, exc.message)
        if plan is None:
            return Live(False, control_vectors.unfit(base.entries, self.vectors, self._model)
                        or "no entry is at a layer with an SAE attached, or the dial is 0")
        return Live(True)

    def _check_entries(self, entries: tuple[SteeringEntry, ...], where: str) -> None:
        """Entries the attached SAEs refuse now are refused when written, and
        so are control vectors that are not on disk or do not fit the model."""
        control_vectors.check_entries(entries, where, self.vectors, self._model)
        self._writing = True
        try:
            self._plan(entries, 1.0, where)
        finally:
            self._writing = False
        if self._model is not None:
            for i, e in enumerate(entries):
                if e.layer >= self._model[1]:
                    raise EngineError("invalid_feature_index", f"{where}[{i}] is at layer "
                                      f"{e.layer}; the model has layers 0-{self._model[1] - 1}.",
                                      where)
