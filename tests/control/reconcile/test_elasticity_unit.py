"""The controller with the autoscaler and preemption: fake clock, fake publisher, fake backlog signals; no Kafka.

What goes out is what one leader transaction would publish: assignments sized by the autoscaler, an event per
scaling decision and per eviction, and the decision inside the model's status (so a new leader continues it).
"""

from __future__ import annotations

import pytest

from sie.control.reconcile.autoscaler import AutoscalePolicy, ModelSignals
from sie.control.reconcile.config import ControlConfig
from sie.control.reconcile.controller import Controller
from sie.control.reconcile.ports import StaticLeadership
from sie.control.reconcile.records import ClusterState
from tests.control.reconcile.test_control_unit import (
    TIMEOUT,
    FakeClock,
    FakePublisher,
    assigned,
    gpu,
    heartbeat,
    register,
    report,
    spec_record,
)

POLICY = AutoscalePolicy(cooldown_s=30, idle_to_zero_s=60, up_settle_s=5, signal_max_age_s=5)


class FakeSignals:
    """``SignalSource``: the test sets each model's backlog."""

    def __init__(self) -> None:
        self.now: dict[str, ModelSignals] = {}

    def set(self, model: str, at: float, lag: int, arrivals: float = 0.0, drained: float = 0.0) -> None:
        self.now[model] = ModelSignals(at=at, lag=lag, partitions=12, arrival_rate=arrivals, drain_rate=drained,
                                       busy=lag > 0 and lag >= drained * 2, window_s=2.0)

    def signals(self):
        return dict(self.now)


def scalable(name: str, lo: int = 1, hi: int = 3, priority: str = "P1", gpu_mb: int = 0, **sla) -> dict:
    return spec_record(name, gpu_mb, priority=priority,
                       sla={"min_replicas": lo, "max_replicas": hi, "max_queue_time_ms": 20000, **sla})


@pytest.fixture()
def elastic():
    clock = FakeClock()
    state = ClusterState()
    pub = FakePublisher()
    signals = FakeSignals()
    lead = StaticLeadership(True, 3)
    ctl = Controller(state, pub, lead, ControlConfig(node_timeout_s=TIMEOUT, autoscale=POLICY), signals=signals)
    for node in ("node-a", "node-b"):
        register(state, node, [gpu(0), gpu(1)])
        heartbeat(state, node, clock(), [gpu(0), gpu(1)])
    return clock, state, pub, signals, lead, ctl


def tick(clock, state, seconds: float, ready: dict[str, list[str]] | None = None) -> float:
    clock.advance(seconds)
    for node in ("node-a", "node-b"):
        heartbeat(state, node, clock(), [gpu(0), gpu(1)], [report(r, "READY") for r in (ready or {}).get(node, [])])
    return clock()


def replicas(pub, model: str) -> set[str]:
    return {r for ids in assigned(pub).values() for r in ids if r.startswith(model + "-")}


