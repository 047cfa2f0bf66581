"""Simulated agents for ``bench/bench_scale.py``: many nodes in one process, speaking the real agent protocol.

What one simulator process does, for its share of the nodes (every record built by the agent's own message
builders, ``sie.workers.agent.messages``, and the agent's own client configurations)::

    register every node (NodeRegistration: simulated GPUs, CPUs, host memory)
    read the assignments topic from the beginning, read_committed (one consumer for all its nodes: a real agent
      reads the same records, filtered by its own key), replay to the end before acting (as the agent does)
    loop:
        each node's latest Assignment (epoch not older than the newest seen) -> its desired replica set
        a new replica:     PENDING -> STARTING (0.05-0.2 s) -> READY (--start-s, default 1-3 s)
        removed / changed: DRAINING -> STOPPED (--drain-s) and forgotten; a changed target starts anew
        companions (a rollout's other version): reported "loading", then "ready" after --start-s
        every state change: a ReplicaStatus record (key = replica id)
        every --heartbeat-s per node (staggered): a Heartbeat with the GPUs (memory used by its replicas,
          as the agent reports simulated GPUs), host memory, and a ReplicaReport per replica

One idempotent producer and one consumer per process, whatever its node count: 200 real agents would hold 200 of
each (the broker's fetch fan-out of the assignments topic is 200x what the bench puts on it; the bench reports
the bytes one agent reads, docs/control-plane.md "Scale").

Commands from the bench (a ``multiprocessing`` pipe): ``kill NODE`` (the node dies: no heartbeat, no status, its
replicas gone, as an agent SIGKILL takes its workers), ``mark`` (zero the start/drain counters), ``stats``.
"""

from __future__ import annotations

import heapq
import json
import logging
import random
import resource
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("bench.scale.sim")

GPU_SPEC = "8xA100-80GB"
NODE_CPUS = 128
NODE_MEMORY_MB = 1024 * 1024


@dataclass(frozen=True)
class SimConfig:
    """What one simulator process runs (picklable: it crosses a process boundary)."""

    bootstrap: str
    prefix: str
    nodes: tuple[str, ...]
    index: int = 0
    heartbeat_s: float = 2.0
    start_s: tuple[float, float] = (1.0, 3.0)
    drain_s: tuple[float, float] = (0.3, 1.0)
    seed: int = 42
    extra_env: tuple[tuple[str, str], ...] = ()


@dataclass
class SimReplica:
    desired: Any  # sie.workers.replica.DesiredReplica
    state: Any  # ReplicaState
    pid: int | None = None
    restarts: int = 0
    reason: str = ""
    #: companion version -> {"state", "detail"} as the heartbeat reports it
    versions: dict[str, dict[str, str]] = field(default_factory=dict)
    #: companion version -> when it becomes ready
    companion_due: dict[str, float] = field(default_factory=dict)


@dataclass
class SimNode:
    name: str
    inventory: Any  # HostInventory
    alive: bool = True
    seq: int = 0
    next_heartbeat: float = 0.0
    epoch: int = -1
    #: wall-clock time of its latest heartbeat sent
    last_sent: float = 0.0
    replicas: dict[str, SimReplica] = field(default_factory=dict)
    #: replicas draining (old targets), by replica id: a changed target drains one while the new one starts
    retiring: dict[str, SimReplica] = field(default_factory=dict)


