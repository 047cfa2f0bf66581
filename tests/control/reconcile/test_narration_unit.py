"""``narration``: what a plan did, as events and reasons, over plain plans and inventories: each event once per
change, the reason of each move and removal, and the reasons that lead an unplaced replica's explanation."""

from __future__ import annotations

from types import MappingProxyType

from sie.control.placement.inventory import ClusterInventory, GpuState, NodeState
from sie.control.placement.results import Placement, PlacementPlan, Preemption, Unplaced
from sie.control.placement.rollout_capacity import CapacityPlan
from sie.control.reconcile import narration
from sie.control.reconcile.autoscaler import ScaleDecision
from sie.control.reconcile.cooldowns import Cooldown
from sie.control.reconcile.records import AssignedReplica, AssignmentInfo

NOW = 1_000_000.0
INV = ClusterInventory.of([NodeState("a", gpus=(GpuState(0, "L4", 16384), GpuState(1, "L4", 16384, healthy=False))),
                           NodeState("b", gpus=(GpuState(0, "L4", 16384),)), NodeState("c", online=False)])


def plan(placed=(), unplaced=(), preempted=None) -> PlacementPlan:
    return PlacementPlan(MappingProxyType({p.replica_id: p for p in placed}),
                         MappingProxyType({u.replica_id: u for u in unplaced}), INV,
                         MappingProxyType(preempted or {}))


def on(node: str, *replicas: tuple[str, tuple[int, ...]]) -> AssignmentInfo:
    return AssignmentInfo(node, 3, tuple(AssignedReplica(rid, rid.rsplit("-", 1)[0], "1.0.0", gpus, 4096, "{}")
                                         for rid, gpus in replicas))


def kinds_and_details(events) -> list[tuple[str, str]]:
    return [(e.value["kind"], e.value["detail"]) for e in events]


def test_an_event_is_keyed_by_its_model_else_its_node_else_the_cluster():
    assert narration.event(NOW, "placed", "m", "m-0", "a", "x").key == "m"
    assert narration.event(NOW, "node_offline", None, None, "a", "x").key == "a"
    e = narration.event(NOW, "liveness_guard", None, None, None, "x")
    assert e.key == "cluster" and e.topic == "events" and e.record == "ControlEvent"
    assert e.value == {"ts_ms": int(NOW * 1000), "kind": "liveness_guard", "model": None, "replica_id": None,
                       "node": None, "detail": "x"}


def test_why_a_replica_moved():
    no = {}
    assert narration.why_moved("m-0", "gone", (), INV, no) == "node gone is no longer registered"
    assert narration.why_moved("m-0", "c", (), INV, no) == "node c offline"
    assert narration.why_moved("m-0", "a", (0, 1), INV, no) == "gpu a/1 failed"
    cd = {("m-0", "a"): Cooldown(NOW + 5, "ImportError", "m", NOW)}
    assert narration.why_moved("m-0", "a", (0,), INV, cd) == "replica FAILED on a: ImportError"
    assert narration.why_moved("m-0", "a", (0,), INV, no) == "spec or constraints changed"


def test_placed_moved_unschedulable_and_removed_each_once_with_their_reasons():
    published = {"a": on("a", ("m-0", (0,)), ("m-1", (1,)), ("old-0", (0,)), ("n-0", (0,)))}
    p = plan(placed=[Placement("m-0", "m", "1.0.0", "a", (0,), 4096),  # unchanged: no event
                     Placement("m-1", "m", "1.0.0", "b", (0,), 4096),  # moved off the failed GPU
                     Placement("m-2", "m", "1.0.0", "b", (), 0, note="anti-affinity relaxed")],
             unplaced=[Unplaced("m-3", "m", "1.0.0", "unschedulable: no room")])
    decisions = {"old": ScaleDecision(0, "down", "idle 300s", NOW, NOW, NOW),
                 "n": ScaleDecision(1, "steady", "x", NOW, NOW, NOW)}
    events, reported = narration.placement_events(p, published, INV, {}, decisions, {}, {}, NOW)
    assert kinds_and_details(events) == [
        ("moved", "m-1 moved from a to b gpu 0: gpu a/1 failed"),
        ("placed", "m-2 placed on b (cpu) (anti-affinity relaxed)"),
        ("unschedulable", "unschedulable: no room"),
        ("removed", "n-0 removed from a: no longer desired"),
        ("removed", "old-0 removed from a: scaled down (idle 300s)"),
    ]
    assert reported == {"m-3": "unschedulable: no room"}
    # the same reason again: not announced again; a new one is; the director's release names itself
    again, reported = narration.placement_events(p, {}, INV, {}, {}, {}, reported, NOW + 1)
    assert [e.value["kind"] for e in again] == ["placed", "placed", "placed"]
    worse = plan(unplaced=[Unplaced("m-3", "m", "1.0.0", "unschedulable: cool-down")])
    events, reported = narration.placement_events(worse, published, INV, {}, {}, {"m": "released by the director"},
                                                  reported, NOW + 2)
    assert ("unschedulable", "unschedulable: cool-down") in kinds_and_details(events)
    assert ("removed", "m-0 removed from a: released by the director") in kinds_and_details(events)
    # a replica no longer wanted is forgotten, so it is announced again if it comes back unplaced
    _, reported = narration.placement_events(plan(), {}, INV, {}, {}, {}, reported, NOW + 3)
    assert reported == {}


