"""Control plane reconcile loop with a fake clock and a fake publisher: no Kafka.

Records are fed into ``ClusterState`` exactly as the feeder would after decoding them from the
topics; what the fake publisher receives is what would go out in one transaction.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from sie.control.reconcile.config import ControlConfig
from sie.control.reconcile.controller import Controller
from sie.control.reconcile.ports import OutRecord, StaticLeadership
from sie.control.reconcile.records import ClusterState
from sie.schemas.spec import load
from sie.streams.eos import Fenced

TIMEOUT = 6.0


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> float:
        self.t += seconds
        return self.t


class FakePublisher:
    """Keeps every batch; ``fail_with`` makes the next publish raise."""

    def __init__(self) -> None:
        self.batches: list[list[OutRecord]] = []
        self.fail_with: Exception | None = None

    def publish(self, records):
        if self.fail_with is not None:
            exc, self.fail_with = self.fail_with, None
            raise exc
        self.batches.append(list(records))

    def last(self, topic: str) -> list[OutRecord]:
        return [r for r in (self.batches[-1] if self.batches else []) if r.topic == topic]

    def all(self, topic: str) -> list[OutRecord]:
        return [r for b in self.batches for r in b if r.topic == topic]


def spec_record(name: str, gpu_mb: int = 4096, replicas: int = 1, priority: str = "P1", **spec_extra: Any) -> dict:
    doc = {
        "apiVersion": "sie.lmsys.org/v1",
        "kind": "ModelService",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": name, "version": "1.0.0"},
            "priorityLevel": priority,
            "backend": {"type": "python", "callable": "models.fraud.rules:score"},
            "resources": {"gpuMemoryMb": gpu_mb, "cpu": 1},
            "sla": {"min_replicas": replicas, "max_replicas": max(replicas, 1)},
            **spec_extra,
        },
    }
    spec = load(doc)
    return {"name": name, "version": spec.version, "spec_json": json.dumps(spec.to_document()), "applied_at_ms": 0}


def gpu(index: int, total: int = 16384, healthy: bool = True) -> dict:
    return {
        "index": index, "uuid": f"GPU-{index}", "product": "NVIDIA L4", "memory_total_mb": total, "memory_used_mb": 0,
        "memory_free_mb": total, "utilization_pct": 0.0, "temperature_c": 40.0, "simulated": True, "healthy": healthy,
    }


def register(state: ClusterState, node: str, gpus: list[dict], tier: str | None = None) -> None:
    state.apply_node(node, {
        "node": node, "labels": {}, "tier": tier, "cpu_count": 8, "memory_mb": 32768, "gpus": gpus,
        "simulated": True, "agent_version": "test", "started_at_ms": 0,
    })


def heartbeat(state: ClusterState, node: str, at: float, gpus: list[dict], replicas: list[dict] | None = None) -> None:
    state.apply_heartbeat({"node": node, "ts_ms": int(at * 1000), "seq": 1, "gpus": gpus, "replicas": replicas or []}, seen_at=at)


def report(rid: str, state: str, reason: str | None = None) -> dict:
    return {"replica_id": rid, "model": rid.rsplit("-", 1)[0], "version": "1.0.0", "state": state, "pid": 1, "restarts": 0, "reason": reason}


def assigned(publisher: FakePublisher) -> dict[str, set[str]]:
    """Latest published replica ids per node (what each agent would now run)."""
    out: dict[str, set[str]] = {}
    for r in publisher.all("assignments"):
        out[r.key] = {a["replica_id"] for a in r.value["replicas"]}
    return out


@pytest.fixture()
def world():
    clock = FakeClock()
    state = ClusterState()
    pub = FakePublisher()
    lead = StaticLeadership(True, 3)
    ctl = Controller(state, pub, lead, ControlConfig(node_timeout_s=TIMEOUT, failure_cooldown_s=60))
    for node in ("node-a", "node-b"):
        register(state, node, [gpu(0), gpu(1)])
        heartbeat(state, node, clock(), [gpu(0), gpu(1)])
    return clock, state, pub, lead, ctl


def test_two_models_publish_assignments_per_node_with_epoch(world):
    clock, state, pub, _, ctl = world
    state.apply_spec("alpha", spec_record("alpha", 4096, replicas=2))
    state.apply_spec("beta", spec_record("beta", 8192))
    report_ = ctl.reconcile(clock())
    assert not report_.errors
    got = assigned(pub)
    assert set().union(*got.values()) == {"alpha-0", "alpha-1", "beta-0"}
    # anti-affinity: the two alpha replicas on different nodes
    assert {n for n, ids in got.items() if "alpha-0" in ids} != {n for n, ids in got.items() if "alpha-1" in ids}
    assert all(r.value["epoch"] == 3 for r in pub.all("assignments"))
    kinds = [r.value["kind"] for r in pub.all("events")]
    assert kinds.count("placed") == 3
    statuses = {r.key: r.value for r in pub.all("model-status")}
    assert statuses["alpha"]["desired_replicas"] == 2 and statuses["alpha"]["phase"] == "Progressing"


def test_a_pass_with_the_inputs_of_the_last_placement_reuses_its_plan(world, monkeypatch):
    """Placement is a pure function of demands, inventory, current placements, exclusions and hints: a pass whose
    inputs equal the last one's reuses its plan, and any change of them (a node's CPU, a new spec, a published
    assignment) places afresh.  A node's momentary available memory is never packed against: not an input.
    A new spec alone places only its model again, on the kept plan (``Replanner.replace``)."""
    from sie.control.placement.engine import Replanner

    clock, state, pub, _, ctl = world
    calls: list[int] = []
    partial: list[set[str]] = []
    real, real_replace = Replanner.place_all, Replanner.replace
    monkeypatch.setattr(Replanner, "place_all", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(Replanner, "replace", lambda self, demands, inv: partial.append(set(demands))
                        or real_replace(self, demands, inv))

    def beat(**extra: Any) -> None:
        for node in ("node-a", "node-b"):
            state.apply_heartbeat({"node": node, "ts_ms": int(clock() * 1000), "seq": 1, "gpus": [gpu(0), gpu(1)],
                                   "replicas": [], **extra}, seen_at=clock())

    state.apply_spec("alpha", spec_record("alpha", replicas=2))
    ctl.reconcile(clock())  # places alpha, publishes it
    for r in pub.all("assignments"):
        state.apply_assignment(r.key, r.value)  # read back, as the feeder would
    clock.advance(1)
    beat()
    first = ctl.reconcile(clock())
    placed = len(calls)
    clock.advance(1)
    beat(memory_total_mb=65536, memory_available_mb=1000)  # host memory reported: placement's input changed
    ctl.reconcile(clock())
    assert len(calls) == placed + 1
    clock.advance(1)
    beat(memory_total_mb=65536, memory_available_mb=2000)  # only the available memory moved
    again = ctl.reconcile(clock())
    assert len(calls) == placed + 1 and again.plan.placements == first.plan.placements
    state.apply_spec("beta", spec_record("beta"))
    ctl.reconcile(clock())
    assert len(calls) == placed + 1 and partial == [{"beta"}]
    assert any("beta-0" in ids for ids in assigned(pub).values())


def test_same_state_twice_publishes_nothing(world):
    clock, state, pub, _, ctl = world
    state.apply_spec("alpha", spec_record("alpha"))
    ctl.reconcile(clock())
    batches = len(pub.batches)
    clock.advance(1)
    heartbeat(state, "node-a", clock(), [gpu(0), gpu(1)])
    heartbeat(state, "node-b", clock(), [gpu(0), gpu(1)])
    second = ctl.reconcile(clock())
    assert second.published == ()
    assert len(pub.batches) == batches


def test_silent_node_goes_offline_and_its_replicas_move(world):
    clock, state, pub, _, ctl = world
    state.apply_spec("alpha", spec_record("alpha"))
    ctl.reconcile(clock())
    (first_node,) = [n for n, ids in assigned(pub).items() if "alpha-0" in ids]
    other = "node-b" if first_node == "node-a" else "node-a"
    clock.advance(TIMEOUT - 1)
    heartbeat(state, other, clock(), [gpu(0), gpu(1)])
    assert ctl.reconcile(clock()).published == ()  # not yet past the timeout: nothing moves
    clock.advance(2)  # first_node silent for TIMEOUT + 1 s
    heartbeat(state, other, clock(), [gpu(0), gpu(1)])
    ctl.reconcile(clock())
    now = assigned(pub)
    assert "alpha-0" in now[other] and "alpha-0" not in now[first_node]
    events = [r.value for r in pub.all("events")]
    assert any(e["kind"] == "node_offline" and e["node"] == first_node for e in events)
    moved = [e for e in events if e["kind"] == "moved"]
    assert moved and f"node {first_node} offline" in moved[-1]["detail"]


def test_failed_replica_is_moved_off_that_node(world):
    clock, state, pub, _, ctl = world
    state.apply_spec("alpha", spec_record("alpha"))
    ctl.reconcile(clock())
    (node,) = [n for n, ids in assigned(pub).items() if "alpha-0" in ids]
    other = "node-b" if node == "node-a" else "node-a"
    clock.advance(1)
    heartbeat(state, node, clock(), [gpu(0), gpu(1)], [report("alpha-0", "FAILED", "crashed 5 times in 60s: exit code 1")])
    heartbeat(state, other, clock(), [gpu(0), gpu(1)])
    ctl.reconcile(clock())
    now = assigned(pub)
    assert "alpha-0" in now[other] and "alpha-0" not in now[node]
    kinds = [r.value["kind"] for r in pub.all("events")]
    assert "replica_failed" in kinds and "moved" in kinds
    # the stale FAILED report keeps arriving from the old node: nothing more changes
    clock.advance(1)
    heartbeat(state, node, clock(), [gpu(0), gpu(1)], [report("alpha-0", "FAILED")])
    heartbeat(state, other, clock(), [gpu(0), gpu(1)], [report("alpha-0", "READY")])
    assert ctl.reconcile(clock()).of("assignments") == []


def test_failed_everywhere_is_unschedulable_until_cooldown(world):
    clock, state, pub, _, ctl = world
    state.apply_node("node-b", None)  # one node only
    state.apply_spec("alpha", spec_record("alpha"))
    ctl.reconcile(clock())
    clock.advance(1)
    heartbeat(state, "node-a", clock(), [gpu(0), gpu(1)], [report("alpha-0", "FAILED", "oom")])
    rep = ctl.reconcile(clock())
    status = rep.statuses["alpha"]
    assert status.replicas[0].state == "UNSCHEDULABLE"
    assert "FAILED on node-a" in status.replicas[0].reason
    assert assigned(pub)["node-a"] == set()
    clock.advance(61)  # cool-down (60 s) over: back on node-a
    heartbeat(state, "node-a", clock(), [gpu(0), gpu(1)])
    ctl.reconcile(clock())
    assert assigned(pub)["node-a"] == {"alpha-0"}


def test_unhealthy_gpu_moves_its_replicas(world):
    clock, state, pub, _, ctl = world
    state.apply_spec("alpha", spec_record("alpha", 12000))
    ctl.reconcile(clock())
    (rec,) = [r for r in pub.all("assignments") if r.value["replicas"]]
    node, idx = rec.key, rec.value["replicas"][0]["gpu_indices"][0]
    clock.advance(1)
    gpus = [gpu(i, healthy=(i != idx)) for i in (0, 1)]
    heartbeat(state, node, clock(), gpus)
    ctl.reconcile(clock())
    latest = {r.key: r.value for r in pub.all("assignments")}
    placed = [(n, a["gpu_indices"]) for n, v in latest.items() for a in v["replicas"] if a["replica_id"] == "alpha-0"]
    assert placed and placed[0] != (node, [idx])
    events = [r.value for r in pub.all("events")]
    assert any(e["kind"] == "gpu_failed" for e in events)
    assert any(e["kind"] == "moved" and f"gpu {node}/{idx} failed" in e["detail"] for e in events)


def test_unschedulable_reason_names_the_largest_free_gpu(world):
    clock, state, pub, _, ctl = world
    state.apply_node("node-b", None)
    register(state, "node-a", [gpu(0, 8192), gpu(1, 8192)])
    heartbeat(state, "node-a", clock(), [gpu(0, 8192), gpu(1, 8192)])
    state.apply_spec("big", spec_record("big", 12288))
    rep = ctl.reconcile(clock())
    view = rep.statuses["big"].replicas[0]
    assert view.state == "UNSCHEDULABLE"
    assert view.reason == "unschedulable: needs 12288 MiB GPU memory; largest free is 8192 MiB on node-a/0"
    assert rep.statuses["big"].phase == "Unschedulable"
    assert [r.value["kind"] for r in pub.all("events")] == ["unschedulable"]
    clock.advance(1)
    heartbeat(state, "node-a", clock(), [gpu(0, 8192), gpu(1, 8192)])
    assert ctl.reconcile(clock()).published == ()  # the same reason is not re-announced


def test_restart_from_recorded_assignments_publishes_nothing(world):
    clock, state, pub, _, ctl = world
    state.apply_spec("alpha", spec_record("alpha", 4096, replicas=2))
    state.apply_spec("beta", spec_record("beta", 8192))
    ctl.reconcile(clock())
    # what a fresh control plane reads back from the compacted topics
    fresh = ClusterState()
    for name in ("alpha", "beta"):
        fresh.apply_spec(name, spec_record(name, 4096 if name == "alpha" else 8192, replicas=2 if name == "alpha" else 1))
    for node in ("node-a", "node-b"):
        register(fresh, node, [gpu(0), gpu(1)])
        heartbeat(fresh, node, clock(), [gpu(0), gpu(1)])
    for r in pub.all("assignments"):
        fresh.apply_assignment(r.key, r.value)
    for r in pub.all("model-status"):
        fresh.apply_model_status(r.key, r.value)
    pub2 = FakePublisher()
    ctl2 = Controller(fresh, pub2, StaticLeadership(True, 4), ControlConfig(node_timeout_s=TIMEOUT))
    rep = ctl2.reconcile(clock())
    assert rep.published == () and pub2.batches == []
    assert set(rep.plan.placements) == {"alpha-0", "alpha-1", "beta-0"}


def test_standby_computes_but_publishes_nothing(world):
    clock, state, pub, lead, ctl = world
    lead.leader = False
    state.apply_spec("alpha", spec_record("alpha"))
    rep = ctl.reconcile(clock())
    assert pub.batches == [] and not rep.leader
    assert rep.statuses["alpha"].desired_replicas == 1


def test_fenced_publish_steps_down(world):
    clock, state, pub, lead, ctl = world
    state.apply_spec("alpha", spec_record("alpha"))
    pub.fail_with = Fenced("producer fenced by a newer leader")
    rep = ctl.reconcile(clock())
    assert "publish" in rep.errors and not lead.is_leader
    assert pub.batches == []


def test_failed_publish_is_retried_next_pass(world):
    clock, state, pub, _, ctl = world
    state.apply_spec("alpha", spec_record("alpha"))
    pub.fail_with = RuntimeError("broker unavailable")
    assert "publish" in ctl.reconcile(clock()).errors
    ctl.reconcile(clock.advance(1) and clock())
    assert "alpha-0" in set().union(*assigned(pub).values())


def test_deleted_model_empties_its_nodes_and_tombstones_status(world):
    clock, state, pub, _, ctl = world
    state.apply_spec("alpha", spec_record("alpha"))
    ctl.reconcile(clock())
    state.apply_spec("alpha", None)
    rep = ctl.reconcile(clock())
    assert all(not ids for ids in assigned(pub).values())
    assert [r.value for r in rep.of("model-status")] == [None]
    assert any(r.value["kind"] == "removed" for r in rep.of("events"))


def test_a_failing_subsystem_becomes_an_error_not_a_crash(world, monkeypatch):
    clock, state, pub, _, ctl = world
    state.apply_spec("alpha", spec_record("alpha"))
    import sie.control.reconcile.publishing as mod

    monkeypatch.setattr(mod, "build_status", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    rep = ctl.reconcile(clock())
    assert rep.errors["status"] == "RuntimeError: boom"
    assert "alpha-0" in set().union(*assigned(pub).values())  # placement still published


def test_replica_states_come_from_heartbeats(world):
    clock, state, pub, _, ctl = world
    state.apply_spec("alpha", spec_record("alpha"))
    ctl.reconcile(clock())
    (node,) = [n for n, ids in assigned(pub).items() if "alpha-0" in ids]
    clock.advance(1)
    heartbeat(state, node, clock(), [gpu(0), gpu(1)], [report("alpha-0", "READY")])
    rep = ctl.reconcile(clock())
    assert rep.statuses["alpha"].phase == "Ready" and rep.statuses["alpha"].ready_replicas == 1
    assert [r.value["phase"] for r in rep.of("model-status")] == ["Ready"]


def agent_heartbeat(state: ClusterState, node: str, at: float, **host: Any) -> None:
    """A heartbeat as an agent builds it (``messages.heartbeat``), through Avro, as the feeder would apply it."""
    from sie.schemas.avro_codec import decode, encode
    from sie.workers.agent import messages
    from sie.workers.replica import ReplicaState as RS
    from sie.workers.supervisor import ReplicaSnapshot

    snaps = [ReplicaSnapshot(rid, rid.rsplit("-", 1)[0], "1.0.0", RS.READY, pid, 0, 0, "", None, None, "h", ())
             for rid, pid in host.pop("replicas", {}).items()]
    record = messages.heartbeat(node, 2, int(at * 1000), [], snaps, **host)  # GPUs: as registered
    state.apply_heartbeat(decode(encode("Heartbeat", record)), seen_at=at)


def test_heartbeat_host_memory_reaches_the_inventory_and_placement_counts_process_overhead(world):
    clock, state, pub, _, ctl = world
    agent_heartbeat(state, "node-a", clock(), memory_total_mb=16384, memory_available_mb=9000, reserved_memory_mb=384)
    nodes = {n.name: n for n in state.snapshot().inventory(clock(), TIMEOUT).nodes}
    a, b = nodes["node-a"], nodes["node-b"]
    assert (a.memory_mb, a.memory_available_mb, a.process_slots) == (16384 - 384, 9000, 0)
    assert (b.memory_mb, b.memory_available_mb, b.process_slots) == (32768, None, None)  # old agent: as registered
    (view_a,) = [v for v in state.snapshot().node_views(clock(), TIMEOUT) if v.name == "node-a"]
    assert view_a.to_json()["memory_available_mb"] == 9000

    # 16000 MiB declared + 579 MiB process overhead fits neither node-a (16000 free) nor node-b (old agent:
    # no overhead counted there, but 16000 + 16000 of its 32768 MiB are taken by the two replicas first)
    state.apply_spec("big", spec_record("big", 1024, replicas=3, resources={"gpuMemoryMb": 1024, "cpu": 1, "memoryMb": 16000}))
    rep = ctl.reconcile(clock())
    placed = {v.replica_id: v.node for v in rep.statuses["big"].replicas}
    assert sorted(n for n in placed.values() if n) == ["node-b", "node-b"]
    (unplaced,) = [v for v in rep.statuses["big"].replicas if v.node is None]
    assert unplaced.reason == ("unschedulable: needs 16579 MiB host memory (16000 MiB declared + 579 MiB process "
                               "overhead); most free is 16000 MiB on node-a")


def test_the_process_hosting_a_replica_reaches_its_status(world):
    clock, state, pub, _, ctl = world
    state.apply_spec("alpha", spec_record("alpha"))
    ctl.reconcile(clock())
    (node,) = [n for n, ids in assigned(pub).items() if "alpha-0" in ids]
    clock.advance(1)
    agent_heartbeat(state, node, clock(), replicas={"alpha-0": 4242}, memory_total_mb=32768)
    (view,) = ctl.reconcile(clock()).statuses["alpha"].replicas
    assert view.process == "pid-4242"  # a worker process of its own, named by its pid
    assert view.to_record()["process"] == "pid-4242"
    clock.advance(1)
    agent_heartbeat(state, node, clock(), replicas={"alpha-0": 4242}, memory_total_mb=32768, shared_process_slots=32,
                    processes={"alpha-0": "shared-0"})
    (view,) = ctl.reconcile(clock()).statuses["alpha"].replicas
    assert view.process == "shared-0"  # a multi-model runtime reports the shared process instead


def test_a_ready_replica_whose_backend_is_in_an_outage_makes_its_model_degraded_with_the_reason(world):
    """Issue 22: the worker runs (READY) but retries every batch; the agent's heartbeat says why, the status says
    Degraded with that reason (what `sie describe model` and the API show), and Ready again once it scores."""
    from sie.schemas.avro_codec import decode, encode
    from sie.workers.agent import messages
    from sie.workers.replica import ReplicaState as RS
    from sie.workers.supervisor import ReplicaSnapshot

    clock, state, pub, _, ctl = world
    state.apply_spec("alpha", spec_record("alpha"))
    ctl.reconcile(clock())
    (node,) = [n for n, ids in assigned(pub).items() if "alpha-0" in ids]
    since_ms = int(clock() * 1000)

    def beat(outage):
        clock.advance(1)
        snap = ReplicaSnapshot("alpha-0", "alpha", "1.0.0", RS.READY, 4242, 0, 0, "", None, None, "h", (), lag=500,
                               outage=outage)
        state.apply_heartbeat(decode(encode("Heartbeat", messages.heartbeat(node, 2, int(clock() * 1000), [], [snap]))),
                              seen_at=clock())
        return ctl.reconcile(clock())

    rep = beat({"since_ms": since_ms, "detail": "backend fails on a known-good row too (ConnectionError: refused)"})
    status = rep.statuses["alpha"]
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since_ms / 1000))
    assert status.phase == "Degraded" and status.ready_replicas == 1
    assert status.reason == (f"1 of 1 replica(s) in a backend outage; alpha-0: backend outage since {since}: backend "
                             "fails on a known-good row too (ConnectionError: refused); its batches are retried, nothing "
                             "is scored")
    assert [r.value["phase"] for r in rep.of("model-status")] == ["Degraded"]
    assert beat({"since_ms": since_ms, "detail": "backend fails on a known-good row too (ConnectionError: refused)"}) \
        .of("model-status") == []  # the same outage: the status is not published again every pass
    rep = beat(None)
    assert rep.statuses["alpha"].phase == "Ready" and [r.value["phase"] for r in rep.of("model-status")] == ["Ready"]


def test_config_file_reads_the_article_config(tmp_path):
    path = tmp_path / "cp.yaml"
    path.write_text("scheduling: {strategy: binpack}\ncontrol: {node_timeout_s: 4}\n")
    assert ControlConfig.from_yaml(path).node_timeout_s == 4.0
    path.write_text("scheduling: {strategy: spread}\n")
    from sie.kernel.errors import ConfigError

    with pytest.raises(ConfigError, match="scheduling.strategy"):
        ControlConfig.from_yaml(path)


# -- acting only on a view known to be current ---------------------------------------------------------


class View:
    """The controller's ``StateView`` (the state feeder in production), set by the test."""

    def __init__(self, caught_up_at: float = float("-inf")) -> None:
        self.caught_up_at: float | None = caught_up_at
        self.stale: str | None = None
        self.lag: str | None = None

    def stale_reason(self) -> str | None:
        return self.stale

    def lag_reason(self) -> str | None:
        return self.lag


