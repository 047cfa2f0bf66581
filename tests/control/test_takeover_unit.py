"""A leader change mid-rollout touches no replica: two control planes on an in-memory copy of the control
topics, a fake clock, simulated agents.  No Kafka (the same on real processes: tests/test_failover_e2e.py).

What a leader publishes goes out as Kafka would carry it (Avro-encoded, one batch per transaction) and is
applied to every instance's ``ClusterState`` as its state feeder would; the rollouts topic keeps the latest
record per model, and a new leader's ``Rollouts`` reads it like ``read_rollouts``.  The simulated agents
heartbeat what their node's latest assignment says (READY, or STARTING for replicas a test holds) and count a
worker restart whenever an assignment changes or drops a replica they run.

A failover here is what ``sie control`` does on a SIGKILL: the old leader stops between two steps of its
loop, the standby is elected with a higher epoch (its ``LeaderEpoch`` + ``leader_elected``), and from then on
runs the loop (``service.one_pass``) with its ``Takeover``.  The killed one comes back as a fresh process that
replays the topics and is the next standby.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from sie.control.reconcile.config import ControlConfig
from sie.control.reconcile.controller import Controller
from sie.control.reconcile.director import DirectorPolicy
from sie.control.reconcile.feeder import ReadBarrier, decode_value
from sie.control.reconcile.ports import OutRecord, StaticLeadership
from sie.control.reconcile.records import ClusterState
from sie.control.rollout.machine import Phase, VersionWindow
from sie.control.rollout.service import Rollouts
from sie.control.service import Takeover, one_pass
from sie.kernel.settings import Settings
from sie.schemas.avro_codec import encode
from sie.schemas.spec import ModelService
from tests.control.reconcile.test_control_unit import FakeClock, gpu, register, spec_record

OLD, NEW = "1.0.0", "1.1.0"
NODES = ("node-a", "node-b")
#: gpu memory of each node's one GPU: room for the 2 replicas and the surge replica (4096 MiB each)
GPU_MB = 16384


class Windows:
    """The gates' numbers: the canary answers as well as stable (the gates pass)."""

    def window(self, model: str, version: str, since_ms: int) -> VersionWindow:
        return VersionWindow(1000, 0, 0, 10.0)

    def close(self, model: str | None = None) -> None:
        pass


