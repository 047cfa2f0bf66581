"""`sie node forget` and the automatic forget (issue 38, item 3): an offline node an operator asked to forget, or
one offline for ``node_forget_after_s``, is tombstoned by the leader with a ``node_forgotten`` event; every reader
then drops it (inventory, `sie get nodes`, ``sie_control_nodes{state="offline"}``) and a replay of its old
heartbeats does not bring it back; an online node is never forgotten, and an agent that starts again registers anew."""

from __future__ import annotations

from sie.control.reconcile.config import ControlConfig
from sie.control.reconcile.controller import Controller
from sie.control.reconcile.ports import StaticLeadership
from sie.control.reconcile.records import NODE_FORGET_KIND, ClusterState
from tests.control.reconcile.test_control_unit import (
    TIMEOUT,
    FakeClock,
    FakePublisher,
    gpu,
    heartbeat,
    register,
    spec_record,
)


def _world(forget_after: float = 0.0) -> tuple[FakeClock, ClusterState, FakePublisher, Controller]:
    clock, state, pub = FakeClock(), ClusterState(), FakePublisher()
    ctl = Controller(state, pub, StaticLeadership(True, 3),
                     ControlConfig(node_timeout_s=TIMEOUT, node_forget_after_s=forget_after))
    for node in ("node-a", "node-b"):
        register(state, node, [gpu(0)])
        heartbeat(state, node, clock(), [gpu(0)])
    state.apply_spec("alpha", spec_record("alpha", 1024, replicas=1))
    return clock, state, pub, ctl


def _read_back(state: ClusterState, pub: FakePublisher) -> None:
    """What the state feeder does with the leader's published records."""
    for record in pub.batches[-1]:
        if record.topic == "nodes":
            state.apply_node(record.key, record.value)
        elif record.topic == "assignments":
            state.apply_assignment(record.key, record.value)
        elif record.topic == "events":
            state.apply_event(dict(record.value))


def _forget_request(state: ClusterState, node: str, at: float) -> None:
    state.apply_event({"ts_ms": int(at * 1000), "kind": NODE_FORGET_KIND, "model": None, "replica_id": None,
                       "node": node, "detail": "test"})


def _names(state: ClusterState, now: float) -> list[str]:
    return [v.name for v in state.snapshot().node_views(now, TIMEOUT)]


def test_a_requested_forget_of_an_offline_node_tombstones_it_and_every_reader_drops_it():
    clock, state, pub, ctl = _world()
    ctl.reconcile(clock())
    _read_back(state, pub)
    clock.advance(TIMEOUT + 1)
    heartbeat(state, "node-a", clock(), [gpu(0)])  # node-b went silent
    ctl.reconcile(clock())
    _read_back(state, pub)
    assert "node-b" in _names(state, clock())
    _forget_request(state, "node-b", clock())
    clock.advance(1)
    heartbeat(state, "node-a", clock(), [gpu(0)])
    ctl.reconcile(clock())
    batch = pub.batches[-1]
    tombstones = [(r.topic, r.key) for r in batch if r.value is None]
    assert ("nodes", "node-b") in tombstones
    forgotten = [r.value for r in batch if r.topic == "events" and r.value and r.value["kind"] == "node_forgotten"]
    assert len(forgotten) == 1 and "an operator asked" in forgotten[0]["detail"]
    _read_back(state, pub)
    assert _names(state, clock()) == ["node-a"]
    # the offline gauge's source: registered nodes less the online ones
    assert list(state.snapshot().nodes) == ["node-a"]
    # a replay of node-b's old heartbeats (a restarted control plane, `sie get nodes`) does not bring it back
    state.apply_heartbeat({"node": "node-b", "ts_ms": 0, "seq": 1, "gpus": [gpu(0)], "replicas": []},
                          seen_at=None, replayed_at=clock() - TIMEOUT - 2)
    assert "node-b" not in _names(state, clock())
    # the next passes publish nothing more about it
    published = len(pub.batches)
    for _ in range(3):
        clock.advance(5)
        heartbeat(state, "node-a", clock(), [gpu(0)])
        ctl.reconcile(clock())
    assert not [r for b in pub.batches[published:] for r in b if r.key == "node-b"]
    # its agent started again: it registers and heartbeats, and is a node again
    register(state, "node-b", [gpu(0)])
    state.nodes["node-b"] = state.nodes["node-b"].__class__(**{**state.nodes["node-b"].__dict__,
                                                                "started_at": clock()})
    clock.advance(1)
    heartbeat(state, "node-b", clock(), [gpu(0)])
    assert _names(state, clock()) == ["node-a", "node-b"]


def test_an_online_node_is_not_forgotten_and_an_old_request_does_not_forget_it_later():
    clock, state, pub, ctl = _world()
    _forget_request(state, "node-b", clock() - 1)  # asked while it was still alive: stale
    ctl.reconcile(clock())
    assert not [r for r in pub.batches[-1] if r.value is None]
    clock.advance(TIMEOUT + 1)
    heartbeat(state, "node-a", clock(), [gpu(0)])
    ctl.reconcile(clock())
    assert not any(r.value is None and r.topic == "nodes" for b in pub.batches for r in b)
    assert "node-b" in _names(state, clock())


def test_a_node_offline_longer_than_node_forget_after_s_is_forgotten_by_itself():
    clock, state, pub, ctl = _world(forget_after=30.0)
    ctl.reconcile(clock())
    _read_back(state, pub)
    for _ in range(3):  # offline 21 s: not yet
        clock.advance(TIMEOUT + 1)
        heartbeat(state, "node-a", clock(), [gpu(0)])
        ctl.reconcile(clock())
        _read_back(state, pub)
    assert "node-b" in _names(state, clock())
    clock.advance(10)
    heartbeat(state, "node-a", clock(), [gpu(0)])
    ctl.reconcile(clock())
    events = [r.value for r in pub.batches[-1] if r.topic == "events"]
    assert any(e["kind"] == "node_forgotten" and "control.node_forget_after_s: 30" in e["detail"] for e in events)
    _read_back(state, pub)
    assert _names(state, clock()) == ["node-a"]


def test_node_forget_after_s_zero_never_forgets():
    clock, state, pub, ctl = _world(forget_after=0.0)
    for _ in range(5):
        clock.advance(1000)
        heartbeat(state, "node-a", clock(), [gpu(0)])
        ctl.reconcile(clock())
    assert "node-b" in _names(state, clock())