def replayed(state: ClusterState, node: str, at: float) -> None:
    """A heartbeat read while replaying history: proof of life at its broker time ``at``, not "seen now"."""
    state.apply_heartbeat({"node": node, "ts_ms": int(at * 1000), "seq": 1, "gpus": [gpu(0), gpu(1)], "replicas": []},
                          seen_at=None, replayed_at=at)


def assignment_of(state: ClusterState, node: str, replica_id: str) -> dict:
    """The Assignment record a leader published earlier: ``replica_id`` of alpha on GPU 0 of ``node``."""
    spec = state.snapshot().specs["alpha"]
    return {"node": node, "epoch": 2, "issued_at_ms": 0, "replicas": [
        {"replica_id": replica_id, "model": "alpha", "version": spec.version, "gpu_indices": [0],
         "gpu_memory_mb": 4096, "spec_json": json.dumps(spec.to_document(), sort_keys=True, separators=(",", ":"))}]}


def beat(state: ClusterState, clock: FakeClock, *nodes: str) -> None:
    for node in nodes:
        heartbeat(state, node, clock(), [gpu(0), gpu(1)])


def place_alpha(clock: FakeClock, state: ClusterState, pub: FakePublisher, ctl: Controller, replicas: int) -> dict[str, set[str]]:
    state.apply_spec("alpha", spec_record("alpha", 4096, replicas=replicas))
    assert not ctl.reconcile(clock()).errors
    return assigned(pub)


