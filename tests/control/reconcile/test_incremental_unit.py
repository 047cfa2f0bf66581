"""The incremental pass (``incremental``): a pass plans only the models whose inputs changed, keeps what the last
pass derived for the others, and a periodic full pass checks the kept state against a pass from scratch."""

from __future__ import annotations

from dataclasses import replace

import pytest

import sie.control.reconcile.publishing as publishing
from sie.control.reconcile.config import ControlConfig
from sie.control.reconcile.controller import Controller
from sie.control.reconcile.ports import StaticLeadership
from sie.control.reconcile.records import ClusterState
from tests.control.reconcile.test_control_unit import (
    TIMEOUT,
    FakeClock,
    FakePublisher,
    gpu,
    heartbeat,
    register,
    report,
    spec_record,
)

NODES = ("node-a", "node-b")
CHECK_S = 30.0


class ReadBack(FakePublisher):
    """The publisher with the feeder's read-back: what is published lands in the state."""

    def __init__(self, state: ClusterState) -> None:
        super().__init__()
        self.state = state

    def publish(self, records):
        super().publish(records)
        for r in records:
            if r.topic == "assignments":
                self.state.apply_assignment(r.key, r.value)
            elif r.topic == "model-status":
                self.state.apply_model_status(r.key, r.value)


def beat(state: ClusterState, now: float, states: dict[str, str] | None = None) -> None:
    """Every node reports its assigned replicas (READY unless ``states`` says otherwise)."""
    for node in NODES:
        info = state.assignments.get(node)
        reports = [report(a.replica_id, (states or {}).get(a.replica_id, "READY")) for a in (info.replicas if info else ())]
        heartbeat(state, node, now, [gpu(0), gpu(1)], reports)


@pytest.fixture()
def ready():
    """Three models, placed and READY, after a full first pass and a few incremental ones."""
    clock, state = FakeClock(), ClusterState()
    pub = ReadBack(state)
    ctl = Controller(state, pub, StaticLeadership(True, 3),
                     ControlConfig(node_timeout_s=TIMEOUT, failure_cooldown_s=60, full_check_s=CHECK_S))
    for node in NODES:
        register(state, node, [gpu(0), gpu(1)])
        heartbeat(state, node, clock(), [gpu(0), gpu(1)])
    for name in ("alpha", "beta", "gamma"):
        state.apply_spec(name, spec_record(name, 2048, replicas=2))
    for _ in range(4):
        ctl.reconcile(clock.advance(1))
        beat(state, clock())
    ctl.reconcile(clock.advance(1))
    assert {n: s.phase for n, s in ctl.statuses.items()} == {"alpha": "Ready", "beta": "Ready", "gamma": "Ready"}
    return clock, state, pub, ctl


def test_a_pass_with_nothing_changed_plans_no_model_and_keeps_every_status(ready, monkeypatch):
    clock, state, pub, ctl = ready
    built: list[str] = []
    real = publishing.build_status
    monkeypatch.setattr(publishing, "build_status", lambda name, *a, **k: built.append(name) or real(name, *a, **k))
    before = dict(ctl.statuses)
    beat(state, clock.advance(1))  # the same reports, a new time
    rep = ctl.reconcile(clock())
    assert rep.planned == frozenset() and not rep.errors and rep.published == ()
    assert built == []
    assert all(ctl.statuses[n] is before[n] for n in before)


def test_a_changed_report_replans_its_model_only(ready):
    clock, state, pub, ctl = ready
    before = dict(ctl.statuses)
    beat(state, clock.advance(1), {"beta-1": "STARTING"})
    rep = ctl.reconcile(clock())
    assert rep.planned == frozenset({"beta"})
    assert ctl.statuses["beta"].phase == "Progressing" and ctl.statuses["beta"].ready_replicas == 1
    assert ctl.statuses["alpha"] is before["alpha"] and ctl.statuses["gamma"] is before["gamma"]
    assert [r.key for r in rep.of("model-status")] == ["beta"]


def test_a_new_spec_is_placed_and_assigned_while_the_others_are_kept(ready):
    clock, state, pub, ctl = ready
    before = dict(ctl.statuses)
    state.apply_spec("delta", spec_record("delta", 2048))
    rep = ctl.reconcile(clock.advance(1))
    assert "delta" in rep.planned
    placed = [r.value["replica_id"] for r in rep.of("events") if r.value["kind"] == "placed"]
    assert placed == ["delta-0"]
    assigned = {a["replica_id"] for r in rep.of("assignments") for a in r.value["replicas"]}
    assert "delta-0" in assigned
    assert ctl.statuses["alpha"] is before["alpha"] and ctl.statuses["delta"].phase == "Progressing"


