"""``nodes``: the inventory's changes as events, the mass-offline guard's held nodes, and forgetting a node, as
pure functions over a snapshot, an inventory and times (a fake clock: values, no sleeps)."""

from __future__ import annotations

from sie.control.placement.inventory import ClusterInventory, GpuState, NodeState
from sie.control.reconcile import nodes
from sie.control.reconcile.liveness import GuardDecision
from sie.control.reconcile.records import NODE_FORGET_KIND, AssignedReplica, AssignmentInfo, ClusterState
from tests.control.reconcile.test_control_unit import FakeClock, gpu, heartbeat, register

TIMEOUT = 6.0


def inventory(**online: bool) -> ClusterInventory:
    return ClusterInventory.of(NodeState(name, online=up, gpus=(GpuState(0, "L4", 16384),)) for name, up in online.items())


def test_only_a_change_seen_by_this_process_is_an_event():
    memory = nodes.NodeMemory()
    assert nodes.transitions(inventory(a=True, b=False), memory, 10.0, TIMEOUT) == []  # first sight: no change
    events = nodes.transitions(inventory(a=False, b=True), memory, 11.0, TIMEOUT)
    assert [(e.value["kind"], e.value["node"], e.value["detail"]) for e in events] == [
        ("node_offline", "a", "node a offline: no heartbeat for > 6s"), ("node_online", "b", "node b is back")]
    assert nodes.transitions(inventory(a=False, b=True), memory, 12.0, TIMEOUT) == []
    sick = ClusterInventory.of([NodeState("a", gpus=(GpuState(0, "L4", 16384, healthy=False),))])
    events = nodes.transitions(sick, memory, 13.0, TIMEOUT)
    assert [e.value["kind"] for e in events] == ["node_online", "gpu_failed"]
    assert events[1].value["detail"] == "gpu a/0 (L4) reported unhealthy"
    events = nodes.transitions(inventory(a=True), memory, 14.0, TIMEOUT)
    assert [(e.value["kind"], e.value["detail"]) for e in events] == [("gpu_recovered", "gpu a/0 (L4) healthy again")]


def test_held_nodes_count_as_online_and_the_guard_speaks_once_each_way():
    inv = inventory(a=False, b=False, c=True)
    assert nodes.held_online(inv, GuardDecision()) is inv
    held = nodes.held_online(inv, GuardDecision(holding=frozenset({"a"}), reason="holding a"))
    assert {n.name: n.online for n in held.nodes} == {"a": True, "b": False, "c": True}
    events = nodes.guard_events(GuardDecision(engaged="3 of 4 nodes silent"), 5.0)
    assert [(e.key, e.value["kind"], e.value["detail"]) for e in events] == [
        ("cluster", "liveness_guard", "3 of 4 nodes silent")]
    assert [e.value["kind"] for e in nodes.guard_events(GuardDecision(released="heard again"), 6.0)] == [
        "liveness_guard_released"]


def world():
    clock, state = FakeClock(), ClusterState()
    for node in ("node-a", "node-b"):
        register(state, node, [gpu(0)])
        heartbeat(state, node, clock(), [gpu(0)])
    return clock, state


def test_a_node_offline_for_the_limit_is_forgotten_once_and_its_memory_dropped_when_read_back():
    clock, state = world()
    memory = nodes.NodeMemory()
    clock.advance(100)
    heartbeat(state, "node-b", clock(), [gpu(0)])
    snap = state.snapshot()
    inv = snap.inventory(clock(), TIMEOUT)
    assert nodes.forget(snap, inv, {}, memory, clock(), 300.0) == []  # offline for 100 s of 300
    clock.advance(200)
    heartbeat(state, "node-b", clock(), [gpu(0)])
    snap = state.snapshot()
    inv = snap.inventory(clock(), TIMEOUT)
    empty = {"node-a": AssignmentInfo("node-a", 3, ())}
    out = nodes.forget(snap, inv, empty, memory, clock(), 300.0)
    assert [(r.topic, r.key, r.value is None) for r in out] == [
        ("nodes", "node-a", True), ("assignments", "node-a", True), ("events", "node-a", False)]
    assert out[2].value["kind"] == "node_forgotten" and "offline for 300s (control.node_forget_after_s: 300)" in \
        out[2].value["detail"]
    # published, not read back yet: not again within 10 s; again after
    assert nodes.forget(snap, inv, empty, memory, clock() + 9, 300.0) == []
    assert len(nodes.forget(snap, inv, empty, memory, clock() + 10, 300.0)) == 3
    assert nodes.read_back(snap, memory) == []  # the state still holds it
    memory.online["node-a"] = False
    state.apply_event(out[2].value)  # the feeder reads the pass's event back: the state drops the node
    assert nodes.read_back(state.snapshot(), memory) == ["node-a"]
    assert "node-a" not in memory.forgetting and "node-a" not in memory.online and "node-a" not in memory.offline_since


def test_an_operator_ask_forgets_at_once_but_not_while_replicas_are_assigned():
    clock, state = world()
    clock.advance(10)
    heartbeat(state, "node-b", clock(), [gpu(0)])
    state.apply_event({"ts_ms": int(clock() * 1000), "kind": NODE_FORGET_KIND, "model": None,
                       "replica_id": None, "node": "node-a", "detail": "asked"})
    snap = state.snapshot()
    assert "node-a" in snap.forget_requests
    inv = snap.inventory(clock(), TIMEOUT)
    busy = {"node-a": AssignmentInfo("node-a", 3, (AssignedReplica("m-0", "m", "1.0.0", (0,), 1024, "{}"),))}
    memory = nodes.NodeMemory()
    assert nodes.forget(snap, inv, busy, memory, clock(), 0.0) == []  # its replicas move first
    out = nodes.forget(snap, inv, {}, memory, clock(), 0.0)  # never by time (0), but asked
    assert [r.topic for r in out] == ["nodes", "events"]  # nothing published for it: no assignment tombstone
    assert "an operator asked (sie node forget)" in out[-1].value["detail"]


def test_a_node_never_heard_counts_its_offline_time_from_when_this_process_first_saw_it():
    clock, state = FakeClock(), ClusterState()
    register(state, "node-a", [gpu(0)])
    snap = state.snapshot()
    inv = snap.inventory(clock(), TIMEOUT)
    memory = nodes.NodeMemory()
    assert nodes.forget(snap, inv, {}, memory, clock(), 60.0) == [] and memory.offline_since == {"node-a": clock()}
    assert nodes.forget(snap, inv, {}, memory, clock() + 59, 60.0) == []
    assert len(nodes.forget(snap, inv, {}, memory, clock() + 60, 60.0)) == 2