def test_a_stale_view_is_not_acted_on_and_the_reason_is_reported(world):
    clock, state, pub, _, ctl = world
    ctl.view = view = View()
    view.stale = "state reader died (KafkaException: ...); restart 1 pending"
    state.apply_spec("alpha", spec_record("alpha"))
    rep = ctl.reconcile(clock())
    assert rep.skipped == view.stale and rep.published == () and pub.batches == []
    assert ctl.health()["reconcile"] == {"ok": False, "detail": f"not acting: {view.stale}"}
    view.stale = None
    assert "alpha-0" in set().union(*assigned(ctl.reconcile(clock()) and pub).values())
    assert ctl.health()["reconcile"]["ok"]


def test_after_catching_up_liveness_is_judged_only_once_each_replayed_node_spoke_live_or_a_timeout_passed():
    clock, state, pub = FakeClock(), ClusterState(), FakePublisher()
    view = View(caught_up_at=clock())
    ctl = Controller(state, pub, StaticLeadership(True, 3), ControlConfig(node_timeout_s=TIMEOUT), view=view)
    for node in ("node-a", "node-b"):
        register(state, node, [gpu(0), gpu(1)])
        replayed(state, node, clock() - 1)
    state.apply_spec("alpha", spec_record("alpha"))
    state.apply_assignment("node-b", assignment_of(state, "node-b", "alpha-0"))

    clock.advance(0.5)
    rep = ctl.reconcile(clock())
    assert rep.skipped and "for a live heartbeat of node-a, node-b" in rep.skipped and pub.batches == []
    clock.advance(0.5)
    beat(state, clock, "node-a")
    rep = ctl.reconcile(clock())
    assert rep.skipped and "of node-b before judging liveness" in rep.skipped  # node-a spoke; node-b did not yet

    clock.advance(TIMEOUT)  # one node timeout after catching up: node-b had its chance
    beat(state, clock, "node-a")
    rep = ctl.reconcile(clock())
    assert rep.skipped is None and assigned(pub) == {"node-a": {"alpha-0"}, "node-b": set()}
    assert any(e["kind"] == "moved" and "node node-b offline" in e["detail"] for e in (r.value for r in pub.all("events")))