class Bus:
    """The control topics in memory.  ``publish`` is one committed transaction: each record is Avro-encoded
    (what Kafka carries) and delivered to every live instance's state, except to one whose feeder a test holds
    back (``held``: delivered at ``release``)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, bytes | None]] = []  # (topic, key, value) in commit order
        self.instances: list[Instance] = []
        self.held: dict[str, list[tuple[str, str, bytes | None]]] = {}

    def publish(self, records: list[OutRecord]) -> None:
        batch = [(r.topic, r.key, None if r.value is None else encode(r.record, dict(r.value))) for r in records]
        self.log += batch
        for inst in self.instances:
            if inst.name in self.held:
                self.held[inst.name] += batch
            else:
                for rec in batch:
                    inst.apply(*rec)

    def release(self, name: str) -> None:
        for rec in self.held.pop(name, []):
            self.instance(name).apply(*rec)

    def instance(self, name: str) -> Instance:
        return next(i for i in self.instances if i.name == name)

    def latest(self, topic: str) -> dict[str, bytes | None]:
        """Key -> its latest value (a compacted topic)."""
        out: dict[str, bytes | None] = {}
        for t, key, value in self.log:
            if t == topic:
                out[key] = value
        return out

    def rollouts(self) -> list[dict[str, Any]]:
        return [decode_value(v, "Rollout") for v in self.latest("rollouts").values() if v is not None]

    def since(self, mark: int, topic: str) -> list[dict[str, Any]]:
        return [decode_value(v) for t, _k, v in self.log[mark:] if t == topic and v is not None]

    def assignments(self) -> dict[str, dict[str, Any]]:
        return {node: decode_value(v) for node, v in self.latest("assignments").items() if v is not None}


class FakeFeeder:
    """The instance's state feeder as far as a takeover sees it: its read barrier is reached once the bus
    delivered everything it held back for this instance."""

    def __init__(self, bus: Bus, name: str) -> None:
        self.bus, self.name = bus, name
        self.barriers: list[ReadBarrier] = []

    def sync(self, on_done: Callable[[], None] | None = None) -> ReadBarrier:
        barrier = ReadBarrier(on_done)
        barrier.ends = {}
        if self.name not in self.bus.held:
            barrier._finish()
        self.barriers.append(barrier)
        return barrier

    def release(self) -> None:
        self.bus.release(self.name)
        for b in self.barriers:
            if not b.reached():
                b._finish()


class Instance:
    """One ``sie control``: state, controller, rollouts and takeover, wired as ``ControlService`` wires them."""

    def __init__(self, bus: Bus, name: str, clock: FakeClock, config: ControlConfig) -> None:
        self.bus, self.name, self.clock = bus, name, clock
        self.state = ClusterState()
        self.lead = StaticLeadership(False, 0)
        self.feeder = FakeFeeder(bus, name)
        self.rollouts = Rollouts(Settings(), self.lead, self, clock=clock, windows=Windows(),
                                 reader=lambda _s: bus.rollouts())
        self.takeover = Takeover(self.feeder, self.rollouts, clock)
        self.ctl = Controller(self.state, self, self.lead, config, rollouts=self.rollouts, takeover=self.takeover)
        self.rollouts.driver.capacity = lambda model: self.ctl.capacity.get(model)
        for rec in bus.log:  # a fresh process replays the topics
            self.apply(*rec)
        bus.instances.append(self)

    def publish(self, records: list[OutRecord]) -> None:  # the Publisher: refuses unless leading
        assert self.lead.is_leader, f"{self.name} published without leading"
        self.bus.publish(list(records))

    def apply(self, topic: str, key: str, value: bytes | None) -> None:
        """As ``StateFeeder._apply`` does for each record it reads."""
        record = None if value is None else decode_value(value)
        if topic == "specs":
            self.state.apply_spec(key, record)
        elif topic == "nodes":
            self.state.apply_node(key, record)
        elif topic == "assignments":
            self.state.apply_assignment(key, record)
        elif topic == "model-status":
            self.state.apply_model_status(key, record)
        elif topic == "control-leader":
            self.state.apply_leader_epoch(record)
        elif topic == "events" and record is not None:
            self.state.apply_event(record)
        elif topic == "heartbeats" and record is not None:
            self.state.apply_heartbeat(record, seen_at=self.clock())

    def step(self) -> Any:
        return one_pass(self.ctl, self.rollouts, self.clock())


class Agents:
    """Every node's agent: heartbeats what the node's latest assignment says; a worker restarts when its
    replica's assignment changes (version, spec, GPUs) or the replica is dropped, a companion process (the
    rollout's other version, served next to a READY replica) when its document changes."""

    def __init__(self, bus: Bus, clock: FakeClock) -> None:
        self.bus, self.clock = bus, clock
        self.running: dict[tuple[str, str], tuple[Any, ...]] = {}  # (node, replica) -> what it runs
        self.restarts: list[str] = []
        self.companions: dict[tuple[str, str], tuple[str, ...]] = {}  # (node, replica) -> companion documents
        self.companion_restarts: list[str] = []
        #: replica ids reported STARTING while their version is NEW (their readiness inference not done)
        self.hold: set[str] = set()
        #: (node, replica id) -> why the agent gave the replica up (reported FAILED); nodes that stopped
        self.failed: dict[tuple[str, str], str] = {}
        self.silent: set[str] = set()

    def beat(self) -> None:
        wanted: dict[tuple[str, str], tuple[Any, ...]] = {}
        companions: dict[tuple[str, str], tuple[str, ...]] = {}
        for node, value in self.bus.assignments().items():
            for a in value["replicas"]:
                wanted[(node, a["replica_id"])] = (a["version"], a["spec_json"], tuple(a["gpu_indices"]))
                companions[(node, a["replica_id"])] = tuple(a["companions"])
        for key, running in self.running.items():
            if wanted.get(key) != running:
                self.restarts.append(f"{key[1]} on {key[0]}: {running[0]} -> "
                                     f"{wanted[key][0] if key in wanted else 'removed'}")
            elif self.companions.get(key) and companions.get(key) != self.companions[key]:
                self.companion_restarts.append(f"{key[1]} on {key[0]}: {len(self.companions[key])} -> "
                                               f"{len(companions.get(key, ()))} companion(s)")
        self.running, self.companions = wanted, companions
        for node in NODES:
            if node in self.silent:
                continue
            reps = [{"replica_id": rid, "model": rid.rsplit("-", 1)[0], "version": run[0],
                     "state": "FAILED" if (n, rid) in self.failed else
                     "STARTING" if rid in self.hold and run[0] == NEW else "READY",
                     "reason": self.failed.get((n, rid)),
                     "versions": [{"version": json.loads(doc)["version"], "state": "ready", "detail": None}
                                  for doc in self.companions.get((n, rid), ())]}
                    for (n, rid), run in sorted(self.running.items()) if n == node]
            self.bus.publish([OutRecord("heartbeats", node, "Heartbeat", {
                "node": node, "ts_ms": int(self.clock() * 1000), "seq": 1, "gpus": [gpu(0, total=GPU_MB)],
                "replicas": reps})])