def test_backlog_scales_up_at_once_then_down_one_step_per_cooldown(elastic):
    clock, state, pub, signals, _, ctl = elastic
    state.apply_spec("m", scalable("m"))
    signals.set("m", clock(), 0)
    ctl.reconcile(clock())
    assert replicas(pub, "m") == {"m-0"}
    now = tick(clock, state, 2, {"node-a": ["m-0"]})
    signals.set("m", now, 5000, arrivals=10, drained=50)  # one replica drains 50/s: 5000 needs ~10 s/replica
    rep = ctl.reconcile(now)
    assert replicas(pub, "m") == {"m-0", "m-1", "m-2"}
    (event,) = [r.value for r in rep.of("events") if r.value["kind"] == "scaled_up"]
    assert "1 -> 3" in event["detail"] and "lag 5000" in event["detail"]
    status = {r.key: r.value for r in rep.of("model-status")}["m"]
    assert status["autoscale"]["desired"] == 3 and status["autoscale"]["action"] == "up"
    assert status["desired_replicas"] == 3

    # the backlog is gone: nothing moves before the cool-down, then one step per cool-down
    now = tick(clock, state, 10, {"node-a": ["m-0", "m-2"], "node-b": ["m-1"]})
    signals.set("m", now, 0)
    assert ctl.reconcile(now).of("assignments") == []
    now = tick(clock, state, 21, {"node-a": ["m-0", "m-2"], "node-b": ["m-1"]})
    signals.set("m", now, 0)
    rep = ctl.reconcile(now)
    assert replicas(pub, "m") == {"m-0", "m-1"}
    kinds = {r.value["kind"]: r.value["detail"] for r in rep.of("events")}
    assert "3 -> 2" in kinds["scaled_down"] and "scaled down" in kinds["removed"]
    now = tick(clock, state, 5, {"node-a": ["m-0"], "node-b": ["m-1"]})
    signals.set("m", now, 0)
    ctl.reconcile(now)
    assert replicas(pub, "m") == {"m-0", "m-1"}
    now = tick(clock, state, 30, {"node-a": ["m-0"], "node-b": ["m-1"]})
    signals.set("m", now, 0)
    ctl.reconcile(now)
    assert replicas(pub, "m") == {"m-0"}


def test_status_is_republished_for_decisions_not_for_moving_numbers(elastic):
    clock, state, pub, signals, _, ctl = elastic
    state.apply_spec("m", scalable("m"))
    signals.set("m", clock(), 0)
    ctl.reconcile(clock())
    for lag in (3, 1, 2):
        now = tick(clock, state, 1, {"node-a": ["m-0"]})
        signals.set("m", now, lag, arrivals=5, drained=5)
        ctl.reconcile(now)
    statuses = [r.value for r in pub.all("model-status")]
    # the first status, then READY (phase change); small lags never scale: no more statuses
    assert [s["phase"] for s in statuses] == ["Progressing", "Ready"]


def test_scale_to_zero_when_idle_and_wake_when_records_wait(elastic):
    clock, state, pub, signals, _, ctl = elastic
    state.apply_spec("tail", scalable("tail", lo=0, hi=2))
    signals.set("tail", clock(), 0)
    ctl.reconcile(clock())
    assert replicas(pub, "tail") == set()  # min 0 and nothing waits: it starts at zero
    now = tick(clock, state, 2)
    signals.set("tail", now, 100)
    rep = ctl.reconcile(now)
    assert replicas(pub, "tail") == {"tail-0"}
    (woke,) = [r.value for r in rep.of("events") if r.value["kind"] == "woke_from_zero"]
    assert "100 record(s) waiting with no replica" in woke["detail"]
    now = tick(clock, state, 4, {"node-a": ["tail-0"]})
    signals.set("tail", now, 0, drained=25)
    rep = ctl.reconcile(now)
    first = ctl.decisions["tail"].first_result_ms
    assert first == pytest.approx(4000.0)
    assert {r.key: r.value for r in rep.of("model-status")}["tail"]["autoscale"]["first_result_ms"] == first
    for _ in range(3):
        now = tick(clock, state, 25, {"node-a": ["tail-0"]})
        signals.set("tail", now, 0)
        rep = ctl.reconcile(now)
    assert replicas(pub, "tail") == set()
    assert [r.value["kind"] for r in pub.all("events")].count("scaled_to_zero") == 1