def test_every_node_going_silent_at_once_holds_their_replicas_until_heartbeats_flow_again(world):
    clock, state, pub, _, ctl = world
    before = place_alpha(clock, state, pub, ctl, replicas=2)
    assert before == {"node-a": {"alpha-0"}, "node-b": {"alpha-1"}}  # replica-id order, anti-affinity: one each
    published = len(pub.all("assignments"))

    clock.advance(TIMEOUT + 1)  # no heartbeat from anyone: our silence, far more likely than two dead machines
    rep = ctl.reconcile(clock())
    assert rep.guard and "2 of 2 nodes went offline or silent" in rep.guard
    assert "no heartbeat has arrived from any node for 7s" in rep.guard
    assert [r.value["kind"] for r in rep.of("events")] == ["liveness_guard"] and rep.of("assignments") == []
    health = ctl.health()["liveness_guard"]
    assert not health["ok"] and health["holding"] == ["node-a", "node-b"]
    clock.advance(60)
    rep = ctl.reconcile(clock())
    assert rep.guard and rep.of("events") == [] and rep.of("assignments") == []  # still holding, said once
    assert len(pub.all("assignments")) == published and assigned(pub) == before

    beat(state, clock, "node-a", "node-b")  # heartbeats flow again
    assert ctl.reconcile(clock()).guard  # released only after one full window of flowing heartbeats
    clock.advance(TIMEOUT)
    beat(state, clock, "node-a", "node-b")
    rep = ctl.reconcile(clock())
    assert rep.guard is None and [r.value["kind"] for r in rep.of("events")] == ["liveness_guard_released"]
    assert "2 of 2 held nodes are back" in rep.of("events")[0].value["detail"]
    assert len(pub.all("assignments")) == published and ctl.health()["liveness_guard"]["ok"]
    assert not [e for e in pub.all("events") if e.value["kind"] in ("moved", "node_offline", "unschedulable")]