class World:
    def __init__(self, replicas: int = 2, rollout: dict | None = None, config: ControlConfig | None = None) -> None:
        self.clock, self.bus = FakeClock(), Bus()
        self.config = config or ControlConfig(node_timeout_s=6.0)
        record = spec_record("m", 4096, replicas=replicas)
        self.stable_doc = json.loads(record["spec_json"])
        self.canary_doc = {**self.stable_doc, "version": NEW,
                           "rollout": rollout or {"steps": [50, 100], "intervalSeconds": 10}}
        self.bus.publish([OutRecord("specs", "m", "ModelSpecRecord", {**record, "deleted": False})])
        for node in NODES:
            state = ClusterState()
            register(state, node, [gpu(0, total=GPU_MB)])
            info = state.nodes[node]
            self.bus.publish([OutRecord("nodes", node, "NodeRegistration", {
                "node": node, "labels": dict(info.labels), "tier": None, "cpu_count": 8, "memory_mb": 32768,
                "gpus": [gpu(0, total=GPU_MB)], "simulated": True, "agent_version": "test", "started_at_ms": 0})])
        self.agents = Agents(self.bus, self.clock)
        self.agents.beat()
        self.epoch = 10
        self.leader = Instance(self.bus, "cp-1", self.clock, self.config)
        self.standby = Instance(self.bus, "cp-2", self.clock, self.config)
        self.elect(self.leader)

    def elect(self, inst: Instance) -> None:
        """What the elector does once it holds partition 0: a higher epoch, claimed in one transaction."""
        self.epoch += 1
        inst.lead.leader, inst.lead.current_epoch = True, self.epoch
        self.bus.publish([
            OutRecord("control-leader", "cluster", "LeaderEpoch",
                      {"instance_id": inst.name, "epoch": self.epoch, "ts_ms": int(self.clock() * 1000)}),
            OutRecord("events", "cluster", "ControlEvent", {
                "ts_ms": int(self.clock() * 1000), "kind": "leader_elected", "model": None, "replica_id": None,
                "node": None, "detail": f"control plane {inst.name} leads with epoch {self.epoch}"})])

    def turn(self, passes: int = 1, seconds: float = 1.0) -> None:
        """The agents heartbeat, then every instance runs its loop once (the standby computes, publishes nothing)."""
        for _ in range(passes):
            self.clock.advance(seconds)
            self.agents.beat()
            for inst in (self.leader, self.standby):
                inst.step()

    def converge(self, limit: int = 10) -> None:
        """The leader's passes until one publishes no assignment (the agents heartbeat in between): a settled
        view, so the next pass of ANY leader over it has nothing to change."""
        for _ in range(limit):
            self.clock.advance(1.0)
            self.agents.beat()
            mark = len(self.bus.log)
            self.leader.ctl.reconcile(self.clock())
            self.standby.ctl.reconcile(self.clock())
            if not self.bus.since(mark, "assignments"):
                return
        raise AssertionError("the leader's passes never settled")

    def begin(self) -> None:
        self.leader.rollouts.begin(ModelService.from_document(self.stable_doc),
                                   ModelService.from_document(self.canary_doc))

    def phase(self) -> str:
        (rec,) = self.bus.rollouts()
        return rec["phase"]

    def until(self, phase: str, limit: int = 60) -> None:
        for _ in range(limit):
            if self.phase() == phase:
                return
            self.turn()
        raise AssertionError(f"the rollout never reached {phase} (at {self.phase()})")

    def fail_over(self) -> tuple[Instance, int]:
        """SIGKILL the leader (it runs no further step), elect the standby; the killed one restarts as a fresh
        process that replays the topics (the next standby).  Returns the new leader and the log position of
        the kill."""
        dead, new = self.leader, self.standby
        dead.lead.leader = False
        self.bus.instances.remove(dead)
        mark = len(self.bus.log)
        self.elect(new)
        self.leader, self.standby = new, Instance(self.bus, f"{dead.name}'", self.clock, self.config)
        return new, mark

    def by_node(self) -> dict[str, bytes]:
        """Each node's latest Assignment, re-encoded with the epoch stamp and issue time zeroed."""
        return {node: encode("Assignment", {**value, "epoch": 0, "issued_at_ms": 0})
                for node, value in self.bus.assignments().items()}

    def model(self) -> dict[str, str]:
        return {a["replica_id"]: a["version"] for v in self.bus.assignments().values() for a in v["replicas"]}


