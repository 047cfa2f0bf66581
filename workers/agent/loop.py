"""The node agent: register, follow this node's assignment, supervise workers, heartbeat, report.

One loop, in the thread that called ``run()`` (it must stay alive as long as the
workers: PR_SET_PDEATHSIG fires when the spawning thread exits):

    1. consume ``assignments`` (all partitions, from the beginning), keep the
       latest record whose key is this node and whose epoch is not older than
       the newest seen; hand its full replica set to the supervisor
       (level-triggered: a duplicate or replay changes nothing).  Nothing is
       handed over before the topic was read to the end it had when the agent
       started (REPLAY): the compacted topic may still hold older records of this
       node, and acting on one would launch replicas that the newer record,
       moments later, drains again (a restart storm at every agent restart);
    2. ``supervisor.update()``: each replica moves one step; every state change
       is published on ``replica-status`` (key = replica id);
    3. every ``heartbeat_s``: a Heartbeat (GPU metrics + a ReplicaReport per
       replica, the warm pool's size and memory) on ``heartbeats`` (key = node)
       and the /metrics gauges;
    4. the warm pool (``--warm-pool N``, ``sie.workers.warm_pool``): keep N
       workers with the runtime imported; a launch takes one instead of
       starting a process (from this same thread: PR_SET_PDEATHSIG).

Each subsystem runs in its own try/except: a broker hiccup while heartbeating
does not stop supervision, and failures are counted in
``sie_agent_loop_errors_total``.  On stop (SIGTERM/SIGINT to ``sie agent``) the
agent drains every worker (SIGTERM -> the scorer commits its batch and leaves
the group) and publishes their STOPPED status before exiting.  If the agent is
SIGKILLed instead, the kernel kills its workers (node loss) and a restarted
agent starts them afresh from the assignment.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sie.kernel.clients import KafkaClients, idempotent_producer_config, state_reader_config
from sie.kernel.replay import ReadProgress, watermarks
from sie.kernel.settings import Settings
from sie.kernel.startup import Readiness, retry_until_answered, wait_for_kafka
from sie.schemas.spec_policy import SpecPolicy
from sie.workers.agent import messages
from sie.workers.agent.artifacts import ArtifactFetcher
from sie.workers.agent.companions import Companions
from sie.workers.agent.launch import MetricsPorts, WorkerCommandBuilder
from sie.workers.agent.shared import SharedLauncher, SharedProcesses, live_process_ids
from sie.workers.metrics import AgentMetrics
from sie.workers.process import ProcessLauncher, SubprocessLauncher
from sie.workers.supervisor import Clock, MonotonicClock, ReplicaSnapshot, Supervisor, SupervisorPolicy
from sie.workers.worker_user import WorkerUser, check_can_switch, own_folder

log = logging.getLogger("sie.agent")


@dataclass(frozen=True)
class AgentConfig:
    """One node agent's configuration (``sie agent`` options)."""

    node: str
    labels: Mapping[str, str] = field(default_factory=dict)
    tier: str | None = None
    simulate_gpus: str | None = None
    heartbeat_s: float = 2.0
    metrics_port: int | None = None
    #: the workers' /metrics ports: "0" any free one (reported by the worker), "A-B" a range, "off"
    worker_metrics_ports: str = "0"
    #: None: ``<settings.cache_dir>/agent``
    work_dir: Path | None = None
    policy: SupervisorPolicy = field(default_factory=SupervisorPolicy)
    #: longest time one loop pass waits for assignment records (bounds reaction time to worker events)
    loop_interval_s: float = 0.1
    worker_progress_interval_s: float = 1.0
    #: extra time after the drain grace for workers to exit when the agent stops
    shutdown_extra_s: float = 5.0
    #: pre-started workers (runtime imported) a launch can take instead of a cold start; 0 = none
    warm_pool: int = 0
    #: a taken pool worker is replaced this long after (its import would compete with the replica's start)
    warm_pool_refill_s: float = 3.0

    def __post_init__(self) -> None:
        from sie.kernel.names import check_node_name

        check_node_name(self.node, "sie agent --node")  # a Kafka key and a folder: refused now, by its rule

    def node_work_dir(self, settings: Settings) -> Path:
        return (self.work_dir or settings.cache_dir / "agent") / self.node


def _now_ms() -> int:
    return int(time.time() * 1000)