def test_heartbeats_stopping_everywhere_hold_the_first_node_to_time_out_already(world):
    """All heartbeats stop at once, but the nodes' last ones are spread over a heartbeat interval: the node
    whose last heartbeat came first times out while the others still count as online.  It must be held."""
    clock, state, pub, _, ctl = world
    before = place_alpha(clock, state, pub, ctl, replicas=2)
    clock.advance(1.5)
    beat(state, clock, "node-b")  # node-b's last heartbeat, 1.5 s after node-a's
    clock.advance(TIMEOUT - 1.5 + 0.1)  # node-a just timed out; node-b is silent for TIMEOUT - 1.4 s
    rep = ctl.reconcile(clock())
    assert rep.guard and "no heartbeat has arrived from any node for 5s" in rep.guard
    assert rep.of("assignments") == [] and assigned(pub) == before


def test_a_node_dying_alone_is_not_held_while_the_others_keep_heartbeating(world):
    clock, state, pub, _, ctl = world
    place_alpha(clock, state, pub, ctl, replicas=1)
    (node,) = [n for n, ids in assigned(pub).items() if ids]
    other = "node-b" if node == "node-a" else "node-a"
    for _ in range(4):  # the other node heartbeats every 2 s; the first one is silent
        clock.advance(2)
        beat(state, clock, other)
        rep = ctl.reconcile(clock())
        assert rep.guard is None
    assert assigned(pub)[other] == {"alpha-0"}  # moved at the usual time: the timeout plus one pass