def placements_of(events: list[dict[str, Any]]) -> list[str]:
    return [f"{e['kind']} {e['replica_id']}: {e['detail']}" for e in events
            if e.get("model") == "m" and e["kind"] in ("placed", "removed", "moved", "preempted")]


def _settle_in(world: World, phase: str) -> None:
    """Drive the rollout into ``phase`` and let the leader's passes settle there."""
    agents = world.agents
    if phase == "Pending":
        world.begin()  # the leader dies before its loop ticked the rollout once
    elif phase == "Surging":
        agents.hold.add("m-2")  # the surge replica's readiness inference is not done
        world.begin()
        world.until("Surging")
    elif phase == "Canary":
        world.begin()
        world.until("Canary")
    elif phase == "Paused":
        world.begin()
        world.until("Canary")
        entry, records = world.leader.rollouts.driver.act("m", "pause", "alice")
        world.bus.publish(records)
        world.leader.rollouts.driver.commit(entry)
    elif phase == "Promoting":
        world.begin()
        for _ in range(60):  # a loop turn whose tick promoted: the leader dies before the next tick drains
            if world.phase() == "Promoting":
                break
            world.turn()
    elif phase == "Draining":
        world.begin()
        world.until("Canary")
        agents.hold.add("m-1")  # the first stable replica replaced is still loading the new version
        world.until("Draining")
    assert world.phase() == phase, world.bus.rollouts()
    world.converge()


PHASES = ["Pending", "Surging", "Canary", "Paused", "Promoting", "Draining"]


@pytest.mark.parametrize("phase", PHASES)
def test_a_new_leader_first_pass_mid_rollout_changes_no_assignment_and_restarts_no_worker(phase):
    world = World()
    world.turn(3)
    world.converge()
    assert world.model() == {"m-0": OLD, "m-1": OLD}
    _settle_in(world, phase)
    before, replicas = world.by_node(), world.model()
    restarts, companions = len(world.agents.restarts), len(world.agents.companion_restarts)

    new, mark = world.fail_over()
    world.clock.advance(1.0)
    world.agents.beat()
    report = new.step()
    assert report.skipped is None and report.leader, report.skipped
    assert world.by_node() == before, "the new leader's first pass re-published an assignment that differs"
    assert not world.bus.since(mark, "assignments"), "nothing to publish: every assignment is already right"
    assert not world.bus.since(mark, "model-status"), "the statuses the old leader published are still right"
    assert placements_of(world.bus.since(mark, "events")) == []
    world.agents.beat()
    assert world.agents.restarts[restarts:] == [] and world.agents.companion_restarts[companions:] == []
    assert world.model() == replicas
    assert new.takeover.loaded_s is not None and new.takeover.epoch == world.epoch

    # the rollout goes on under the new leader, to its end, one new-version replica at a time
    world.agents.hold.clear()
    if world.phase() == "Paused":
        entry, records = new.rollouts.driver.act("m", "resume", "alice")
        world.bus.publish(records)
        new.rollouts.driver.commit(entry)
    world.until("Complete", limit=120)
    world.turn(3)
    assert world.model() == {"m-0": NEW, "m-1": NEW}
    assert not [r for r in world.agents.restarts[restarts:] if "removed" in r and "m-2" not in r], \
        world.agents.restarts