def test_stale_signal_holds_and_a_new_leader_continues_from_the_published_decision(elastic):
    clock, state, pub, signals, _, ctl = elastic
    state.apply_spec("m", scalable("m"))
    now = tick(clock, state, 1, {"node-a": ["m-0"]})
    signals.set("m", now, 5000, drained=50)
    ctl.reconcile(now)
    assert len(replicas(pub, "m")) == 3
    # the sampler stopped: the last signal ages; nothing changes on it
    now = tick(clock, state, 6)
    rep = ctl.reconcile(now)
    assert "not acting on a stale view" in ctl.decisions["m"].reason and rep.of("assignments") == []

    # a new leader reads the status topic: it keeps 3 (cool-down counted from the published decision)
    fresh = ClusterState()
    fresh.apply_spec("m", scalable("m"))
    for node in ("node-a", "node-b"):
        register(fresh, node, [gpu(0), gpu(1)])
        heartbeat(fresh, node, now, [gpu(0), gpu(1)])
    for r in pub.all("assignments"):
        fresh.apply_assignment(r.key, r.value)
    for r in pub.all("model-status"):
        fresh.apply_model_status(r.key, r.value)
    signals.set("m", now, 0)
    pub2 = FakePublisher()
    ctl2 = Controller(fresh, pub2, StaticLeadership(True, 4), ControlConfig(node_timeout_s=TIMEOUT, autoscale=POLICY),
                      signals=signals)
    rep = ctl2.reconcile(now)
    assert rep.decisions["m"].desired == 3 and rep.of("assignments") == []
    # and a standby shows the leader's decision without deciding anything
    standby = Controller(fresh, FakePublisher(), StaticLeadership(False, 4),
                         ControlConfig(node_timeout_s=TIMEOUT, autoscale=POLICY), signals=signals)
    assert standby.reconcile(now).statuses["m"].desired_replicas == 3


def test_p0_preempts_p2_on_a_full_node_with_an_event_per_eviction(elastic):
    clock, state, pub, _, _, ctl = elastic
    state.apply_node("node-b", None)
    register(state, "node-a", [gpu(0, 24576)])
    heartbeat(state, "node-a", clock(), [gpu(0, 24576)])
    state.apply_spec("bulk", spec_record("bulk", 12288, replicas=2, priority="P2"))
    ctl.reconcile(clock())
    assert replicas(pub, "bulk") == {"bulk-0", "bulk-1"}
    for r in pub.all("assignments"):  # what the state reader reads back
        state.apply_assignment(r.key, r.value)
    state.apply_spec("rt", spec_record("rt", 12288, priority="P0"))
    off = ControlConfig(node_timeout_s=TIMEOUT, preemption=False)
    rep = Controller(state, FakePublisher(), StaticLeadership(True, 3), off).reconcile(clock())
    assert set(rep.plan.placements) == {"bulk-0", "bulk-1"} and "rt-0" in rep.plan.unplaced
    rep = ctl.reconcile(clock())
    assert assigned(pub)["node-a"] == {"rt-0", "bulk-1"}  # one victim suffices; equal size: lowest id (bulk-0) goes
    (pre,) = [r.value for r in rep.of("events") if r.value["kind"] == "preempted"]
    assert pre["detail"].startswith(f"preempted by rt-0 (P0, needs 12288 MiB GPU memory) on node-a gpu 0: "
                                    f"{pre['replica_id']} is P2; drained; unschedulable")
    view = {v.replica_id: v for v in rep.statuses["bulk"].replicas}[pre["replica_id"]]
    assert view.state == "UNSCHEDULABLE" and "preempted by rt-0" in view.reason
    # later passes still say why it lost its place (and no new eviction happens)
    for r in pub.all("assignments"):
        state.apply_assignment(r.key, r.value)
    clock.advance(1)
    heartbeat(state, "node-a", clock(), [gpu(0, 24576)])
    rep = ctl.reconcile(clock())
    assert not rep.plan.preempted and not [r for r in rep.of("events") if r.value["kind"] == "preempted"]
    view = {v.replica_id: v for v in rep.statuses["bulk"].replicas}[pre["replica_id"]]
    assert view.reason.startswith("unschedulable: preempted by rt-0") and "largest free is" in view.reason