class Agent:
    """Collaborators are passed in (no god object): settings, launcher, clock, inventory probe."""

    def __init__(
        self,
        config: AgentConfig,
        settings: Settings,
        launcher: ProcessLauncher | None = None,
        clock: Clock | None = None,
        inventory_probe: Callable[[], Any] | None = None,
        clients: KafkaClients | None = None,
    ) -> None:
        from sie.workers.gpu import host_inventory, parse_simulated_gpus, probe_gpus

        self.config = config
        self.settings = settings
        self._clients = clients or KafkaClients()
        self._clock = clock or MonotonicClock()
        if inventory_probe is None:
            # simulated GPU UUIDs embed the NODE name: two agents on one machine never share a GPU uuid
            simulated = config.simulate_gpus
            gpus = (lambda: parse_simulated_gpus(simulated, node=config.node)) if simulated else probe_gpus
            inventory_probe = lambda: host_inventory(probe=gpus)  # noqa: E731
        self._probe = inventory_probe
        self.inventory = self._probe()
        policy = SpecPolicy.from_settings(settings)
        #: artifacts named by content, fetched (from the artifacts topic or a URI) and verified in the background
        self.artifacts = ArtifactFetcher(settings, policy, group_id=settings.names.agent_group(config.node),
                                         clients=self._clients)
        #: the uid workers run as (SIE_WORKER_UID): refused at start when this agent cannot switch to it
        self.worker_user = WorkerUser.from_settings(settings)
        if self.worker_user is not None and launcher is None:
            check_can_switch(self.worker_user)
            own_folder(settings.artifact_cache_dir)
        self.commands = WorkerCommandBuilder(
            config.node_work_dir(settings),
            progress_interval_s=config.worker_progress_interval_s,
            real_gpus=not config.simulate_gpus,
            settings=settings,
            spec_policy=policy,
            artifacts=self.artifacts,
            metrics_ports=MetricsPorts(config.worker_metrics_ports),
            live_replicas=self._live_ids,
            shared_processes=settings.shared_processes,
            worker_user=self.worker_user,
        )
        #: where Prometheus reaches this node's /metrics endpoints (the control plane's service discovery)
        self.advertise_host = settings.metrics_host
        from sie.workers.warm_pool import PooledLauncher, WarmPool

        self.pool: WarmPool | None = None
        real_launcher = launcher is None
        launcher = launcher or SubprocessLauncher(user=self.worker_user)
        if config.warm_pool > 0:
            env = {**self.commands.base_env, "PYTHONUNBUFFERED": "1"}
            self.pool = WarmPool(config.warm_pool, env, config.node_work_dir(settings) / "warm-pool",
                                 python=self.commands.python, clock=self._clock,
                                 launcher=SubprocessLauncher(keep_stdin=True, user=self.worker_user)
                                 if real_launcher else None,
                                 refill_delay_s=config.warm_pool_refill_s)
            launcher = PooledLauncher(self.pool, launcher)
        #: shared multi-model worker processes (``SIE_SHARED_PROCESSES`` > 0): small models' replicas go there
        self.shared: SharedProcesses | None = None
        if settings.shared_processes > 0:
            ports = self.commands.metrics_ports
            self.shared = SharedProcesses(
                settings.shared_processes, config.node_work_dir(settings), self.commands.python,
                {**self.commands.base_env, "PYTHONUNBUFFERED": "1",
                 **({"CUDA_VISIBLE_DEVICES": ""} if config.simulate_gpus else {})},
                metrics_port=lambda pid: ports.port_for(pid, self._live_ids()),
                launcher=SubprocessLauncher(user=self.worker_user) if real_launcher else None,
                clock=self._clock.monotonic)
            launcher = SharedLauncher(self.shared, launcher)
        # real GPUs: a replica waits for GPU memory still held by a draining one (simulated GPUs hold nothing)
        capacity = None if config.simulate_gpus else {g.index: g.memory_total_mb for g in self.inventory.gpus}
        self.supervisor = Supervisor(launcher, self.commands, self._clock, config.policy, gpu_capacity_mb=capacity)
        #: a rollout's other version, prepared for each replica that serves it (``sie.workers.agent.companions``)
        self.companions = Companions(self.commands, clock=self._clock.monotonic)
        self.metrics = AgentMetrics(config.node)
        self.metrics_port: int | None = None
        #: the HTTP port of /metrics and the replicas' logs (``sie.workers.agent.http``), when --metrics-port is set
        self.http: Any = None
        self._topics = {
            name: settings.names.system_topic(name) for name in ("nodes", "heartbeats", "assignments", "replica-status")
        }
        self._producer: Any = None
        self._consumer: Any = None
        self._epoch = -1
        #: partition -> end offset still to reach before acting on assignments (empty: replay done)
        self._replay: ReadProgress = ReadProgress({})
        self._replaying = True
        self._replay_started = 0.0
        self._replay_logged = 0.0
        #: the newest record for this node not handed to the supervisor yet: ("assign", record) / ("tombstone", None)
        self._unapplied: tuple[str, dict[str, Any] | None] | None = None
        self._seq = 0
        self._next_heartbeat = 0.0
        self._started_at_ms = _now_ms()
        self.ready = threading.Event()  # set once registered and consuming (tests wait on it)
        #: what /readyz says (sie.kernel.startup): waiting for Kafka or its topics, then ready
        self.readiness = Readiness("agent")

    def _live_ids(self) -> list[str]:
        """Replicas with a process and running shared processes: their /metrics ports stay taken."""
        live = [r.replica_id for r in self.supervisor.table.all() if r.state.has_process]
        return live + list(live_process_ids(self.shared))

    # -- lifecycle -------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set, then drain every worker and return.

        Started before Kafka or its topics exist (every pod of a release starts at once), it waits for
        them with bounded backoff, saying what it waits for (``sie.kernel.startup``), instead of exiting."""
        try:
            if not self._open(stop):
                return
            if self.config.metrics_port is not None:
                from sie.control.api.auth import TokenStore
                from sie.workers.agent.http import AgentHttp

                # /metrics, and the replicas' logs behind an API token (what `sie logs --control-url` reads)
                self.http = AgentHttp(self.config.node, self.config.node_work_dir(self.settings), self.metrics.render,
                                      TokenStore(self.settings))
                self.metrics_port = self.http.start(self.config.metrics_port, self.settings.metrics_bind)
                log.info("agent %s: /metrics and replica logs on port %s", self.config.node, self.metrics_port)
            self._register()
            self.ready.set()
            self.readiness.set_ready(f"node {self.config.node} registered, following its assignments")
            while not stop.is_set():
                self.run_once()
            self._shutdown()
        finally:
            self.artifacts.close()
            self._close()

    def run_once(self) -> None:
        """One pass: assignments, supervision, heartbeat (each isolated)."""
        self._guard("assignments", self._poll_assignments)
        self._guard("supervisor", self._supervise)
        self._guard("companions", lambda: self.companions.reconcile(self.supervisor.table.all()))
        if self.pool is not None:
            self._guard("warm_pool", self.pool.maintain)
        if self.shared is not None:
            self._guard("shared_processes", self.shared.maintain)
        if self._clock.monotonic() >= self._next_heartbeat:
            self._next_heartbeat = self._clock.monotonic() + self.config.heartbeat_s
            self._guard("heartbeat", self._heartbeat)
        self._guard("producer", lambda: self._producer.poll(0))

    def _guard(self, subsystem: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception:
            log.exception("agent %s: %s pass failed", self.config.node, subsystem)
            self.metrics.loop_errors.labels(self.config.node, subsystem).inc()

    # -- Kafka -----------------------------------------------------------------------
    def _open(self, stop: threading.Event) -> bool:
        """Clients, and the assignments topic assigned from its beginning; False if stopped while waiting for
        Kafka or the topic (``sie.kernel.startup``: bounded backoff, /readyz says what it waits for)."""
        from confluent_kafka import TopicPartition

        node = self.config.node
        names = self.settings.names
        # idempotent: retries never duplicate a status change
        self._producer = self._clients.producer(idempotent_producer_config(self.settings, names.agent_client_id(node)))
        # No consumer group: every agent reads the whole (compacted) topic itself and filters by key,
        # so there is no rebalance and no committed offset to lose; a restart re-reads the latest state.
        # only committed assignments (the leader publishes transactionally); the group is never joined.
        # End-of-partition events mark the end of the replay even when the log ends on transaction markers.
        self._consumer = self._clients.consumer(state_reader_config(
            self.settings, names.agent_group(node), names.agent_client_id(node, "assignments"), partition_eof=True))
        topic = self._topics["assignments"]
        consumer = self._consumer
        if not wait_for_kafka(self.settings, [topic], self.readiness, stop,
                              metadata=lambda: consumer.list_topics(topic, timeout=5)):
            return False
        info = consumer.list_topics(topic, timeout=10).topics[topic]
        from confluent_kafka import OFFSET_BEGINNING

        partitions = sorted(info.partitions)
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        # the replay's end: what the topic holds now (read_committed: the last stable offset); a topic created a
        # moment ago may still refuse the read (NOT_LEADER_FOR_PARTITION): retried, not the end of the agent
        marks = retry_until_answered(lambda: watermarks(consumer, [(topic, p) for p in partitions], timeout_s=0),
                                     f"the end of {topic}", self.readiness, stop)
        if marks is None:
            return False
        self._replay = ReadProgress.from_beginning(marks)
        self._replaying = True
        self._replay_started = self._replay_logged = self._clock.monotonic()
        return True

    def _close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
        if self._producer is not None:
            remaining = self._producer.flush(10)
            if remaining:
                log.warning("agent %s: %d status records not delivered at exit", self.config.node, remaining)

    def _produce(self, topic_name: str, key: str, record_name: str, record: dict[str, Any]) -> None:
        from sie.schemas.avro_codec import encode

        self._producer.produce(self._topics[topic_name], key=key.encode(), value=encode(record_name, record))

    # -- steps -----------------------------------------------------------------------
    def _register(self) -> None:
        cfg = self.config
        record = messages.node_registration(cfg.node, cfg.labels, cfg.tier, self.inventory, self._started_at_ms)
        self._produce("nodes", cfg.node, "NodeRegistration", record)
        self._producer.flush(10)
        self.metrics.observe_inventory(self.inventory, cfg.tier)
        log.info(
            "agent %s: registered (%d CPUs, %d MiB, %d GPUs%s)",
            cfg.node, self.inventory.cpu_count, self.inventory.memory_mb, len(self.inventory.gpus),
            ", simulated" if cfg.simulate_gpus else "",
        )

    @property
    def replaying(self) -> bool:
        """True until the assignments topic was read to the end it had at start (nothing acted on yet)."""
        return self._replaying

    def _poll_assignments(self) -> None:
        from confluent_kafka import KafkaError

        from sie.schemas.avro_codec import decode

        node = self.config.node.encode()
        for msg in self._consumer.consume(num_messages=500, timeout=self.config.loop_interval_s):
            if not self._replay.see(msg):  # an end-of-partition event (counted) or an error
                error = msg.error()
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("agent %s: assignments consumer: %s", self.config.node, error)
                continue
            if msg.key() != node:
                continue
            if msg.value() is None:  # tombstone: the control plane forgot this node
                self._unapplied = ("tombstone", None)
                continue
            try:
                record = decode(msg.value())
            except Exception as exc:
                log.error("agent %s: undecodable assignment at %s[%d]@%d: %s",
                          self.config.node, msg.topic(), msg.partition(), msg.offset(), exc)
                continue
            epoch = int(record.get("epoch", 0))
            if epoch < self._epoch:
                log.warning("agent %s: ignoring assignment of old leader epoch %d (< %d)", self.config.node, epoch, self._epoch)
                continue
            self._epoch = epoch
            self._unapplied = ("assign", record)
        if self._replaying and not self._replay_done():
            return
        unapplied, self._unapplied = self._unapplied, None
        if unapplied is None:
            return
        kind, latest = unapplied
        if latest is not None:
            desired = messages.desired_from_assignment(latest)
            log.info("agent %s: assignment epoch %d: %s", self.config.node, self._epoch, [d.replica_id for d in desired])
            self.supervisor.set_desired(desired)
            self.metrics.assignments.labels(self.config.node).inc()
        else:
            self.supervisor.set_desired([])

    def _replay_done(self) -> bool:
        """Every partition read to the end it had at start (by position, or an end-of-partition event)?"""
        self._replay.check_positions(self._consumer)
        short = self._replay.short()
        if short:
            now = self._clock.monotonic()
            if now - self._replay_logged >= 10.0:
                self._replay_logged = now
                log.warning("agent %s: still replaying %s (partition: read up to/end) after %.0fs; acting on no "
                            "assignment yet", self.config.node, {p: f"{at}/{end}" for (_t, p), (at, end) in short.items()},
                            now - self._replay_started)
            return False
        self._replaying = False
        log.info("agent %s: assignments replayed to their end in %.1fs; following them now",
                 self.config.node, self._clock.monotonic() - self._replay_started)
        return True

    def _supervise(self) -> None:
        start = time.perf_counter()
        changes = self.supervisor.update()
        self.metrics.update_seconds.labels(self.config.node).observe(time.perf_counter() - start)
        for snapshot in changes:
            self._publish_status(snapshot)

    def _publish_status(self, snapshot: ReplicaSnapshot) -> None:
        self.metrics.observe_transition(snapshot)
        record = messages.replica_status(self.config.node, snapshot, _now_ms())
        self._produce("replica-status", snapshot.replica_id, "ReplicaStatus", record)

    def _heartbeat(self) -> None:
        snapshots = [self._reported(s) for s in self.supervisor.snapshots()]
        probed = self._probe()  # fresh NVML readings and host memory (/proc/meminfo)
        gpus = self._gpu_metrics(snapshots, probed)
        self._seq += 1
        warm, reserved = (self.pool.ready(), self.pool.memory_mb()) if self.pool is not None else (0, 0)
        if self.shared is not None:  # the shared processes' runtimes: placement charges their models only
            reserved += self.shared.held_memory_mb(self.settings.model_overhead_mb)
        # a rollout's other version runs in a process of its own next to each replica: memory placement never
        # charged, held while the rollout lasts
        reserved += sum(int(v.get("rss_mb") or 0) for s in snapshots for v in s.versions.values())
        record = messages.heartbeat(self.config.node, self._seq, _now_ms(), gpus, snapshots,
                                    self.advertise_host, self.metrics_port, warm, reserved,
                                    memory_total_mb=probed.memory_mb, memory_available_mb=probed.memory_available_mb,
                                    shared_process_slots=self.settings.shared_processes,
                                    processes=self.shared.by_replica() if self.shared is not None else None)
        self._produce("heartbeats", self.config.node, "Heartbeat", record)
        self.metrics.heartbeats.labels(self.config.node).inc()
        self.metrics.observe_gpus(gpus)
        self.metrics.observe_replicas(snapshots)
        if self.pool is not None:
            self.metrics.observe_pool(self.pool.status())

    def _reported(self, snapshot: ReplicaSnapshot) -> ReplicaSnapshot:
        """A replica as the heartbeat reports it: its companions' state (the agent's preparation, then the
        worker's load), and why a shared replica is not in the process it would have joined."""
        versions = self.companions.versions_of(snapshot.replica_id, snapshot.versions)
        apart = self.shared.placed_apart.get(snapshot.replica_id) if self.shared is not None else None
        reason = f"{snapshot.reason} (not in {apart})" if apart and snapshot.state.has_process else snapshot.reason
        return replace(snapshot, versions=versions, reason=reason)

    def _gpu_metrics(self, snapshots: list[ReplicaSnapshot], probed: Any) -> list[Any]:
        """Fresh NVML readings (``probed``); simulated GPUs report the budgets of the replicas running on them as used."""
        if not self.config.simulate_gpus:
            return list(probed.gpus)
        used: dict[int, int] = {}
        for actual in self.supervisor.table.all():
            if actual.state.has_process:
                for index in actual.desired.gpu_indices:
                    used[index] = used.get(index, 0) + actual.desired.gpu_memory_mb
        return [
            replace(g, memory_used_mb=min(g.memory_total_mb, used.get(g.index, 0)),
                    memory_free_mb=max(0, g.memory_total_mb - used.get(g.index, 0)))
            for g in self.inventory.gpus
        ]

    def _shutdown(self) -> None:
        """Drain every worker, publishing each state change, within the drain grace (+ a margin)."""
        log.info("agent %s: stopping; draining %d replicas", self.config.node, len(self.supervisor.table))
        if self.pool is not None:
            self.pool.close()
        self.supervisor.set_desired([])
        deadline = self._clock.monotonic() + self.config.policy.drain_grace_s + self.config.shutdown_extra_s
        while self._clock.monotonic() < deadline:
            self._guard("supervisor", self._supervise)
            if len(self.supervisor.table) == 0:
                break
            time.sleep(0.05)  # production loop pacing (not test synchronisation)
        if self.shared is not None:
            self._guard("shared_processes", self.shared.close)
        self._guard("heartbeat", self._heartbeat)