def test_a_held_node_still_silent_when_heartbeats_flow_again_is_moved_after_the_hold(world):
    clock, state, pub, _, ctl = world
    state.apply_node("node-b", None)
    register(state, "node-b", [gpu(0), gpu(1)])
    place_alpha(clock, state, pub, ctl, replicas=1)
    (node,) = [n for n, ids in assigned(pub).items() if ids]
    other = "node-b" if node == "node-a" else "node-a"
    clock.advance(TIMEOUT + 1)
    assert ctl.reconcile(clock()).guard
    beat(state, clock, other)  # only the other node comes back
    ctl.reconcile(clock())
    clock.advance(TIMEOUT)
    beat(state, clock, other)
    rep = ctl.reconcile(clock())
    kinds = [r.value["kind"] for r in rep.of("events")]
    assert kinds[0] == "liveness_guard_released" and f"taken as offline: {node}" in rep.of("events")[0].value["detail"]
    assert assigned(pub)[other] == {"alpha-0"} and assigned(pub)[node] == set()  # moved now, as for any dead node
    assert "moved" in kinds


@pytest.mark.parametrize("lag", ["state reader 5s behind the end of the heartbeats topic", None])
def test_a_partial_mass_offline_is_held_only_while_the_reader_lags(lag):
    clock, state, pub = FakeClock(), ClusterState(), FakePublisher()
    view = View()
    ctl = Controller(state, pub, StaticLeadership(True, 3), ControlConfig(node_timeout_s=TIMEOUT), view=view)
    nodes = ("node-a", "node-b", "node-c")
    for node in nodes:
        register(state, node, [gpu(0), gpu(1)])
    beat(state, clock, *nodes)
    before = place_alpha(clock, state, pub, ctl, replicas=3)
    clock.advance(TIMEOUT + 1)
    beat(state, clock, "node-a")  # two of three go silent; node-a keeps speaking
    view.lag = lag
    rep = ctl.reconcile(clock())
    if lag:  # our reader lags: the silence may be ours
        assert rep.guard and f"2 of 3 nodes went offline or silent within {TIMEOUT:g}s while {lag}" in rep.guard
        assert assigned(pub) == before
    else:  # the reader keeps up and node-a is heard: two machines really went down; their replicas move
        assert rep.guard is None and assigned(pub)["node-b"] == set() == assigned(pub)["node-c"]


