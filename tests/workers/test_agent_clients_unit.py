"""The node agent's loop against fake Kafka clients, a fake process launcher and a fake clock (no broker).

What the agent does with Kafka: register, follow the newest assignment of its own node, publish each replica
state change and heartbeat on schedule.  The supervisor's own state machine is tested in test_agent_unit.py;
the same flow on a real broker with real workers in test_agent_kafka.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING

from sie.kernel.settings import Settings
from sie.schemas.avro_codec import decode, encode
from sie.schemas.replica_template import template_from_json
from sie.workers.agent import Agent, AgentConfig
from sie.workers.gpu import host_inventory, parse_simulated_gpus
from sie.workers.supervisor import SupervisorPolicy
from tests.fakes.kafka_clients import FakeClients, FakeConsumer, FakeMessage, FakeProducer, fake_clients
from tests.fakes.workers import FakeClock, FakeLauncher
from tests.support.helpers import wait_until
from tests.support.scorer_fixtures import echo_spec

NODE = "n1"
SETTINGS = Settings(allowed_modules=["tests.support.scorer_fixtures"])  # the echo test model may run here


def spec_json(replica_id: str) -> str:
    """A real (echo) ModelService document: the agent checks every spec against its policy before launching."""
    return json.dumps(echo_spec(name=replica_id.replace("_", "-")).to_document(), sort_keys=True)
ASSIGNMENTS = SETTINGS.names.system_topic("assignments")
HEARTBEAT_S = 2.0


@dataclass
class World:
    agent: Agent
    consumer: FakeConsumer
    producer: FakeProducer
    clients: FakeClients
    launcher: FakeLauncher
    clock: FakeClock
    stop: threading.Event
    thread: threading.Thread
    offsets: dict[int, int]

    # -- driving -------------------------------------------------------------------------------------
    def assign(self, node: str, epoch: int, replica_ids: list[str], partition: int = 0) -> None:
        record = {"node": node, "epoch": epoch, "issued_at_ms": 0, "replicas": [
            {"replica_id": rid, "model": "m", "version": "1.0.0", "gpu_indices": [0], "gpu_memory_mb": 1024,
             "spec_json": spec_json(rid)} for rid in replica_ids]}
        self._append(node, encode("Assignment", record), partition)

    def tombstone(self, node: str, partition: int = 0) -> None:
        self._append(node, None, partition)

    def _append(self, node: str, value: bytes | None, partition: int) -> None:
        offset = self.offsets.get(partition, 0)
        self.offsets[partition] = offset + 1
        self.consumer.append(FakeMessage(ASSIGNMENTS, partition, offset, node.encode(), value))

    def settle(self) -> None:
        """Until every loop pass that could see what was appended so far has finished: one pass consumes
        once, so two more consume calls mean the pass that took the records has supervised and reported."""
        seen = len(self.consumer.called("consume"))
        wait_until(lambda: len(self.consumer.called("consume")) >= seen + 2, message="two agent loop passes")

    # -- what it published ---------------------------------------------------------------------------
    def records(self, suffix: str) -> list[tuple[bytes | None, dict[str, Any]]]:
        topic = SETTINGS.names.system_topic(suffix)
        return [(r.key, decode(r.value)) for r in self.producer.visible if r.topic == topic]

    def statuses(self, replica_id: str | None = None) -> list[tuple[str, str]]:
        return [(rec["replica_id"], rec["state"]) for _k, rec in self.records("replica-status")
                if replica_id is None or rec["replica_id"] == replica_id]


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[Callable[..., World]]:
    """``start_agent(consumer)``: an agent on its own thread over ``consumer`` (default: 3 empty partitions)."""
    made: list[World] = []

    def start(consumer: FakeConsumer | None = None, offsets: dict[int, int] | None = None) -> World:
        consumer = consumer or FakeConsumer(partitions={ASSIGNMENTS: 3})
        producer = FakeProducer()
        clients = fake_clients(consumer=consumer, producer=producer)
        launcher, clock = FakeLauncher(exit_on_term=True), FakeClock()
        config = AgentConfig(node=NODE, labels={"zone": "a"}, tier="tier-1", simulate_gpus="1xL4",
                             heartbeat_s=HEARTBEAT_S, work_dir=tmp_path, loop_interval_s=0.01,
                             policy=SupervisorPolicy(startup_timeout_s=60, liveness_timeout_s=60, drain_grace_s=5))
        agent = Agent(config, SETTINGS, launcher=launcher, clock=clock, clients=clients.clients,
                      inventory_probe=lambda: host_inventory(probe=lambda: parse_simulated_gpus("1xL4", node=NODE)))
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,), name="agent-under-test", daemon=True)
        thread.start()
        w = World(agent, consumer, producer, clients, launcher, clock, stop, thread, dict(offsets or {}))
        made.append(w)
        wait_until(agent.ready.is_set, message="agent registered")
        return w

    yield start
    for w in made:
        w.stop.set()
        w.thread.join(10)
        assert not w.thread.is_alive(), "the agent did not stop"


@pytest.fixture
def world(start_agent: Callable[..., World]) -> World:
    return start_agent()


def test_registers_once_then_reads_every_assignment_partition_from_the_beginning_without_a_group(world: World):
    (key, reg), = world.records("nodes")
    assert key == NODE.encode()
    assert (reg["node"], reg["labels"], reg["tier"], reg["simulated"]) == (NODE, {"zone": "a"}, "tier-1", True)
    assert [g["product"] for g in reg["gpus"]] == ["NVIDIA L4-24GB (simulated)"]
    assert world.producer.called("flush"), "registration must be flushed before the agent reports ready"

    (assigned,) = [c.args[0] for c in world.consumer.called("assign")]
    assert assigned == [(ASSIGNMENTS, p, OFFSET_BEGINNING) for p in range(3)]
    assert not world.consumer.called("subscribe")  # no consumer group: no rebalance, no committed offset to lose
    (consumer_cfg,) = world.clients.of("consumer")
    assert consumer_cfg["isolation.level"] == "read_committed"  # only the leader's committed assignments
    assert consumer_cfg["enable.auto.commit"] is False
    assert consumer_cfg["client.id"] == f"{SETTINGS.names.agent_client_id(NODE)}.assignments"
    (producer_cfg,) = world.clients.of("producer")
    assert producer_cfg["enable.idempotence"] is True and "transactional.id" not in producer_cfg


def test_follows_the_newest_assignment_of_its_node_only(world: World):
    world.assign("other-node", 9, ["x-0"], partition=1)
    world.assign(NODE, 3, ["a-0"], partition=0)
    world.assign(NODE, 2, ["stale-0"], partition=0)  # a deposed leader's record, read after the newer one
    world.settle()
    assert {h.spec.name for h in world.launcher.started} == {"a-0"}
    assert world.statuses() == [("a-0", "PENDING"), ("a-0", "STARTING")]

    world.assign(NODE, 4, ["a-0", "b-0"], partition=2)
    wait_until(lambda: ("b-0", "STARTING") in world.statuses(), message="b-0 started")
    world.settle()
    assert sorted(h.spec.name for h in world.launcher.started) == ["a-0", "b-0"]
    assert world.launcher.started[0].signals == []  # a-0 is still desired: left alone
    # the worker got the assignment's spec and GPU
    spec_file = Path(world.launcher.started[1].spec.argv[world.launcher.started[1].spec.argv.index("--spec-file") + 1])
    # the assignment carries the whole spec (a control plane before Assignment v3): the worker runs its template
    assert json.loads(spec_file.read_text()) == json.loads(template_from_json(spec_json("b-0")).json)
    assert world.launcher.started[1].spec.env["CUDA_VISIBLE_DEVICES"] == ""  # simulated GPUs: CUDA hidden


def test_a_tombstone_for_its_node_drains_every_replica(world: World):
    world.assign(NODE, 1, ["a-0"])
    wait_until(lambda: world.launcher.started, message="a-0 launched")
    world.launcher.last.emit(event="ready")
    wait_until(lambda: ("a-0", "READY") in world.statuses(), message="a-0 READY")

    world.tombstone("other-node", partition=1)
    world.settle()
    assert world.launcher.last.signals == []  # another node's tombstone changes nothing here

    world.tombstone(NODE)
    wait_until(lambda: ("a-0", "STOPPED") in world.statuses(), message="a-0 drained")
    assert world.launcher.last.signals == ["TERM"]
    assert world.statuses("a-0") == [("a-0", s) for s in ("PENDING", "STARTING", "READY", "DRAINING", "STOPPED")]


def test_each_transition_is_published_once_and_heartbeats_follow_the_clock(world: World):
    world.assign(NODE, 1, ["a-0"])
    wait_until(lambda: world.launcher.started, message="a-0 launched")
    world.launcher.last.emit(event="ready")
    wait_until(lambda: ("a-0", "READY") in world.statuses(), message="a-0 READY")
    world.settle()
    assert world.statuses() == [("a-0", "PENDING"), ("a-0", "STARTING"), ("a-0", "READY")]  # quiet passes: nothing
    keys = {k for k, _rec in world.records("replica-status")}
    assert keys == {b"a-0"}  # keyed by replica id: compaction keeps each replica's latest state

    (first,) = world.records("heartbeats")  # the first pass heartbeats; the clock has not moved since
    assert first[0] == NODE.encode() and first[1]["seq"] == 1
    world.clock.advance(HEARTBEAT_S - 0.5)
    world.settle()
    assert len(world.records("heartbeats")) == 1

    world.clock.advance(0.5)
    wait_until(lambda: len(world.records("heartbeats")) == 2, message="the second heartbeat")
    _key, second = world.records("heartbeats")[1]
    assert second["seq"] == 2
    assert [(r["replica_id"], r["state"]) for r in second["replicas"]] == [("a-0", "READY")]
    # the process hosting it (a worker of its own: its pid) and the node's host memory (/proc/meminfo)
    assert second["replicas"][0]["process"] == f"pid-{world.launcher.last.pid}"
    assert second["memory_total_mb"] > 0 and 0 <= second["memory_available_mb"] <= second["memory_total_mb"]
    assert second["shared_process_slots"] == 0
    assert [g["memory_used_mb"] for g in second["gpus"]] == [1024]  # simulated GPU: the replica's budget is used
    world.settle()
    assert len(world.records("heartbeats")) == 2


def test_stopping_drains_publishes_stopped_and_closes_the_clients(world: World):
    world.assign(NODE, 1, ["a-0"])
    wait_until(lambda: ("a-0", "STARTING") in world.statuses(), message="a-0 starting")
    world.stop.set()
    world.thread.join(10)
    assert not world.thread.is_alive()
    assert world.statuses("a-0")[-2:] == [("a-0", "DRAINING"), ("a-0", "STOPPED")]
    assert world.records("heartbeats")[-1][1]["replicas"] == []  # the last heartbeat says nothing runs
    assert world.consumer.closed
    last_flush = world.producer.called("flush")[-1].seq
    assert all(c.seq < last_flush for c in world.producer.called("produce"))  # flushed after the last record


def assignment(node: str, epoch: int, replica_ids: list[str]) -> bytes:
    return encode("Assignment", {"node": node, "epoch": epoch, "issued_at_ms": 0, "replicas": [
        {"replica_id": rid, "model": "m", "version": "1.0.0", "gpu_indices": [0], "gpu_memory_mb": 1024,
         "spec_json": json.dumps({"replica": rid})} for rid in replica_ids]})


def test_a_restarted_agent_acts_on_no_assignment_before_it_read_the_topic_to_its_end(start_agent):
    """Issue 9, case 9: the compacted topic still holds an older record of this node; acting on it launched
    replicas that the newer record, read moments later, drained again."""
    consumer = FakeConsumer([FakeMessage(ASSIGNMENTS, 0, 0, NODE.encode(), assignment(NODE, 1, ["stale-0"]))],
                            partitions={ASSIGNMENTS: 3})
    consumer.set_watermarks(ASSIGNMENTS, 0, high=2)  # the newer record is in Kafka, not fetched yet
    world = start_agent(consumer, offsets={0: 1})
    world.settle()
    assert world.launcher.started == [] and world.statuses() == []
    assert world.records("heartbeats")  # it heartbeats meanwhile: alive, running nothing yet
    assert world.agent.replaying

    world.assign(NODE, 2, ["a-0"], partition=0)
    wait_until(lambda: world.launcher.started, message="the newest assignment acted on")
    world.settle()
    assert not world.agent.replaying
    assert [h.spec.name for h in world.launcher.started] == ["a-0"]  # stale-0 never ran
    assert {rid for rid, _state in world.statuses()} == {"a-0"}


def test_a_tombstone_read_during_the_replay_wins_over_the_record_before_it(start_agent):
    consumer = FakeConsumer([FakeMessage(ASSIGNMENTS, 1, 0, NODE.encode(), assignment(NODE, 1, ["gone-0"])),
                             FakeMessage(ASSIGNMENTS, 1, 1, NODE.encode(), None)], partitions={ASSIGNMENTS: 3})
    world = start_agent(consumer, offsets={1: 2})
    world.settle()
    assert not world.agent.replaying and world.launcher.started == []
    world.assign(NODE, 3, ["b-0"], partition=1)
    wait_until(lambda: world.launcher.started, message="the next assignment acted on at once")
    assert [h.spec.name for h in world.launcher.started] == ["b-0"]
