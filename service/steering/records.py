"""The values the steering manager keeps and answers with: the kinds of
profile, a stored profile, a request's resolved steering (Resolved), a
write's liveness (Live), the active circuit's state (CircuitSteering) and
the errors both halves of the manager raise.

Why a module of their own: the manager (manager.py) and its management of
profiles, clusters and circuits (profiles.py) both build them, so they sit
below both. Callers import them from manager.py, which uses and so exports
the ones they name (Live, Profile, Resolved, UNSTEERED, the kinds).
"""

from __future__ import annotations

from dataclasses import dataclass

from service.errors import EngineError
from service.steering import documents
from service.steering.documents import SteeringEntry
from service.steering.plan import SteeringPlan

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