def test_a_control_plane_started_in_the_middle_of_a_global_silence_holds_too():
    clock, state, pub = FakeClock(), ClusterState(), FakePublisher()
    view = View(caught_up_at=clock())
    ctl = Controller(state, pub, StaticLeadership(True, 3), ControlConfig(node_timeout_s=TIMEOUT), view=view)
    state.apply_spec("alpha", spec_record("alpha"))
    for node in ("node-a", "node-b"):
        register(state, node, [gpu(0), gpu(1)])
        replayed(state, node, clock() - 30)  # the last heartbeats are 30 s old: the silence began before we started
    state.apply_assignment("node-a", assignment_of(state, "node-a", "alpha-0"))
    clock.advance(TIMEOUT + 0.1)
    rep = ctl.reconcile(clock())
    assert rep.skipped is None and rep.guard and "2 of 2 nodes went offline or silent" in rep.guard
    assert pub.all("assignments") == []  # node-a's assignment is left as it is


def test_the_guard_fraction_is_a_setting(tmp_path):
    path = tmp_path / "cp.yaml"
    path.write_text("control: {mass_offline_fraction: 1.0}\n")
    assert ControlConfig.from_yaml(path).mass_offline_fraction == 1.0
    from sie.kernel.errors import ConfigError

    with pytest.raises(ConfigError, match=r"control.mass_offline_fraction: must be > 0 and <= 1 \(got 0.0\)"):
        ControlConfig(mass_offline_fraction=0.0)