class Simulator:
    """The nodes of one process (module docstring).  ``step()`` is one loop pass; ``run()`` loops it."""

    def __init__(self, config: SimConfig) -> None:
        from sie.kernel.settings import Settings
        from sie.workers.gpu import HostInventory, parse_simulated_gpus

        self.config = config
        self.settings = Settings().with_overrides(bootstrap_servers=config.bootstrap, topic_prefix=config.prefix)
        self.rng = random.Random(config.seed + config.index)
        self.nodes: dict[str, SimNode] = {}
        for i, name in enumerate(config.nodes):
            gpus = tuple(parse_simulated_gpus(GPU_SPEC, node=name))
            inv = HostInventory(name, NODE_CPUS, NODE_MEMORY_MB, NODE_MEMORY_MB - 8192, gpus)
            # heartbeats staggered over the interval, as independently started agents are
            self.nodes[name] = SimNode(name, inv, next_heartbeat=time.monotonic() + config.heartbeat_s * i / max(1, len(config.nodes)))
        self._keys = {name.encode(): name for name in self.nodes}
        names = self.settings.names
        self.topics = {s: names.system_topic(s) for s in ("nodes", "heartbeats", "assignments", "replica-status")}
        #: (due, seq, node, replica id, kind) of the next state change of each replica
        self._due: list[tuple[float, int, str, str, str]] = []
        self._seq = 0
        self._pending: dict[str, dict[str, Any] | None] = {}
        self._replay_left: dict[int, int] = {}
        self.replaying = True
        self.counters = {"heartbeats": 0, "statuses": 0, "assignments": 0, "starts": 0, "drains": 0,
                         "bytes_out": 0, "assignment_bytes_in": 0, "old_epoch": 0}
        self._producer: Any = None
        self._consumer: Any = None

    # -- Kafka ---------------------------------------------------------------------------------------

    def open(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        from sie.kernel.clients import KafkaClients, idempotent_producer_config, state_reader_config

        names = self.settings.names
        client = f"sim-{self.config.index}"
        clients = KafkaClients()
        self._producer = clients.producer(idempotent_producer_config(self.settings, names.agent_client_id(client)))
        self._consumer = clients.consumer(state_reader_config(
            self.settings, names.agent_group(client), names.agent_client_id(client, "assignments"), partition_eof=True))
        topic = self.topics["assignments"]
        meta = self._consumer.list_topics(topic, timeout=10).topics[topic]
        parts = sorted(meta.partitions)
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        for p in parts:
            low, high = self._consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > low:
                self._replay_left[p] = high
        self.replaying = bool(self._replay_left)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
        if self._producer is not None:
            self._producer.flush(10)

    def _produce(self, topic: str, key: str, record_name: str, record: dict[str, Any]) -> None:
        from sie.schemas.avro_codec import encode

        value = encode(record_name, record)
        self.counters["bytes_out"] += len(value) + len(key)
        while True:
            try:
                self._producer.produce(self.topics[topic], key=key.encode(), value=value)
                return
            except BufferError:  # the local queue is full: let it drain (a real agent's produce blocks the same)
                self._producer.poll(0.05)

    def register(self) -> None:
        from sie.workers.agent import messages

        started = int(time.time() * 1000)
        for node in self.nodes.values():
            self._produce("nodes", node.name, "NodeRegistration",
                          messages.node_registration(node.name, {}, None, node.inventory, started))
        self._producer.flush(30)

    # -- the loop ------------------------------------------------------------------------------------

    def step(self, now: float) -> None:
        self._poll_assignments(now)
        self._advance(now)
        self._heartbeats(now)
        self._producer.poll(0)

    def _poll_assignments(self, now: float) -> None:
        from confluent_kafka import KafkaError

        from sie.schemas.avro_codec import decode

        for msg in self._consumer.consume(num_messages=500, timeout=0.02):
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    self._replay_left.pop(msg.partition(), None)
                continue
            left = self._replay_left.get(msg.partition())
            if left is not None and msg.offset() + 1 >= left:
                del self._replay_left[msg.partition()]
            value = msg.value()
            self.counters["assignment_bytes_in"] += len(value or b"")
            name = self._keys.get(msg.key())
            if name is None:
                continue
            self._pending[name] = decode(value) if value is not None else None
        if self.replaying and self._replay_left:
            return
        self.replaying = False
        pending, self._pending = self._pending, {}
        for name, record in pending.items():
            node = self.nodes[name]
            if not node.alive:
                continue
            if record is not None:
                epoch = int(record.get("epoch", 0))
                if epoch < node.epoch:
                    self.counters["old_epoch"] += 1
                    continue
                node.epoch = epoch
            self._set_desired(node, record, now)

    def _set_desired(self, node: SimNode, record: dict[str, Any] | None, now: float) -> None:
        """The supervisor's ``set_desired`` on simulated processes: new -> start, gone or changed -> drain."""
        from sie.schemas.replica_state import ReplicaState
        from sie.workers.agent import messages

        self.counters["assignments"] += 1
        desired = {d.replica_id: d for d in (messages.desired_from_assignment(record) if record else [])}
        for rid, actual in list(node.replicas.items()):
            want = desired.get(rid)
            if want is None or want.target_hash != actual.desired.target_hash:
                del node.replicas[rid]
                self._drain(node, actual, now)
            elif want != actual.desired:  # same process target: new epoch or companions
                actual.desired = want
                self._companions(node, actual, now)
        for rid, want in desired.items():
            if rid not in node.replicas:
                actual = SimReplica(want, ReplicaState.PENDING, reason="assigned")
                node.replicas[rid] = actual
                self.counters["starts"] += 1
                self._status(node, actual)
                self._schedule(now + self.rng.uniform(0.05, 0.2), node.name, rid, "launch")
                self._companions(node, actual, now)

    def _companions(self, node: SimNode, actual: SimReplica, now: float) -> None:
        """A rollout's other version: "loading" until it is ready (the worker's report), dropped when gone."""
        wanted = set()
        for text in actual.desired.companions:
            try:
                wanted.add(str(json.loads(text)["version"]))
            except (ValueError, KeyError, TypeError):
                continue
        for version in list(actual.versions):
            if version not in wanted:
                del actual.versions[version]
                actual.companion_due.pop(version, None)
        for version in wanted - set(actual.versions):
            actual.versions[version] = {"state": "loading", "detail": ""}
            due = now + self.rng.uniform(*self.config.start_s)
            actual.companion_due[version] = due
            self._schedule(due, node.name, actual.desired.replica_id, "companion")

    def _drain(self, node: SimNode, actual: SimReplica, now: float) -> None:
        from sie.schemas.replica_state import ReplicaState

        self.counters["drains"] += 1
        if actual.state in (ReplicaState.PENDING,):
            self._transition(node, actual, ReplicaState.STOPPED)
            return
        self._transition(node, actual, ReplicaState.DRAINING)
        node.retiring[actual.desired.replica_id + "#" + actual.desired.target_hash] = actual
        self._schedule(now + self.rng.uniform(*self.config.drain_s), node.name,
                       actual.desired.replica_id + "#" + actual.desired.target_hash, "stopped")

    def _schedule(self, due: float, node: str, rid: str, kind: str) -> None:
        self._seq += 1
        heapq.heappush(self._due, (due, self._seq, node, rid, kind))

    def _advance(self, now: float) -> None:
        from sie.schemas.replica_state import ReplicaState

        while self._due and self._due[0][0] <= now:
            _due, _seq, name, rid, kind = heapq.heappop(self._due)
            node = self.nodes[name]
            if not node.alive:
                continue
            if kind == "stopped":
                actual = node.retiring.pop(rid, None)
                if actual is not None:
                    self._transition(node, actual, ReplicaState.STOPPED)
                continue
            actual = node.replicas.get(rid)
            if actual is None:
                continue
            if kind == "launch" and actual.state == ReplicaState.PENDING:
                actual.pid = 100000 + self.rng.randrange(800000)
                actual.reason = ""
                self._transition(node, actual, ReplicaState.STARTING)
                self._schedule(now + self.rng.uniform(*self.config.start_s), name, rid, "ready")
            elif kind == "ready" and actual.state == ReplicaState.STARTING:
                self._transition(node, actual, ReplicaState.READY)
            elif kind == "companion":
                for version, due in list(actual.companion_due.items()):
                    if due <= now and version in actual.versions:
                        actual.versions[version] = {"state": "ready", "detail": ""}
                        del actual.companion_due[version]

    def _transition(self, node: SimNode, actual: SimReplica, state: Any) -> None:
        from sie.schemas.replica_state import check_transition

        check_transition(actual.state, state, actual.desired.replica_id)
        actual.state = state
        self._status(node, actual)

    def _snapshot(self, actual: SimReplica) -> Any:
        from sie.workers.supervisor import ReplicaSnapshot

        d = actual.desired
        return ReplicaSnapshot(d.replica_id, d.model, d.version, actual.state, actual.pid, actual.restarts, 0,
                               actual.reason, None, None, d.target_hash, d.gpu_indices,
                               versions=dict(actual.versions))

    def _status(self, node: SimNode, actual: SimReplica) -> None:
        from sie.workers.agent import messages

        self.counters["statuses"] += 1
        self._produce("replica-status", actual.desired.replica_id, "ReplicaStatus",
                      messages.replica_status(node.name, self._snapshot(actual), int(time.time() * 1000)))

    def _heartbeats(self, now: float) -> None:
        from dataclasses import replace

        from sie.workers.agent import messages

        for node in self.nodes.values():
            if not node.alive or now < node.next_heartbeat:
                continue
            node.next_heartbeat = now + self.config.heartbeat_s
            node.seq += 1
            replicas = [*node.replicas.values(), *node.retiring.values()]
            used: dict[int, int] = {}
            for r in replicas:  # simulated GPUs report the budgets of the replicas running on them as used
                if r.state.has_process:
                    for i in r.desired.gpu_indices:
                        used[i] = used.get(i, 0) + r.desired.gpu_memory_mb
            gpus = [replace(g, memory_used_mb=min(g.memory_total_mb, used.get(g.index, 0)),
                            memory_free_mb=max(0, g.memory_total_mb - used.get(g.index, 0)))
                    for g in node.inventory.gpus]
            record = messages.heartbeat(node.name, node.seq, int(time.time() * 1000), gpus,
                                        [self._snapshot(r) for r in replicas],
                                        memory_total_mb=node.inventory.memory_mb,
                                        memory_available_mb=node.inventory.memory_available_mb)
            self._produce("heartbeats", node.name, "Heartbeat", record)
            node.last_sent = time.time()
            self.counters["heartbeats"] += 1

    # -- commands ------------------------------------------------------------------------------------

    def kill(self, name: str) -> float:
        """The node dies (its agent and workers gone): returns when its last heartbeat was sent (wall clock)."""
        node = self.nodes[name]
        node.alive = False
        node.replicas.clear()
        node.retiring.clear()
        return node.last_sent

    def stats(self) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        replicas = [r for n in self.nodes.values() for r in n.replicas.values()]
        return {**self.counters, "cpu_s": usage.ru_utime + usage.ru_stime, "replicas": len(replicas),
                "ready": sum(1 for r in replicas if r.state.value == "READY"), "replaying": self.replaying,
                "rss_mb": usage.ru_maxrss / 1024}


def sim_main(config: SimConfig, conn: Any, stop: Any) -> None:
    """A simulator process: register, then loop until ``stop`` is set, answering the bench's commands."""
    import os

    for key, value in config.extra_env:
        os.environ[key] = value
    logging.basicConfig(level=logging.WARNING, format=f"sim-{config.index} %(levelname)s %(name)s: %(message)s")
    sim = Simulator(config)
    for attempt in range(12):  # a topic just created may not have its leader yet (NOT_LEADER_FOR_PARTITION)
        try:
            sim.open()
            break
        except Exception as exc:  # noqa: BLE001 - a start-up race, retried as a supervisor restarts an agent
            if attempt == 11:
                raise
            logging.getLogger("bench.scale.sim").warning("opening the simulator failed (%s); again in 5 s", exc)
            sim.close()
            sim = Simulator(config)
            time.sleep(5)
    sim.register()
    conn.send(("ready", sim.stats()))
    try:
        while not stop.is_set():
            now = time.monotonic()
            sim.step(now)
            while conn.poll(0):
                cmd, arg = conn.recv()
                if cmd == "kill":
                    conn.send(("killed", sim.kill(arg)))
                elif cmd == "mark":
                    sim.counters["starts"] = sim.counters["drains"] = 0
                    conn.send(("marked", None))
                elif cmd == "stats":
                    conn.send(("stats", sim.stats()))
    finally:
        sim.close()