def test_a_leader_killed_at_every_phase_of_one_rollout_never_restarts_a_worker_it_did_not_have_to():
    """One rollout, the leader SIGKILLed at each phase in turn (each new leader is killed at the next): the only
    worker restarts are the rollout's own (the surge replica's stop and each replica's switch to the new
    version), each exactly once."""
    world = World()
    world.turn(3)
    world.converge()
    world.agents.hold.add("m-2")
    world.begin()
    killed = []
    for _ in range(200):
        phase = world.phase()
        if phase == "Complete":
            break
        if phase not in killed:
            world.converge()
            before = world.by_node()
            new, mark = world.fail_over()
            world.clock.advance(1.0)
            world.agents.beat()
            new.step()
            assert world.by_node() == before, phase
            assert placements_of(world.bus.since(mark, "events")) == [], phase
            killed.append(phase)
            if phase == "Surging":
                world.agents.hold.clear()
            continue
        world.turn()
    assert world.phase() == "Complete" and killed == ["Pending", "Surging", "Canary", "Promoting", "Draining"], killed
    world.turn(3)
    assert world.model() == {"m-0": NEW, "m-1": NEW}
    assert sorted(world.agents.restarts) == ["m-0 on node-a: 1.0.0 -> 1.1.0", "m-1 on node-b: 1.0.0 -> 1.1.0",
                                             "m-2 on node-a: 1.1.0 -> removed"], world.agents.restarts


def test_a_new_leader_does_not_act_before_its_feeder_applied_what_the_old_leader_last_committed():
    """The old leader's last transaction (the surge replica's placement) is still on its way to the standby's
    feeder when the standby is elected: its passes wait (the reason says why) until the read barrier is
    reached, then change nothing."""
    world = World()
    world.turn(3)
    world.converge()
    world.agents.hold.add("m-2")
    world.bus.held[world.standby.name] = []  # from here the standby's feeder lags
    world.begin()
    world.turn()  # Pending -> Surging, the surge replica placed: nothing of it has reached the standby
    world.converge()
    assert "m-2" in world.model()
    before = world.by_node()
    new, mark = world.fail_over()
    for _ in range(3):
        world.clock.advance(1.0)
        report = new.step()
        assert report.skipped is not None and "reading the control topics to the end" in report.skipped, report
    assert not world.bus.since(mark, "assignments") and not world.bus.since(mark, "rollouts")
    new.feeder.release()
    report = new.step()
    assert report.skipped is None
    assert world.by_node() == before and placements_of(world.bus.since(mark, "events")) == []


def test_a_rollouts_read_that_fails_holds_the_new_leader_and_is_retried():
    world = World()
    world.turn(3)
    world.converge()
    world.agents.hold.add("m-2")
    world.begin()
    world.until("Surging")
    world.converge()
    before = world.by_node()
    reads = {"n": 0}
    real = world.standby.rollouts._reader

    def flaky(settings: Any) -> list[dict[str, Any]]:
        reads["n"] += 1
        if reads["n"] == 1:
            raise TimeoutError("rollouts: not read to its end within 15s")
        return real(settings)

    world.standby.rollouts._reader = flaky
    new, mark = world.fail_over()
    report = new.step()
    assert report.skipped is not None and "loading the rollouts" in report.skipped and "not read to its end" \
        in report.skipped, report.skipped
    assert not world.bus.since(mark, "assignments")
    report = new.step()
    assert report.skipped is None and world.by_node() == before


def test_a_leader_that_loses_and_wins_again_between_two_passes_reloads_the_rollouts():
    """Its driver's view is of its earlier term; the leader in between moved the rollout on.  The same epoch
    check the controller makes (a new term) reloads it before the next pass plans anything."""
    world = World()
    world.turn(3)
    world.converge()
    world.begin()
    world.until("Canary")
    first = world.leader
    step = world.leader.rollouts.driver.get("m").rollout.step
    # the other instance leads for a while and moves the rollout one step on
    first.lead.leader = False
    other = world.standby
    world.elect(other)
    world.leader, world.standby = other, first
    for _ in range(30):
        world.turn()
        if other.rollouts.driver.get("m").rollout.step != step:
            break
    moved = other.rollouts.driver.get("m").rollout
    assert moved.step != step or moved.phase != Phase.CANARY
    # ... and loses it again to the first one, which never ran a pass as a standby in between
    other.lead.leader = False
    world.elect(first)
    world.leader, world.standby = first, other
    first.step()
    assert first.rollouts.driver.get("m").rollout == moved


