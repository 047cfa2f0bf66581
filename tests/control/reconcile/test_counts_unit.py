"""``desired_count``: the one rule for a model's replica count (issue 39), its table of cases over real specs, and
the controller's count sites going through it (a scale decision, the director's floor and a rollout's trial
replica reach placement as ``desired_count`` says)."""

from __future__ import annotations

import json
import sys

import pytest

from sie.control.reconcile.config import ControlConfig
from sie.control.reconcile.controller import Controller
from sie.control.reconcile.counts import can_scale, ceiling, desired_count, scale_range
from sie.control.reconcile.ports import StaticLeadership
from sie.control.reconcile.records import ClusterState
from sie.schemas.spec import ModelService
from tests.control.reconcile.test_control_unit import (
    TIMEOUT,
    FakeClock,
    FakePublisher,
    assigned,
    gpu,
    heartbeat,
    register,
    spec_record,
)


def spec(lo: int, hi: int, priority: str = "P1") -> ModelService:
    record = spec_record("m", 0, priority=priority, sla={"min_replicas": lo, "max_replicas": hi})
    return ModelService.from_document(json.loads(record["spec_json"]))


# (min, max, priority, autoscaled, director floor, rebalance floor, surge) -> count
CASES = [
    ((2, 5, "P1", None, 0, 0, 0), 2),   # no autoscaler count: the spec's minimum
    ((0, 5, "P1", None, 0, 0, 0), 0),   # scale-to-zero model at rest
    ((2, 5, "P1", 4, 0, 0, 0), 4),      # the autoscaler's count wins over the minimum
    ((2, 5, "P1", 0, 0, 0, 0), 0),      # ... also when it scaled to zero (decide enforces the bounds, not this)
    ((2, 5, "P1", -3, 0, 0, 0), 0),     # never negative
    ((2, 5, "P1", 3, 4, 0, 0), 4),      # the director's extra replica is a floor under the count
    ((2, 5, "P1", 5, 4, 0, 0), 5),      # ... a floor never lowers it
    ((2, 5, "P1", None, 3, 0, 0), 3),   # ... also on the spec's minimum
    ((2, 5, "P1", 2, 0, 3, 0), 3),      # a move's replacement replica
    ((2, 5, "P1", 2, 4, 3, 0), 4),      # both floors: the higher
    ((2, 5, "P1", 2, 0, 0, 1), 3),      # a rollout's trial replica: one more than the count
    ((2, 5, "P1", 2, 3, 0, 1), 4),      # ... on top of the floors
    ((0, 2, "P1", None, 0, 0, 1), 1),   # ... also for a model at zero
    ((2, 5, "P1", 2, 0, 0, -1), 2),     # a negative surge adds nothing
]


@pytest.mark.parametrize(("case", "want"), CASES)
def test_desired_count_table(case, want):
    lo, hi, priority, autoscaled, director, rebalance, surge = case
    got = desired_count(spec(lo, hi, priority), autoscaled, director_floor=director, rebalance_floor=rebalance,
                        surge=surge)
    assert got == want


@pytest.mark.parametrize(("lo", "hi", "priority", "want_range", "scales", "top"), [
    (1, 3, "P1", (1, 3), True, 3),
    (2, 2, "P1", (2, 2), False, 2),   # fixed size: nothing for the autoscaler to decide
    (0, 2, "P1", (0, 2), True, 2),    # scale to zero
    (0, 1, "P0", (1, 1), False, 1),   # a P0 model is never scaled to zero: 0..1 is fixed at 1
    (0, 3, "P0", (1, 3), True, 3),
])
def test_range_and_ceiling(lo, hi, priority, want_range, scales, top):
    s = spec(lo, hi, priority)
    assert scale_range(s) == want_range
    assert can_scale(s) is scales
    assert ceiling(s) == top


def test_a_duck_typed_spec_is_enough():
    class Sla:
        min_replicas, max_replicas = 1, 4

    class Spec:
        sla, priority_level = Sla(), "P2"

    assert desired_count(Spec(), None, surge=1) == 2
    assert scale_range(Spec()) == (1, 4)


@pytest.fixture()
def world():
    clock = FakeClock()
    state = ClusterState()
    pub = FakePublisher()
    ctl = Controller(state, pub, StaticLeadership(True, 1), ControlConfig(node_timeout_s=TIMEOUT))
    for node in ("node-a", "node-b"):
        register(state, node, [gpu(0), gpu(1)])
        heartbeat(state, node, clock(), [gpu(0), gpu(1)])
    return clock, state, pub, ctl


def test_every_count_of_a_pass_goes_through_desired_count(world, monkeypatch):
    """The controller decides no count of its own: with ``desired_count`` answering one more than its rule,
    the pass places one more replica of each model."""
    clock, state, pub, ctl = world
    state.apply_spec("a", spec_record("a", 1024, replicas=2))
    state.apply_spec("b", spec_record("b", 1024, replicas=1))
    real = desired_count

    def plus_one(spec, autoscaled=None, **layers):
        return real(spec, autoscaled, **layers) + 1

    # every module of the control plane that calls the rule (the controller and its step modules)
    sites = [m for name, m in sorted(sys.modules.items())
             if name.startswith("sie.control.") and name != "sie.control.reconcile.counts"
             and getattr(m, "desired_count", None) is real]
    assert {"sie.control.reconcile.controller", "sie.control.reconcile.scaling",
            "sie.control.reconcile.demands"} <= {m.__name__ for m in sites}
    for module in sites:
        monkeypatch.setattr(module, "desired_count", plus_one)
    ctl.reconcile(clock())
    replicas = set().union(*assigned(pub).values())
    assert {r for r in replicas if r.startswith("a-")} == {"a-0", "a-1", "a-2"}
    assert {r for r in replicas if r.startswith("b-")} == {"b-0", "b-1"}
