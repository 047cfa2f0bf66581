"""``scaling``: each model's count, layer by layer, as pure functions over a snapshot, decisions and times (a
fake clock: values, no sleeps): fixed-size models, a standby following the leader, the floors under a count."""

from __future__ import annotations

from types import MappingProxyType

from sie.control.placement.results import PlacementPlan, Unplaced
from sie.control.reconcile import scaling
from sie.control.reconcile.autoscaler import AutoscalePolicy, ScaleDecision
from sie.control.reconcile.counts import can_scale
from sie.control.reconcile.director import Extra
from sie.control.reconcile.records import AssignedReplica, AssignmentInfo, ClusterState
from tests.control.reconcile.test_control_unit import gpu, heartbeat, register, report, spec_record

NOW = 1_000_000.0


def no_rollout(model: str) -> str | None:
    return None


def world() -> ClusterState:
    state = ClusterState()
    state.apply_spec("fixed", spec_record("fixed", replicas=2))
    rec = spec_record("elastic", replicas=1)
    rec["spec_json"] = rec["spec_json"].replace('"max_replicas": 1', '"max_replicas": 4')
    state.apply_spec("elastic", rec)
    return state


def test_a_standby_follows_the_decisions_and_a_fixed_size_model_has_none():
    snap = world().snapshot()
    assert can_scale(snap.specs["elastic"]) and not can_scale(snap.specs["fixed"])
    held = {"elastic": ScaleDecision(3, "up", "backlog", NOW, NOW, NOW), "fixed": ScaleDecision(5, "up", "x", NOW, NOW, NOW),
            "gone": ScaleDecision(2, "up", "x", NOW, NOW, NOW)}
    counts, decisions, events = scaling.autoscale(snap, held, {}, False, None, no_rollout, NOW, 6.0, AutoscalePolicy())
    assert counts == {"elastic": 3, "fixed": 2} and events == []
    assert decisions == {"elastic": held["elastic"]}  # fixed: nothing to decide; gone: no longer applied
    counts, _, _ = scaling.autoscale(snap, {}, {}, False, None, no_rollout, NOW, 6.0, AutoscalePolicy())
    assert counts == {"elastic": 1, "fixed": 2}  # no decision yet: the spec's minimum


def test_the_leader_decides_and_a_changed_count_is_an_event():
    snap = world().snapshot()
    counts, decisions, events = scaling.autoscale(snap, {}, {}, True, None, no_rollout, NOW, 6.0, AutoscalePolicy())
    assert counts == {"elastic": 1, "fixed": 2} and decisions["elastic"].action == "hold" and events == []
    # a count beyond the spec's range (the spec was changed): brought to its bounds, and said so once
    beyond = {"elastic": ScaleDecision(9, "up", "x", NOW - 100, NOW - 100, NOW - 100)}
    counts, decisions, events = scaling.autoscale(snap, beyond, {}, True, None, no_rollout, NOW, 6.0,
                                                  AutoscalePolicy())
    assert counts["elastic"] == 4 and decisions["elastic"].action == "bounds"
    assert [(e.key, e.value["kind"], e.value["detail"]) for e in events] == [
        ("elastic", "scaled_to_bounds", "spec bounds are 1..4: 9 -> 4")]
    again = scaling.autoscale(snap, decisions, {}, True, None, no_rollout, NOW + 1, 6.0, AutoscalePolicy())
    assert again[0] == counts and again[2] == []  # the same count: nothing to announce


def test_the_model_index_groups_ready_replicas_and_the_plan_per_model():
    state = world()
    register(state, "node-a", [gpu(0)])
    heartbeat(state, "node-a", NOW, [gpu(0)], [report("elastic-0", "READY"), report("elastic-1", "STARTING"),
                                              report("fixed-0", "READY")])
    plan = PlacementPlan(MappingProxyType({}), MappingProxyType({
        "elastic-2": Unplaced("elastic-2", "elastic", "1.0.0", "unschedulable: b"),
        "elastic-1": Unplaced("elastic-1", "elastic", "1.0.0", "unschedulable: a")}),
        state.snapshot().inventory(NOW, 6.0))
    index = scaling.ModelIndex.of(state.snapshot(), NOW, 6.0, plan)
    assert index.ready["elastic"][0] == 1 and index.ready["fixed"][0] == 1
    assert [u.replica_id for u in index.unplaced["elastic"]] == ["elastic-1", "elastic-2"]  # by replica id
    inputs = scaling.autoscale_inputs("elastic", state.snapshot().specs["elastic"], index, "rollout to 2")
    assert (inputs.ready, inputs.unplaced, inputs.unplaced_reason, inputs.rollout) == (
        1, 2, "unschedulable: a", "rollout to 2")
    assert scaling.ModelIndex.of(state.snapshot(), NOW + 7, 6.0, None).ready == {}  # the node went silent


def test_floors_only_raise_a_count():
    snap = world().snapshot()
    floors = {"elastic": Extra(3, "node-b", "elastic-0", NOW), "gone": Extra(9, "node-b", "gone-0", NOW)}
    assert scaling.with_director_floors(snap, {"elastic": 1, "fixed": 2}, floors) == {"elastic": 3, "fixed": 2}
    assert scaling.with_director_floors(snap, {"elastic": 4}, floors) == {"elastic": 4}
    assert scaling.with_rebalance_floors(snap, {"fixed": 2}, {"fixed": 3, "gone": 5}) == {"fixed": 3}
    assert scaling.with_rebalance_floors(snap, {"fixed": 2}, {}) == {"fixed": 2}


def test_a_director_floor_nobody_can_place_is_lifted_with_its_reason():
    snap = world().snapshot()
    floors = {"elastic": Extra(2, "node-b", "elastic-0", NOW), "fixed": Extra(3, "node-a", "fixed-1", NOW)}
    plan = PlacementPlan(MappingProxyType({}), MappingProxyType({
        "elastic-1": Unplaced("elastic-1", "elastic", "1.0.0", "unschedulable: no room")}),
        snap.inventory(NOW, 6.0))
    kept, events = scaling.drop_unplaced_floors(plan, floors, NOW)
    assert kept == {"fixed": floors["fixed"]}
    assert [(e.value["kind"], e.value["replica_id"], e.value["detail"]) for e in events] == [
        ("director", "elastic-0", "release_replica: the added replica could not be placed (unschedulable: no room); "
                                  "floor 2 lifted")]


def test_placed_by_model():
    published = {"b": AssignmentInfo("b", 1, (AssignedReplica("m-1", "m", "1", (), 0, "{}"),)),
                 "a": AssignmentInfo("a", 1, (AssignedReplica("m-0", "m", "1", (), 0, "{}"),
                                              AssignedReplica("n-0", "n", "1", (), 0, "{}")))}
    assert scaling.placed_by_model(published) == {"m": {"m-1": "b", "m-0": "a"}, "n": {"n-0": "a"}}