def test_the_traffic_director_replica_survives_a_failover():
    """The director's added replica is a floor under the count (``ModelStatus.director``): the new leader keeps
    it, and releases it by the same hysteresis, continued from the published cool-since."""
    director = DirectorPolicy(sustain_s=1, hold_s=10, restore_after_s=20)
    world = World(replicas=2, config=ControlConfig(node_timeout_s=6.0, director=director))
    record = spec_record("m", 4096, replicas=2, sla={"min_replicas": 2, "max_replicas": 3})
    world.bus.publish([OutRecord("specs", "m", "ModelSpecRecord", {**record, "deleted": False})])
    world.turn(3)
    world.converge()
    hot = {"m-0"}
    real_beat = world.agents.beat

    def beat() -> None:
        real_beat()
        # the replicas' load: GPU utilisation and scorer lag in each node's heartbeat
        for node in NODES:
            reps = [{"replica_id": rid, "model": rid.rsplit("-", 1)[0], "version": run[0], "state": "READY",
                     "lag": 400 if rid in hot else 3, "p99_ms": 900.0 if rid in hot else 30.0}
                    for (n, rid), run in sorted(world.agents.running.items()) if n == node]
            busy = any(r["replica_id"] in hot for r in reps)
            world.bus.publish([OutRecord("heartbeats", node, "Heartbeat", {
                "node": node, "ts_ms": int(world.clock() * 1000), "seq": 2,
                "gpus": [{**gpu(0, total=GPU_MB), "utilization_pct": 95.0 if busy else 20.0}], "replicas": reps})])

    world.agents.beat = beat  # type: ignore[method-assign]
    world.turn(4)
    assert set(world.model()) == {"m-0", "m-1", "m-2"}, world.model()
    status = decode_value(world.bus.latest("model-status")["m"])
    assert status["director"]["floor"] == 3 and status["desired_replicas"] == 3
    hot.clear()
    world.turn(5)  # every replica cool for a while: the cool-since is published with the status
    assert decode_value(world.bus.latest("model-status")["m"])["director"]["cool_since_ms"] is not None
    before, restarts = world.by_node(), len(world.agents.restarts)
    new, mark = world.fail_over()
    world.turn()
    assert world.by_node() == before and placements_of(world.bus.since(mark, "events")) == []
    assert world.agents.restarts[restarts:] == []
    assert new.ctl.director_extra["m"].floor == 3
    # released restore_after_s (20 s) after the replicas turned cool, about 5 s before the failover, as the old
    # leader would have: within 17 s of the failover (a new leader counting from its own start would take 20)
    world.turn(17)
    released = [e for e in world.bus.since(mark, "events") if e["kind"] == "director"]
    assert [e["detail"].split(":")[0] for e in released] == ["release_replica"]
    assert set(world.model()) == {"m-0", "m-1"}


def test_a_fresh_leader_keeps_the_cool_downs_and_unschedulable_reports_the_old_one_published():
    """A replica FAILED on one node and moved to the other: a standby started after the failure replays the
    FAILED report but, the replica no longer being on that node, builds no cool-down from it.  Leading, it takes
    the cool-down from the published status, so when the other node dies the replica is not put back on the node
    it crashed on; and it does not announce again what the old leader already reported unschedulable."""
    world = World(replicas=1)
    world.turn(3)
    world.converge()
    ((first, _),) = [(n, v) for n, v in world.bus.assignments().items() if v["replicas"]]
    other = next(n for n in NODES if n != first)
    world.agents.failed[(first, "m-0")] = "crashed 3 times within 300s: exit code 1"
    world.turn(2)
    assert [n for n, v in world.bus.assignments().items() if v["replicas"]] == [other]
    world.agents.failed.clear()
    world.fail_over()  # the warm standby leads; the killed one restarts fresh, after the FAILED report
    world.turn(2)
    assert ("m-0", first) not in world.standby.ctl.exclusions  # replayed, but m-0 is on the other node now
    new, mark = world.fail_over()
    world.turn()
    assert ("m-0", first) in new.ctl.exclusions
    assert not world.bus.since(mark, "model-status") and not world.bus.since(mark, "events")[1:]  # leader_elected
    world.agents.silent.add(other)
    world.turn(8)
    status = decode_value(world.bus.latest("model-status")["m"])
    (view,) = status["replicas"]
    assert view["state"] == "UNSCHEDULABLE" and f"FAILED on {first} (cool-down)" in view["reason"], view
    assert world.model() == {}, "the replica went back to the node it FAILED on within its cool-down"
    new, mark = world.fail_over()
    world.turn()
    assert [e["kind"] for e in world.bus.since(mark, "events")] == ["leader_elected"]