def test_a_node_gone_offline_replans_the_models_placed_there(ready):
    clock, state, pub, ctl = ready
    on_b = {a.model for a in state.assignments["node-b"].replicas}
    assert on_b
    for _ in range(int(TIMEOUT) + 2):  # node-b falls silent
        clock.advance(1)
        info = state.assignments.get("node-a")
        heartbeat(state, "node-a", clock(), [gpu(0), gpu(1)], [report(a.replica_id, "READY") for a in info.replicas])
        rep = ctl.reconcile(clock())
        if rep.planned and on_b <= rep.planned:
            break
    else:
        pytest.fail("node-b offline never re-planned its models")
    assert all(v.node != "node-b" for n in on_b for v in ctl.statuses[n].replicas)


def test_the_periodic_check_repairs_a_kept_status_that_differs(ready):
    clock, state, pub, ctl = ready
    good = ctl.statuses["beta"]
    ctl.statuses["beta"] = replace(good, phase="Degraded", reason="a kept value gone wrong")
    rep = ctl.reconcile(clock.advance(1))
    assert rep.planned == frozenset() and ctl.statuses["beta"].phase == "Degraded"  # kept: nothing changed
    beat(state, clock.advance(CHECK_S))
    rep = ctl.reconcile(clock())
    assert rep.checked and rep.planned is None and rep.mismatched == 1
    assert ctl.statuses["beta"].same_as(good)
    health = ctl.health()["incremental"]
    assert health["checks"] >= 1 and health["mismatches"] == 1 and health["last_mismatch"] == "statuses: beta"


def test_a_check_of_a_correct_state_finds_nothing(ready):
    clock, state, pub, ctl = ready
    beat(state, clock.advance(CHECK_S))
    rep = ctl.reconcile(clock())
    assert rep.checked and rep.mismatched == 0 and ctl.health()["incremental"]["mismatches"] == 0


def test_a_failed_publish_makes_the_next_pass_plan_everything(ready):
    clock, state, pub, ctl = ready
    state.apply_spec("delta", spec_record("delta", 2048))
    pub.fail_with = RuntimeError("broker unavailable")
    assert "publish" in ctl.reconcile(clock.advance(1)).errors
    rep = ctl.reconcile(clock.advance(1))
    assert rep.planned is None and not rep.errors
    assert "delta-0" in {a["replica_id"] for r in rep.of("assignments") for a in r.value["replicas"]}
    assert any(r.key == "delta" for r in rep.of("model-status"))


def test_the_journal_names_what_records_touched():
    state = ClusterState()
    assert state.take_changes().everything  # the first pass plans everything
    register(state, "node-a", [gpu(0)])
    state.apply_spec("alpha", spec_record("alpha"))
    heartbeat(state, "node-a", 1.0, [gpu(0)], [report("alpha-0", "READY"), report("beta-0", "READY")])
    changes = state.take_changes()
    assert (changes.models, changes.nodes, changes.everything) == ({"alpha", "beta"}, {"node-a"}, False)
    heartbeat(state, "node-a", 2.0, [gpu(0)], [report("alpha-0", "READY"), report("beta-0", "READY")])
    assert state.take_changes().models == set()  # the same reports at a later time
    heartbeat(state, "node-a", 3.0, [gpu(0)], [report("alpha-0", "STARTING")])
    assert state.take_changes().models == {"alpha", "beta"}  # one changed, one no longer reported
    lagging = {**report("alpha-0", "STARTING"), "lag": 500}
    heartbeat(state, "node-a", 4.0, [gpu(0)], [lagging])
    changes = state.take_changes()
    assert (changes.models, changes.signals) == (set(), {"alpha"})  # the director's signal, not a status input
    state.apply_event({"ts_ms": 0, "kind": "cooldown_reset_requested", "replica_id": "alpha-0"})
    assert state.take_changes().everything


def test_a_due_check_waits_for_a_pass_without_an_apply_at_most_one_more_period(ready):
    clock, state, pub, ctl = ready
    state.apply_spec("delta", spec_record("delta", 2048))
    rep = ctl.reconcile(clock.advance(CHECK_S))
    assert not rep.checked and "delta" in rep.planned  # the apply does not wait behind a full pass
    rep = ctl.reconcile(clock.advance(1))
    assert rep.checked and rep.mismatched == 0
    for step in range(3):  # an apply on every pass: the check runs once overdue by a whole period
        state.apply_spec("delta", spec_record("delta", 2048 + step))
        rep = ctl.reconcile(clock.advance(CHECK_S))
        assert rep.checked == (step == 1), step