@pytest.mark.parametrize(("fraction", "silent", "held"), [(0.5, 2, True), (1.0, 2, False), (1.0, 3, True)])
def test_the_guard_holds_from_the_configured_fraction_of_nodes(fraction, silent, held):
    from sie.control.reconcile.liveness import MassOfflineGuard

    guard = MassOfflineGuard(window_s=TIMEOUT, fraction=fraction)
    now = 1000.0
    nodes = {"n1": now - 1, "n2": now - 1, "n3": now - 1}
    guard.assess(now - 1, nodes, set(nodes))  # all three online a moment ago
    for name in list(nodes)[:silent]:
        nodes[name] = now - TIMEOUT - 1
    online = set(list(nodes)[silent:])
    decision = guard.assess(now, nodes, online, lag="state reader 4s behind the end of the heartbeats topic")
    assert bool(decision.holding) == held and guard.holding == held


def test_a_replayed_heartbeat_proves_life_at_its_broker_time_as_one_shot_readers_see_it():
    """`sie get nodes` reads the topics once and stops: its liveness comes from replayed heartbeats alone."""
    state = ClusterState()
    replayed(state, "recent", 1000.0 - 2)
    replayed(state, "old", 1000.0 - 7)
    snap = state.snapshot()
    assert snap.node_online("recent", 1000.0, TIMEOUT) and not snap.node_online("old", 1000.0, TIMEOUT)
    assert not snap.heard_live("recent", 1000.0, TIMEOUT)  # but it was not heard live: the controller waits for that
    assert not snap.node_online("never", 1000.0, TIMEOUT)


def test_the_loop_runs_a_pass_when_a_silent_node_turns_offline_not_at_its_next_interval():
    """A node silent for more than half the timeout turns offline at a known time: the loop waits until then
    (not its whole interval), so its replicas move as soon as it counts as offline.  Nodes heard recently
    (every heartbeat interval) never shorten the wait."""
    from types import SimpleNamespace

    from sie.control.service import ControlService

    state, now = ClusterState(), 1000.0
    for node, last in (("fresh", now - 1.0), ("silent", now - 5.5), ("gone", now - 9.0)):
        register(state, node, [gpu(0)])
        heartbeat(state, node, last, [gpu(0)])
    assert state.next_offline_at(now, 6.0) == pytest.approx(now + 0.5)  # silent: 5.5 s of its 6 s
    service = SimpleNamespace(state=state, config=ControlConfig(node_timeout_s=6.0, reconcile_interval_s=1.0))
    assert ControlService.next_wait(service, now) == pytest.approx(0.51)  # type: ignore[arg-type]
    heartbeat(state, "silent", now, [gpu(0)])  # heard again: nothing is due, the interval it is
    assert state.next_offline_at(now, 6.0) is None
    assert ControlService.next_wait(service, now) == 1.0  # type: ignore[arg-type]
    ctl = Controller(state, FakePublisher(), StaticLeadership(True, 1), ControlConfig(node_timeout_s=6.0))
    heartbeat(state, "silent", now - 5.5, [gpu(0)])
    before = ctl.reconcile(now + 0.49)
    after = ctl.reconcile(now + 0.51)
    online = {n.name: n.online for n in after.plan.inventory.nodes}
    assert {n.name: n.online for n in before.plan.inventory.nodes}["silent"] and not online["silent"]