def test_a_preempted_published_replica_is_drained_and_says_where_it_went():
    pre = Preemption("low-0", "low", "P2", "a", (0,), "high-0", "high", "P0", "16384 MiB", 4096)
    published = {"a": on("a", ("low-0", (0,)))}
    gone = plan(placed=[Placement("high-0", "high", "1.0.0", "a", (0,), 16384)],
                unplaced=[Unplaced("low-0", "low", "1.0.0", "unschedulable: no room")], preempted={"low-0": pre})
    events, _ = narration.placement_events(gone, published, INV, {}, {}, {}, {}, NOW)
    assert events[0].value["kind"] == "preempted" and events[0].value["model"] == "low"
    assert events[0].value["detail"] == f"{pre.describe()}; drained; unschedulable: no other node has room"
    unplaced = [e for e in events if e.value["kind"] == "unschedulable"]
    assert unplaced[0].value["detail"] == "unschedulable: no room (was on a: spec or constraints changed)"
    # evicted in the plan only (never published there): nothing to drain
    events, _ = narration.placement_events(gone, {}, INV, {}, {}, {}, {}, NOW)
    assert "preempted" not in [e.value["kind"] for e in events]


def test_a_rollout_capacity_event_only_when_its_reason_changes():
    surge = CapacityPlan(("1", "2"), "surge", "surge replica 1 placed")
    events, reported = narration.capacity_events({"m": surge}, {}, NOW)
    assert kinds_and_details(events) == [("rollout_capacity", "surge: surge replica 1 placed")]
    assert narration.capacity_events({"m": surge}, reported, NOW + 1) == ([], {"m": "surge replica 1 placed"})
    assert narration.capacity_events({}, reported, NOW + 2) == ([], {})


def test_an_unplaced_replica_leads_with_its_cooldown_or_its_eviction():
    cd = {("m-0", "a"): Cooldown(NOW + 5, "boom", "m", NOW), ("m-0", "b"): Cooldown(NOW + 5, "boom", "m", NOW)}
    p = plan(unplaced=[Unplaced("m-0", "m", "1.0.0", "unschedulable: needs 4096 MiB"),
                       Unplaced("n-0", "n", "1.0.0", "unschedulable: no room")])
    explained = narration.explain_exclusions(p, cd)
    assert explained.unplaced["m-0"].reason == ("unschedulable: FAILED on a, b (cool-down); no other eligible node "
                                                "fits (needs 4096 MiB)")
    assert explained.unplaced["n-0"] == p.unplaced["n-0"]
    assert narration.explain_exclusions(p, {}) is p
    # evicted by an earlier pass, still without a node: "preempted by" stays first until it is placed again
    pre = Preemption("n-0", "n", "P2", "a", (0,), "high-0", "high", "P0", "16384 MiB", 4096)
    first, evicted = narration.explain_preemptions(plan(unplaced=[Unplaced("n-0", "n", "1.0.0",
                                                                           "unschedulable: preempted by high-0")],
                                                        preempted={"n-0": pre}), {})
    assert evicted == {"n-0": pre.describe()} and first.unplaced["n-0"].reason == "unschedulable: preempted by high-0"
    later, evicted = narration.explain_preemptions(p, evicted)
    assert later.unplaced["n-0"].reason == f"unschedulable: {pre.describe()}; no other node has room (no room)"
    placed, evicted = narration.explain_preemptions(plan(placed=[Placement("n-0", "n", "1.0.0", "b", (0,), 4096)]),
                                                    evicted)
    assert evicted == {}