def test_config_file_reads_autoscale_and_preemption(tmp_path):
    from sie.kernel.errors import ConfigError

    path = tmp_path / "cp.yaml"
    path.write_text("control:\n  preemption: false\n  backlog_interval_s: 1\n  autoscale: {cooldown_s: 60, idle_to_zero_s: 120}\n")
    config = ControlConfig.from_yaml(path)
    assert (config.preemption, config.backlog_interval_s) == (False, 1.0)
    assert (config.autoscale.cooldown_s, config.autoscale.idle_to_zero_s) == (60.0, 120.0)
    path.write_text("control:\n  autoscale: {cooldown: 60}\n")
    with pytest.raises(ConfigError, match="control.autoscale.cooldown: unknown"):
        ControlConfig.from_yaml(path)


def test_heartbeat_p99_feeds_the_autoscaler_and_pool_memory_is_kept_out_of_placement(elastic):
    from sie.schemas.avro_codec import decode, encode
    from sie.workers.agent import messages
    from sie.workers.replica import ReplicaState as RS
    from sie.workers.supervisor import ReplicaSnapshot

    clock, state, pub, signals, _, ctl = elastic
    snap = ReplicaSnapshot("m-0", "m", "1.0.0", RS.READY, 11, 0, 42, "", None, None, "h", (), p99_ms=250.0)
    record = messages.heartbeat("node-a", 9, int(clock() * 1000), [], [snap], warm_workers=2, reserved_memory_mb=32000)
    state.apply_heartbeat(decode(encode("Heartbeat", record)), seen_at=clock())
    (report_,) = state.heartbeats["node-a"].replicas
    assert (report_.records, report_.p99_ms) == (42, 250.0)
    node_a = state.snapshot().inventory(clock(), TIMEOUT).node("node-a")
    assert node_a.memory_mb == 32768 - 32000  # the pool's processes hold the rest

    state.apply_spec("m", scalable("m", p99_latency_ms=100))
    signals.set("m", clock(), 300, arrivals=10, drained=100)  # one replica keeps up (capacity 100/s) ...
    ctl.reconcile(clock())
    clock.advance(20)
    record = messages.heartbeat("node-a", 10, int(clock() * 1000), [], [snap])
    state.apply_heartbeat(decode(encode("Heartbeat", record)), seen_at=clock())
    heartbeat(state, "node-b", clock(), [gpu(0), gpu(1)])
    signals.set("m", clock(), 400, arrivals=10, drained=100)  # ... but the backlog grows and p99 is over the SLA
    rep = ctl.reconcile(clock())
    assert rep.decisions["m"].desired == 2 and "p99 250 ms > SLA 100 ms" in rep.decisions["m"].reason


def test_a_wake_that_cannot_be_placed_is_not_retried_every_pass(elastic):
    """Issue 28.7: `scale_blocked ... no scale-up for 60s` then `woke_from_zero` ~2 s later, over and over: the
    blocked decision took the unplaceable replica back to zero, and the next pass woke the model again (the
    wake ignored the blocked window), so every other pass emitted both events and an `unschedulable`."""
    clock, state, pub, signals, _, ctl = elastic
    state.apply_spec("big", scalable("big", lo=0, hi=2, gpu_mb=10**6))  # no node has a GPU that large
    for _ in range(30):  # a minute of 2 s passes with records waiting all along
        now = tick(clock, state, 2)
        signals.set("big", now, 100)
        ctl.reconcile(now)
    kinds = [r.value["kind"] for r in pub.all("events")]
    assert kinds.count("woke_from_zero") == 1 and kinds.count("scale_blocked") == 1, kinds
    assert kinds.count("unschedulable") == 1, kinds
    decision = ctl.decisions["big"]
    assert decision.desired == 0 and decision.action == "hold"
    assert "could not be placed" in decision.reason and "retrying in" in decision.reason
    for _ in range(5):  # the blocked window over: one more try, reported once more
        now = tick(clock, state, 2)
        signals.set("big", now, 100)
        ctl.reconcile(now)
    kinds = [r.value["kind"] for r in pub.all("events")]
    assert kinds.count("woke_from_zero") == 2 and kinds.count("scale_blocked") == 2, kinds
