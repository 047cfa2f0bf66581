"""``cooldowns``: a FAILED replica's cool-down as pure functions over a snapshot and times (no controller, no
clock but the values passed in): when one starts, each way it ends, and what placement and status see of it."""

from __future__ import annotations

from sie.control.reconcile import cooldowns
from sie.control.reconcile.cooldowns import Cooldown
from sie.control.reconcile.records import COOLDOWN_RESET_KIND, ClusterState, ReplicaReport
from sie.schemas.replica_state import ReplicaState
from tests.control.reconcile.test_control_unit import spec_record

NOW = 1_000_000.0


def state_with(applied_at: float = NOW - 100) -> ClusterState:
    state = ClusterState()
    rec = spec_record("alpha")
    rec["applied_at_ms"] = int(applied_at * 1000)
    state.apply_spec("alpha", rec)
    return state


def failed(at: float, node: str = "node-a", rid: str = "alpha-0", reason: str | None = "ImportError") -> ReplicaReport:
    return ReplicaReport(rid, "alpha", "1.0.0", node, ReplicaState.FAILED, reason=reason, at=at)


def test_a_failure_on_the_assigned_node_starts_a_cooldown_with_its_event():
    snap = state_with().snapshot()
    got, events = cooldowns.record_failures({}, [failed(NOW - 1)], {("alpha-0", "node-a")}, snap, NOW, 60.0)
    assert got == {("alpha-0", "node-a"): Cooldown(NOW + 59, "ImportError", "alpha", NOW - 1)}
    (event,) = events
    assert event.topic == "events" and event.key == "alpha" and event.value["kind"] == "replica_failed"
    assert event.value["ts_ms"] == int(NOW * 1000) and event.value["node"] == "node-a"
    assert event.value["detail"] == ("replica FAILED on node-a: ImportError; kept off it for 60s (or until a "
                                     "re-apply or `sie replica reset alpha-0`)")
    # no reason given: the agent's restart budget ran out
    got, _ = cooldowns.record_failures({}, [failed(NOW - 1, reason=None)], {("alpha-0", "node-a")}, snap, NOW, 60.0)
    assert got[("alpha-0", "node-a")].reason == "crashed too often"


def test_reports_that_start_nothing():
    snap = state_with(applied_at=NOW - 10).snapshot()
    assigned = {("alpha-0", "node-a")}
    running = {("alpha-0", "node-a"): Cooldown(NOW + 5, "first", "alpha", NOW - 55)}
    cases = [
        ({}, failed(NOW - 1, node="node-b")),   # not the node it is assigned to (a report read late)
        ({}, failed(NOW - 61)),                 # its cool-down would already be over
        ({}, failed(NOW - 20)),                 # made before the spec was re-applied: stale
        (running, failed(NOW - 1)),             # a cool-down runs already: it is not restarted
    ]
    for exclusions, rep in cases:
        got, events = cooldowns.record_failures(exclusions, [rep], assigned, snap, NOW, 60.0)
        assert got == exclusions and events == [], rep


def test_a_reset_makes_earlier_reports_stale():
    state = state_with()
    state.apply_event({"ts_ms": int((NOW - 5) * 1000), "kind": COOLDOWN_RESET_KIND, "model": "alpha",
                       "replica_id": "alpha-0", "node": None, "detail": "reset"})
    snap = state.snapshot()
    assert cooldowns.cleared_since(snap, "alpha", "alpha-0") == NOW - 5
    got, _ = cooldowns.record_failures({}, [failed(NOW - 6), failed(NOW - 4, node="node-b")],
                                       {("alpha-0", "node-a"), ("alpha-0", "node-b")}, snap, NOW, 60.0)
    assert list(got) == [("alpha-0", "node-b")]


def test_each_way_a_cooldown_ends_and_what_it_says():
    since = NOW - 30
    cd = Cooldown(NOW + 30, "boom", "alpha", since)
    key = ("alpha-0", "node-a")
    # still running: kept, nothing said
    kept, events = cooldowns.clear({key: cd}, state_with(applied_at=since - 1).snapshot(), NOW)
    assert kept == {key: cd} and events == []
    # ran out: dropped quietly
    kept, events = cooldowns.clear({key: cd}, state_with(applied_at=since - 1).snapshot(), NOW + 30)
    assert kept == {} and events == []
    # the spec applied again after the failure
    kept, events = cooldowns.clear({key: cd}, state_with(applied_at=since + 1).snapshot(), NOW)
    assert kept == {} and [e.value["detail"] for e in events] == [
        "cool-down of alpha-0 on node-a cleared: spec alpha 1.0.0 applied after the failure"]
    assert events[0].value["kind"] == "cooldown_cleared" and events[0].value["replica_id"] == "alpha-0"
    # the model deleted
    kept, events = cooldowns.clear({key: cd}, ClusterState().snapshot(), NOW)
    assert kept == {} and events[0].value["detail"].endswith("cleared: the model is no longer applied")
    # a reset asked for after the failure
    state = state_with(applied_at=since - 1)
    state.apply_event({"ts_ms": int((since + 1) * 1000), "kind": COOLDOWN_RESET_KIND, "model": "alpha",
                       "replica_id": "alpha-0", "node": None, "detail": "reset"})
    kept, events = cooldowns.clear({key: cd}, state.snapshot(), NOW)
    assert kept == {} and events[0].value["detail"].endswith("cleared: reset by hand (sie replica reset alpha-0)")


def test_a_connector_replica_is_cleared_by_its_connector_record():
    kind, what, at = cooldowns.applied(ClusterState().snapshot(), "cdc:orders")
    assert (kind, what, at) == ("connector", "connector orders", None)
    kept, events = cooldowns.clear({("cdc:orders-0", "node-a"): Cooldown(NOW + 30, "boom", "cdc:orders", NOW - 30)},
                                   ClusterState().snapshot(), NOW)
    assert kept == {} and events[0].value["detail"].endswith("cleared: the connector is no longer applied")


def test_clearing_keeps_the_order_of_the_cooldowns_left():
    snap = state_with(applied_at=NOW - 100).snapshot()
    order = [("alpha-2", "node-b"), ("alpha-0", "node-a"), ("alpha-1", "node-c")]
    exclusions = {k: Cooldown(NOW + 10 * (i + 1), "x", "alpha", NOW - 50) for i, k in enumerate(order)}
    kept, _ = cooldowns.clear(exclusions, snap, NOW + 15)  # the first ran out
    assert list(kept) == order[1:]


def test_what_placement_and_status_see():
    exclusions = {("alpha-0", "node-b"): Cooldown(NOW + 1.5, "b", "alpha", NOW),
                  ("alpha-0", "node-a"): Cooldown(NOW + 2, "a", "alpha", NOW)}
    assert cooldowns.by_replica(exclusions) == {"alpha-0": [
        {"node": "node-a", "until_ms": int((NOW + 2) * 1000), "reason": "a"},
        {"node": "node-b", "until_ms": int((NOW + 1.5) * 1000), "reason": "b"}]}
    assert cooldowns.excluded(exclusions, {"alpha-0": ["node-c"], "beta-0": frozenset({"node-a"})}) == {
        "alpha-0": frozenset({"node-a", "node-b", "node-c"}), "beta-0": frozenset({"node-a"})}
