"""The steering dial's rules as a table: every example the reference gives is
a row, plus the edges around them (service/steering/intensity.py)."""

from __future__ import annotations

import asyncio

import pytest

from service.errors import EngineError
from service.steering.intensity import (
    IntensityLimits,
    parse_dial,
    resolve_circuit,
    resolve_cluster,
    scaled,
)

LIMITS = IntensityLimits()  # cluster [0.5, 2.0], circuit [0.0, 2.0]
AUTHORED = (0.5, 1.5)

CLUSTER_ROWS = [
    # (dial, stored dial, declared range, resolved λ, why)
    (None, 0.8, AUTHORED, 0.8, "no dial: the cluster's persistent dial"),
    (1.2, 0.8, AUTHORED, 1.2, "a request dial overrides the stored one"),
    (2.0, 1.0, AUTHORED, 1.5, "numeric λ is capped at the declared maximum"),
    (0.1, 1.0, AUTHORED, 0.1, "dialing below the declared floor is honoured"),
    ("min", 1.0, AUTHORED, 0.5, "min is the declared minimum"),
    ("max", 1.0, AUTHORED, 1.5, "max is the declared maximum"),
    ("min", 1.0, None, 0.5, "no range: min is CLUSTER_INTENSITY_MIN"),
    ("max", 1.0, None, 2.0, "no range: max is the configured maximum"),
    (1.9, 1.0, None, 1.9, "no range: capped only at the configured maximum"),
    ("min", 1.0, (0.0, 3.0), 0.0, "a declared range is intersected with [0, 2]"),
    ("max", 1.0, (0.0, 3.0), 2.0, "a declared range is intersected with [0, 2]"),
    (0.0, 1.0, AUTHORED, 0.0, "0 is off"),
    ("off", 1.0, AUTHORED, 0.0, "off is off"),
    ("min", 1.0, (3.0, 5.0), 2.0, "a range above the envelope keeps its nearest edge"),
]

CIRCUIT_ROWS = [
    (0.1, 1.0, AUTHORED, 0.5, "0.1 against an authored [0.5, 1.5] resolves to 0.5"),
    (1.9, 1.0, AUTHORED, 1.5, "clamped at the ceiling too"),
    (1.0, 0.7, AUTHORED, 1.0, "inside the range: as sent"),
    (None, 0.7, AUTHORED, 0.7, "no dial: the circuit's own dial"),
    (None, 0.1, AUTHORED, 0.5, "the stored dial is clamped into the range too"),
    (None, 0.0, AUTHORED, 0.0, "a stored dial of 0 stays off"),
    (0.0, 1.0, AUTHORED, 0.0, "only an exact 0 goes below the floor"),
    ("off", 1.0, AUTHORED, 0.0, "and off"),
    ("min", 1.0, AUTHORED, 0.5, "min is the declared floor"),
    ("max", 1.0, AUTHORED, 1.5, "max is the declared ceiling"),
    ("min", 1.0, None, 0.0, "min on a rangeless circuit is off (CIRCUIT_INTENSITY_MIN 0)"),
    ("max", 1.0, None, 2.0, "max on a rangeless circuit is the envelope's"),
    (0.01, 1.0, None, 0.01, "no range: nothing clamps a small λ"),
    (1.0, 1.0, (2.5, 3.0), 2.0, "a range above the envelope keeps its nearest edge"),
]


@pytest.mark.parametrize(("dial", "stored", "declared", "expected", "why"), CLUSTER_ROWS,
                         ids=[r[4] for r in CLUSTER_ROWS])
def test_cluster_rule(dial, stored, declared, expected, why):
    assert resolve_cluster(parse_dial(dial), stored, declared, LIMITS) == expected


@pytest.mark.parametrize(("dial", "stored", "declared", "expected", "why"), CIRCUIT_ROWS,
                         ids=[r[4] for r in CIRCUIT_ROWS])
def test_circuit_rule(dial, stored, declared, expected, why):
    assert resolve_circuit(parse_dial(dial), stored, declared, LIMITS) == expected


def test_configured_floors_and_ceilings():
    limits = IntensityLimits(cluster_min=0.25, cluster_max=1.25, circuit_min=0.3,
                             circuit_max=1.8)
    assert resolve_cluster("min", 1.0, None, limits) == 0.25
    assert resolve_cluster(1.6, 1.0, None, limits) == 1.25
    assert resolve_circuit(0.1, 1.0, None, limits) == 0.3
    assert resolve_circuit(0.1, 1.0, AUTHORED, limits) == 0.5
    assert resolve_circuit("max", 1.0, AUTHORED, limits) == 1.5
    assert resolve_circuit(1.9, 1.0, (0.2, 1.9), limits) == 1.8


def test_members_are_rederived_and_clamped_at_apply_time():
    # Absolute, not compounding: λ scales the authored strength each time.
    assert scaled(120.0, 1.5) == 180.0
    assert scaled(scaled(120.0, 1.5), 1.0) == 180.0
    # The ±200 ceiling compresses strong members while weak ones keep scaling.
    assert [scaled(s, 2.0) for s in (150.0, -150.0, 40.0)] == [200.0, -200.0, 80.0]


@pytest.mark.parametrize("value", [2.01, -0.5, float("nan"), float("inf"), "medium", "OFF",
                                   True, [1]])
def test_bad_dials_are_invalid_parameter(value):
    with pytest.raises(EngineError) as caught:
        parse_dial(value)
    assert caught.value.code == "invalid_parameter"
    assert caught.value.param == "steering_intensity"


def test_stored_dials_are_clamped_when_the_configured_maximum_drops(tmp_path):
    import json

    from service.steering.manager import SteeringManager
    from service.steering.store import SteeringStore

    store = SteeringStore(tmp_path / "steering.sqlite3")
    asyncio.run(store.write(SteeringStore.put_document_sql("clusters", {
        "name": "c", "intensity": 1.8, "members": [{"layer": 0, "feature": 1, "strength": 1.0}]})))
    store.close()
    manager = SteeringManager(SteeringStore(tmp_path / "steering.sqlite3"), tmp_path,
                              IntensityLimits(cluster_max=1.5))
    assert manager.clusters["c"].intensity == 1.5
    assert json.loads(json.dumps(manager.clusters["c"].document()))["intensity"] == 1.5
