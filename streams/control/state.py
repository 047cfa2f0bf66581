"""Cluster state as the control plane sees it, rebuilt from Kafka (level-triggered).

WHY one container fed by plain ``apply_*`` calls: the reconcile loop must be testable without a
broker (a test calls ``apply_heartbeat(...)`` with a fake clock), and a restarted control plane must
reach the same state by replaying the topics from the beginning (the compacted ones hold the latest
value per key, so a restart loses nothing).  ``StateFeeder`` is the only Kafka-facing part: it reads
every control topic ``read_committed`` from the beginning and hands each decoded record to
``ClusterState``.

Node liveness never uses the agent's clock (an agent whose clock is ten minutes off must neither look
dead nor stay alive after it died):

* a heartbeat read LIVE (its partition already read to the end it had when the feeder started) counts
  as seen at the control plane's own clock when it was read (``HeartbeatInfo.seen_at``);
* a heartbeat read while REPLAYING history counts as seen at the time the broker appended it
  (``message.timestamp.type=LogAppendTime`` on the heartbeats topic), capped at now
  (``HeartbeatInfo.replayed_at``): replaying ten minutes of old heartbeats at start-up does not make a
  node that died nine minutes ago look alive.  On a topic still stamped by its producers (CreateTime,
  created before SIE set LogAppendTime; ``sie topics ensure`` fixes it) that is the agent's clock, which
  is why the controller also waits, after catching up, for a live heartbeat of every node it saw in the
  replay before it acts on liveness (``Controller`` docstring).

The feeder runs under a ``SupervisedThread``: whatever kills its loop (a client error, a bug) restarts
it with backoff, resuming every partition where it stopped, and the state counts as stale (not caught
up) until it has read to the end again.  One record that cannot be read or applied (undecodable key or
value, a field of the wrong type) is counted, logged with its coordinates and skipped: it never stops
the feed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sie.kernel.clients import KafkaClients, state_reader_config
from sie.kernel.names import SYSTEM_TOPICS
from sie.kernel.supervised import SupervisedThread, ThreadStatus
from sie.schemas.replica_state import ReplicaState, parse_state
from sie.streams.control.inventory import TIER_LABEL, ClusterInventory, GpuState, NodeState

log = logging.getLogger(__name__)

Clock = Callable[[], float]

#: ``ControlEvent.kind`` of an operator's request to end a replica's cool-down (``sie replica reset``)
COOLDOWN_RESET_KIND = "cooldown_reset_requested"

#: reported states of a replica that is placed and on its way to serving, or serving
ACTIVE_STATES: frozenset[ReplicaState] = frozenset({ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.READY})


# ------------------------------------------------------------------------------------------ values


@dataclass(frozen=True)
class GpuReport:
    """A GPU as last reported (registration or heartbeat)."""

    index: int
    product: str
    memory_total_mb: int
    memory_used_mb: int = 0
    utilization_pct: float = 0.0
    healthy: bool = True
    simulated: bool = False


@dataclass(frozen=True)
class NodeInfo:
    """A node's registration (inventory) from the compacted ``nodes`` topic."""

    name: str
    labels: Mapping[str, str]
    tier: str | None
    cpu_count: float
    memory_mb: int
    gpus: tuple[GpuReport, ...]
    simulated: bool = False
    agent_version: str = ""
    started_at: float = 0.0


@dataclass(frozen=True)
class ReplicaReport:
    """One replica as an agent reports it (heartbeat) or as a state change (replica-status)."""

    replica_id: str
    model: str
    version: str
    node: str
    state: ReplicaState
    reason: str | None = None
    restarts: int = 0
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    at: float = 0.0
    #: from heartbeats only: the worker's /metrics ``host:port``, its consumer lag, recent per-request p99
    #: (ms), records scored by the current worker and its records per second of inference time
    metrics_address: str | None = None
    lag: int | None = None
    p99_ms: float | None = None
    records: int = 0
    inference_rps: float | None = None
    #: from heartbeats only: the worker process hosting it on its node (``pid-<pid>`` for a process of its
    #: own, a shared process's id; None: no process now, or an agent older than the field)
    process: str | None = None
    #: from heartbeats only: while its backend is in an outage (its batches are retried: the backend fails on
    #: a known-good row), the latest failure and when the outage began (epoch s); None while it scores
    outage: str | None = None
    outage_since: float | None = None
    #: from heartbeats only, during a rollout: version -> (state, detail) of the other version the replica
    #: serves from a process of its own (waiting | loading | ready | failed)
    versions: tuple[tuple[str, str, str], ...] = ()

    def version_state(self, version: str) -> tuple[str, str] | None:
        for v, state, detail in self.versions:
            if v == version:
                return state, detail
        return None


@dataclass(frozen=True)
class HeartbeatInfo:
    """The latest heartbeat of a node and when the control plane last had proof of its life.

    ``seen_at``: the control plane's clock when it last READ a heartbeat of this node live (None: none
    read live yet).  ``replayed_at``: the broker's append time (capped at now) of the latest heartbeat
    read while replaying history (None: none).  ``sent_at``: the agent's own stamp, shown, never used
    for liveness.
    """

    node: str
    seen_at: float | None
    seq: int
    gpus: tuple[GpuReport, ...]
    replicas: tuple[ReplicaReport, ...]
    replayed_at: float | None = None
    sent_at: float = 0.0
    #: ``host:port`` of the agent's own /metrics (None: it serves none)
    metrics_address: str | None = None
    #: the agent's warm pool: workers waiting for a replica and the host memory they hold
    warm_workers: int = 0
    reserved_memory_mb: int = 0
    #: host memory of the node (MiB) and what was available when sent; None: not reported (an older agent)
    memory_total_mb: int | None = None
    memory_available_mb: int | None = None
    #: models one shared worker process of the agent hosts (0: every replica in a process of its own)
    shared_process_slots: int = 0

    def replica(self, replica_id: str) -> ReplicaReport | None:
        """This heartbeat's report of ``replica_id`` (None: not in it), by an index made on first use: asked for
        every replica of the node each pass, a scan made a pass quadratic in replicas per node."""
        index = self.__dict__.get("_by_id")
        if index is None:
            index = {r.replica_id: r for r in reversed(self.replicas)}  # the first one wins, as a scan found
            object.__setattr__(self, "_by_id", index)
        return index.get(replica_id)

    @property
    def reports_host_memory(self) -> bool:
        """Does this agent report host memory (and so how it runs processes)? False for agents older than it."""
        return self.memory_total_mb is not None

    @property
    def alive_at(self) -> float | None:
        """The latest proof of life, live or replayed."""
        stamps = [t for t in (self.seen_at, self.replayed_at) if t is not None]
        return max(stamps) if stamps else None


@dataclass(frozen=True)
class AssignedReplica:
    """One entry of an Assignment record; compared by value to decide whether to re-publish."""

    replica_id: str
    model: str
    version: str
    gpu_indices: tuple[int, ...]
    gpu_memory_mb: int
    spec_json: str
    #: during a rollout, the other version's document (JSON) the replica serves from a process of its own
    companions: tuple[str, ...] = ()

    def to_record(self) -> dict[str, Any]:
        return {
            "replica_id": self.replica_id,
            "model": self.model,
            "version": self.version,
            "gpu_indices": list(self.gpu_indices),
            "gpu_memory_mb": self.gpu_memory_mb,
            "spec_json": self.spec_json,
            "companions": list(self.companions),
        }


@dataclass(frozen=True)
class AssignmentInfo:
    """The last Assignment published for a node (``replicas`` sorted by replica id)."""

    node: str
    epoch: int
    replicas: tuple[AssignedReplica, ...]
    issued_at: float = 0.0


@dataclass(frozen=True)
class EventInfo:
    at: float
    kind: str
    model: str | None
    replica_id: str | None
    node: str | None
    detail: str
    #: (partition, offset) on the events topic: the same record read twice is applied once
    position: tuple[int, int] | None = None


@dataclass(frozen=True)
class NodeView:
    """What ``GET /v1/nodes`` and ``sie get nodes`` show."""

    name: str
    online: bool
    tier: str | None
    cpu_count: float
    memory_mb: int
    gpus: tuple[GpuReport, ...]
    simulated: bool
    last_heartbeat: float | None
    labels: Mapping[str, str]
    #: host memory available at the last heartbeat (None: not reported) and the agent's shared-process slots
    memory_available_mb: int | None = None
    shared_process_slots: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": "online" if self.online else "offline",
            "tier": self.tier,
            "cpu": self.cpu_count,
            "memory_mb": self.memory_mb,
            "memory_available_mb": self.memory_available_mb,
            "shared_process_slots": self.shared_process_slots,
            "simulated": self.simulated,
            "labels": dict(self.labels),
            "last_heartbeat_ms": int(self.last_heartbeat * 1000) if self.last_heartbeat else None,
            "gpus": [
                {
                    "index": g.index,
                    "product": g.product,
                    "memory_total_mb": g.memory_total_mb,
                    "memory_used_mb": g.memory_used_mb,
                    "utilization_pct": g.utilization_pct,
                    "healthy": g.healthy,
                    "simulated": g.simulated,
                }
                for g in self.gpus
            ],
        }


# ---------------------------------------------------------------------------------- record decoding


def _gpu(rec: Mapping[str, Any]) -> GpuReport:
    return GpuReport(
        index=int(rec["index"]),
        product=str(rec.get("product") or "unknown"),
        memory_total_mb=int(rec.get("memory_total_mb") or 0),
        memory_used_mb=int(rec.get("memory_used_mb") or 0),
        utilization_pct=float(rec.get("utilization_pct") or 0.0),
        healthy=bool(rec.get("healthy", True)),
        simulated=bool(rec.get("simulated", False)),
    )


def _optional_int(value: Any) -> int | None:
    """A reported count that may be absent (null: the sender does not report it); never negative."""
    return None if value is None else max(0, int(value))


# ------------------------------------------------------------------------------------------- state


@dataclass
class ClusterState:
    """Specs, nodes, heartbeats, replica status, published assignments and recent events.

    Thread-safe: the feeder thread applies records while the reconcile loop and the HTTP API read.
    Spec values are ``ModelService`` objects; a spec record that no longer parses (e.g. written by a
    newer version) is kept in ``spec_errors`` so it shows up in the model's status instead of vanishing.
    """

    max_events: int = 500
    #: ``sie.schemas.spec_policy.SpecPolicy``: a spec on the topic that breaks it is kept out of ``specs``
    #: (never placed) and its reason shown in ``spec_errors``, exactly as ``POST /v1/models`` refuses it
    spec_policy: Any = None
    specs: dict[str, Any] = field(default_factory=dict)
    spec_errors: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    heartbeats: dict[str, HeartbeatInfo] = field(default_factory=dict)
    replica_status: dict[str, ReplicaReport] = field(default_factory=dict)
    failures: list[ReplicaReport] = field(default_factory=list)
    assignments: dict[str, AssignmentInfo] = field(default_factory=dict)
    leader_epoch: int = 0
    leader_instance: str | None = None
    events: deque = field(default_factory=lambda: deque(maxlen=500))
    model_status: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: CDC connectors applied through the API (``sie.schemas.connector_store.ConnectorInfo``), by name
    connectors: dict[str, Any] = field(default_factory=dict)
    connector_errors: dict[str, str] = field(default_factory=dict)
    #: model -> when its current spec record was applied (a re-apply or a new version ends its cool-downs)
    spec_applied_at: dict[str, float] = field(default_factory=dict)
    #: replica id -> the latest `sie replica reset` of it (ends cool-downs that began before it)
    cooldown_resets: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self.events = deque(self.events, maxlen=self.max_events)
        #: the positions of ``events`` (a re-read record is found in O(1), not by a scan of the 500 kept: a cold
        #: start replays 10 minutes of events, thousands at 1,000 models)
        self._event_positions: set[tuple[int, int]] = {e.position for e in self.events if e.position is not None}

    # -- apply (one per topic) ----------------------------------------------------------------------

    def apply_spec(self, name: str, record: Mapping[str, Any] | None) -> None:
        """A ModelSpecRecord, or None (tombstone / ``deleted``) = the model is gone."""
        from sie.schemas.spec import ModelService

        with self._lock:
            if record is None or record.get("deleted"):
                self.specs.pop(name, None)
                self.spec_errors.pop(name, None)
                self.spec_applied_at.pop(name, None)
                return
            self.spec_applied_at[name] = float(record.get("applied_at_ms") or 0) / 1000.0
            import json

            try:
                spec = ModelService.from_document(json.loads(record["spec_json"]))
            except Exception as exc:  # a spec we cannot read is a status, not a crash
                self.specs.pop(name, None)
                self.spec_errors[name] = f"spec record unreadable: {str(exc).splitlines()[0]}"
                return
            problems = self.spec_policy.check(spec) if self.spec_policy is not None else []
            if problems:  # written to the topic directly, past the API: refused here all the same
                self.specs.pop(name, None)
                self.spec_errors[name] = "spec refused: " + "; ".join(problems)
                return
            self.specs[name] = spec
            self.spec_errors.pop(name, None)

    def apply_connector(self, name: str, record: Mapping[str, Any] | None) -> None:
        """A ConnectorRecord, or None (tombstone) = the connector is gone; an unreadable one is an error entry."""
        from sie.schemas.connector_spec import connector_name_problems
        from sie.schemas.connector_store import connector_from_record

        with self._lock:
            try:
                info = connector_from_record(dict(record)) if record is not None else None
            except Exception as exc:  # a connector we cannot read is a status, not a crash
                self.connectors.pop(name, None)
                self.connector_errors[name] = f"connector record unreadable: {str(exc).splitlines()[0]}"
                return
            problems = [] if info is None or self.spec_policy is None else connector_name_problems(
                info.spec, self.spec_policy.topic_prefix)
            if problems:  # written past the API (Write on the connectors topic): never placed
                self.connectors.pop(name, None)
                self.connector_errors[name] = "connector refused: " + "; ".join(problems)
                return
            self.connector_errors.pop(name, None)
            if info is None:
                self.connectors.pop(name, None)
            else:
                self.connectors[name] = info

    def apply_node(self, name: str, record: Mapping[str, Any] | None) -> None:
        with self._lock:
            if record is None:
                self.nodes.pop(name, None)
                return
            labels = dict(record.get("labels") or {})
            tier = record.get("tier") or labels.get(TIER_LABEL)
            self.nodes[name] = NodeInfo(
                name=name,
                labels=labels,
                tier=tier,
                cpu_count=float(record.get("cpu_count") or 0),
                memory_mb=int(record.get("memory_mb") or 0),
                gpus=tuple(_gpu(g) for g in record.get("gpus") or ()),
                simulated=bool(record.get("simulated", False)),
                agent_version=str(record.get("agent_version") or ""),
                started_at=float(record.get("started_at_ms") or 0) / 1000.0,
            )

    def apply_heartbeat(self, record: Mapping[str, Any], seen_at: float | None, replayed_at: float | None = None) -> None:
        """The node's latest heartbeat.  ``seen_at``: the reader's clock when it read this record live;
        None for a record replayed from history, whose proof of life is ``replayed_at`` (broker time)."""
        node = str(record["node"])
        sent_at = float(record.get("ts_ms") or 0) / 1000.0
        at = seen_at if seen_at is not None else (replayed_at if replayed_at is not None else sent_at)
        reports = tuple(
            ReplicaReport(
                replica_id=str(r["replica_id"]),
                model=str(r.get("model") or ""),
                version=str(r.get("version") or ""),
                node=node,
                state=parse_state(r.get("state")),
                reason=r.get("reason"),
                restarts=int(r.get("restarts") or 0),
                pid=r.get("pid"),
                at=at,
                metrics_address=r.get("metrics_address"),
                lag=r.get("lag"),
                p99_ms=float(r["p99_ms"]) if r.get("p99_ms") is not None else None,
                records=int(r.get("records") or 0),
                inference_rps=float(r["inference_rps"]) if r.get("inference_rps") is not None else None,
                process=r.get("process"),
                outage=r.get("outage"),
                outage_since=r["outage_since_ms"] / 1000.0 if r.get("outage_since_ms") is not None else None,
                versions=tuple((str(v.get("version")), str(v.get("state")), str(v.get("detail") or ""))
                               for v in r.get("versions") or ()),
            )
            for r in record.get("replicas") or ()
        )
        gpus = tuple(_gpu(g) for g in record.get("gpus") or ())
        with self._lock:
            old = self.heartbeats.get(node)
            # one node's heartbeats share a partition (key = node): the one read last is the newest
            self.heartbeats[node] = HeartbeatInfo(
                node,
                seen_at if seen_at is not None else (old.seen_at if old else None),
                int(record.get("seq") or 0),
                gpus,
                reports,
                replayed_at=replayed_at if replayed_at is not None else (old.replayed_at if old else None),
                sent_at=sent_at,
                metrics_address=record.get("metrics_address"),
                warm_workers=int(record.get("warm_workers") or 0),
                reserved_memory_mb=int(record.get("reserved_memory_mb") or 0),
                memory_total_mb=_optional_int(record.get("memory_total_mb")),
                memory_available_mb=_optional_int(record.get("memory_available_mb")),
                shared_process_slots=max(0, int(record.get("shared_process_slots") or 0)),
            )
            for r in reports:
                if r.state == ReplicaState.FAILED:
                    self.failures.append(r)

    def apply_replica_status(self, record: Mapping[str, Any]) -> None:
        report = ReplicaReport(
            replica_id=str(record["replica_id"]),
            model=str(record.get("model") or ""),
            version=str(record.get("version") or ""),
            node=str(record.get("node") or ""),
            state=parse_state(record.get("state")),
            reason=record.get("reason"),
            restarts=int(record.get("restarts") or 0),
            exit_code=record.get("exit_code"),
            signal=record.get("signal"),
            at=float(record.get("ts_ms") or 0) / 1000.0,
        )
        with self._lock:
            old = self.replica_status.get(report.replica_id)
            if old is None or report.at >= old.at:
                self.replica_status[report.replica_id] = report
            if report.state == ReplicaState.FAILED:
                self.failures.append(report)

    def apply_assignment(self, node: str, record: Mapping[str, Any] | None) -> None:
        with self._lock:
            if record is None:
                self.assignments.pop(node, None)
                return
            self.assignments[node] = assignment_from_record(record)

    def apply_leader_epoch(self, record: Mapping[str, Any] | None) -> None:
        if record is None:
            return
        with self._lock:
            epoch = int(record.get("epoch") or 0)
            if epoch >= self.leader_epoch:
                self.leader_epoch = epoch
                self.leader_instance = record.get("instance_id")

    def apply_event(self, record: Mapping[str, Any], position: tuple[int, int] | None = None) -> None:
        """One event; ``position`` (partition, offset) makes a re-read of the same record a no-op."""
        with self._lock:
            if position is not None and position in self._event_positions:
                return
            event = EventInfo(
                at=float(record.get("ts_ms") or 0) / 1000.0,
                kind=str(record.get("kind") or ""),
                model=record.get("model"),
                replica_id=record.get("replica_id"),
                node=record.get("node"),
                detail=str(record.get("detail") or ""),
                position=position,
            )
            if len(self.events) == self.events.maxlen and self.events[0].position is not None:
                self._event_positions.discard(self.events[0].position)  # the oldest leaves the deque
            self.events.append(event)
            if position is not None:
                self._event_positions.add(position)
            if event.kind == COOLDOWN_RESET_KIND and event.replica_id:
                rid = str(event.replica_id)
                self.cooldown_resets[rid] = max(event.at, self.cooldown_resets.get(rid, 0.0))

    def apply_model_status(self, name: str, record: Mapping[str, Any] | None) -> None:
        with self._lock:
            if record is None:
                self.model_status.pop(name, None)
            else:
                self.model_status[name] = dict(record)

    # -- queries ------------------------------------------------------------------------------------

    def drain_failures(self) -> list[ReplicaReport]:
        """FAILED reports seen since the last call (the controller turns them into exclusions)."""
        with self._lock:
            out, self.failures = self.failures, []
            return out

    def snapshot(self) -> StateSnapshot:
        with self._lock:
            return StateSnapshot(
                specs=dict(self.specs),
                spec_errors=dict(self.spec_errors),
                nodes=dict(self.nodes),
                heartbeats=dict(self.heartbeats),
                replica_status=dict(self.replica_status),
                assignments=dict(self.assignments),
                leader_epoch=self.leader_epoch,
                leader_instance=self.leader_instance,
                events=tuple(self.events),
                connectors=dict(self.connectors),
                connector_errors=dict(self.connector_errors),
                spec_applied_at=dict(self.spec_applied_at),
                cooldown_resets=dict(self.cooldown_resets),
            )


def assignment_from_record(record: Mapping[str, Any]) -> AssignmentInfo:
    replicas = tuple(
        sorted(
            (
                AssignedReplica(
                    replica_id=str(r["replica_id"]),
                    model=str(r["model"]),
                    version=str(r["version"]),
                    gpu_indices=tuple(int(i) for i in r.get("gpu_indices") or ()),
                    gpu_memory_mb=int(r.get("gpu_memory_mb") or 0),
                    spec_json=str(r.get("spec_json") or ""),
                    companions=tuple(str(c) for c in r.get("companions") or ()),
                )
                for r in record.get("replicas") or ()
            ),
            key=lambda a: a.replica_id,
        )
    )
    return AssignmentInfo(
        node=str(record["node"]),
        epoch=int(record.get("epoch") or 0),
        replicas=replicas,
        issued_at=float(record.get("issued_at_ms") or 0) / 1000.0,
    )


def _host_total_mb(info: NodeInfo | None, hb: HeartbeatInfo | None) -> int:
    """A node's host memory: its latest heartbeat's when reported (>0), else its registration's (0: unknown)."""
    if hb is not None and hb.memory_total_mb:
        return hb.memory_total_mb
    return info.memory_mb if info is not None else 0


@dataclass(frozen=True)
class StateSnapshot:
    """A consistent copy of ``ClusterState`` for one reconcile pass or one API answer."""

    specs: Mapping[str, Any]
    spec_errors: Mapping[str, str]
    nodes: Mapping[str, NodeInfo]
    heartbeats: Mapping[str, HeartbeatInfo]
    replica_status: Mapping[str, ReplicaReport]
    assignments: Mapping[str, AssignmentInfo]
    leader_epoch: int
    leader_instance: str | None
    events: tuple[EventInfo, ...]
    connectors: Mapping[str, Any] = field(default_factory=dict)
    connector_errors: Mapping[str, str] = field(default_factory=dict)
    spec_applied_at: Mapping[str, float] = field(default_factory=dict)
    cooldown_resets: Mapping[str, float] = field(default_factory=dict)

    def node_online(self, name: str, now: float, timeout_s: float) -> bool:
        """A heartbeat of the node was seen (live, or replayed at its broker time) within ``timeout_s``."""
        hb = self.heartbeats.get(name)
        alive_at = hb.alive_at if hb is not None else None
        return alive_at is not None and now - alive_at <= timeout_s

    def heard_live(self, name: str, now: float, timeout_s: float) -> bool:
        """A heartbeat of the node was READ live within ``timeout_s`` (replayed ones do not count)."""
        hb = self.heartbeats.get(name)
        return hb is not None and hb.seen_at is not None and now - hb.seen_at <= timeout_s

    def node_views(self, now: float, timeout_s: float) -> list[NodeView]:
        out = []
        for name in sorted(set(self.nodes) | set(self.heartbeats)):
            info, hb = self.nodes.get(name), self.heartbeats.get(name)
            gpus = hb.gpus if hb is not None and hb.gpus else (info.gpus if info else ())
            out.append(
                NodeView(
                    name=name,
                    online=self.node_online(name, now, timeout_s),
                    tier=info.tier if info else None,
                    cpu_count=info.cpu_count if info else 0.0,
                    memory_mb=_host_total_mb(info, hb),
                    gpus=gpus,
                    simulated=(info.simulated if info else False) or any(g.simulated for g in gpus),
                    last_heartbeat=(hb.alive_at or hb.sent_at or None) if hb else None,
                    labels=dict(info.labels) if info else {},
                    memory_available_mb=hb.memory_available_mb if hb is not None else None,
                    shared_process_slots=hb.shared_process_slots if hb is not None else 0,
                )
            )
        return out

    def inventory(self, now: float, timeout_s: float) -> ClusterInventory:
        """The placer's view: registered nodes, online iff a heartbeat was seen within ``timeout_s``;
        GPU health from the latest heartbeat (falls back to the registration); host memory as the latest
        heartbeat reports it (falls back to the registration) less what the agent's warm pool holds
        (``reserved_memory_mb`` of its heartbeat).  A node that sends heartbeats but never registered is
        left out: without its inventory it cannot be placed on.

        A heartbeat without host memory (an agent older than Heartbeat.v4) leaves ``process_slots`` None:
        how that agent runs processes is unknown, so placement counts no process overhead there and packs
        it exactly as before (declared ``memoryMb`` against the registered memory, none if that is 0)."""
        nodes = []
        for name, info in self.nodes.items():
            hb = self.heartbeats.get(name)
            health = {g.index: g.healthy for g in hb.gpus} if hb is not None else {}
            labels = dict(info.labels)
            if info.tier and TIER_LABEL not in labels:
                labels[TIER_LABEL] = info.tier
            gpus = tuple(
                GpuState(
                    index=g.index,
                    product=g.product,
                    memory_total_mb=max(0, g.memory_total_mb),
                    healthy=g.healthy and health.get(g.index, True),
                    simulated=g.simulated,
                )
                for g in info.gpus
            )
            try:
                nodes.append(
                    NodeState(
                        name=name,
                        labels=labels,
                        online=self.node_online(name, now, timeout_s),
                        cpu_count=max(0.0, info.cpu_count),
                        # 0 would mean "not reported, not enforced": a pool holding it all leaves 1 MiB
                        memory_mb=(max(1, total - (hb.reserved_memory_mb if hb is not None else 0))
                                   if (total := _host_total_mb(info, hb)) > 0 else 0),
                        gpus=gpus,
                        memory_available_mb=hb.memory_available_mb if hb is not None else None,
                        process_slots=hb.shared_process_slots if hb is not None and hb.reports_host_memory else None,
                    )
                )
            except ValueError as exc:  # a malformed registration is skipped, and said so
                log.warning("node %s skipped: %s", name, exc)
        return ClusterInventory.of(nodes)

    def reported(self, node: str, replica_id: str, now: float, timeout_s: float) -> ReplicaReport | None:
        """The actual state of ``replica_id`` on ``node``: the node's latest heartbeat if the node is
        online, else (or if absent there) the latest replica-status record from that node."""
        hb = self.heartbeats.get(node)
        if hb is not None and self.node_online(node, now, timeout_s):
            r = hb.replica(replica_id)
            if r is not None:
                status = self.replica_status.get(replica_id)
                if (status is not None and status.node == node and status.state == r.state and not r.reason
                        and (status.reason, status.exit_code, status.signal) != (r.reason, r.exit_code, r.signal)):
                    return replace(r, reason=status.reason, exit_code=status.exit_code, signal=status.signal)
                return r
        status = self.replica_status.get(replica_id)
        if status is not None and status.node == node:
            return status
        return None


# ------------------------------------------------------------------------------------------ feeder


#: topic suffix -> whether it must be read to its end before the first reconcile
STATE_TOPICS = ("specs", "nodes", "assignments", "control-leader", "heartbeats", "replica-status", "events", "model-status",
                "connectors")


#: topic suffix -> the one record type its values may be (anything else on it is skipped)
RECORD_OF_TOPIC = {
    "specs": "ModelSpecRecord", "nodes": "NodeRegistration", "assignments": "Assignment",
    "control-leader": "LeaderEpoch", "heartbeats": "Heartbeat", "replica-status": "ReplicaStatus",
    "events": "ControlEvent", "model-status": "ModelStatus", "connectors": "ConnectorRecord",
}


def decode_value(value: bytes, expected: str | None = None) -> dict[str, Any]:
    """Avro single-object bytes -> record dict (the codec may return ``(name, record)``); with ``expected``,
    a record of another type is an error."""
    from sie.schemas import avro_codec

    decoded = avro_codec.decode(value, expected)
    if isinstance(decoded, tuple):
        decoded = decoded[-1]
    return dict(decoded)


#: topics whose live records wake the reconcile loop at once (an operator's apply, delete or connector change)
#: instead of at its next interval: apply -> assignment is then one pass, not up to a second more
WAKE_TOPICS = frozenset({"specs", "connectors"})
#: topics read from a time window, not from the beginning (history, not state: not compacted)
HISTORY_TOPICS = frozenset({"heartbeats", "replica-status", "events"})
_LAG_CHECK_S = 1.0  # how often the feeder compares its position on the heartbeats partitions with their end
_KEY_SHOWN = 64  # bytes of a skipped record's key shown in logs and health


class ReadBarrier:
    """"Every record committed on the control topics before this barrier was asked for is applied": what a new
    leader waits for before its first pass (``StateFeeder.sync``).

    WHY: a standby's feeder reads all along, but the old leader's last transactions can still be on their way
    to it when the new leader is elected (a clean stop hands over in about a second); a pass that planned
    from a state without them would undo them.  The targets are each partition's high watermark taken by
    the feeder after the request, and the request is made after the election's ``init_transactions``
    fenced the old leader, so nothing it committed lies beyond them.
    """

    def __init__(self, on_done: Callable[[], None] | None = None) -> None:
        self.done = threading.Event()
        self._on_done = on_done
        #: (topic, partition) -> the end to reach (None: not taken yet)
        self.ends: dict[tuple[str, int], int] | None = None
        #: (topic, partition) -> (reached, end) while short of it
        self.short: dict[tuple[str, int], tuple[int, int]] = {}
        self.error: str | None = None

    def reached(self) -> bool:
        return self.done.is_set()

    def describe(self) -> str:
        """What it still waits for (shown while a new leader waits)."""
        if self.done.is_set():
            return "reached"
        if self.ends is None:
            return "taking the end offsets" + (f" (last try: {self.error})" if self.error else "")
        short = sorted(self.short.items())
        shown = ", ".join(f"{t}[{p}] at {at} of {end}" for (t, p), (at, end) in short[:5])
        return f"{len(short)} partition(s) short: {shown}" + (" ..." if len(short) > 5 else "")

    def _finish(self) -> None:
        self.short = {}
        self.done.set()
        if self._on_done is not None:
            try:
                self._on_done()
            except Exception:
                log.exception("read barrier callback failed")


class StateFeeder:
    """Reads every control topic (read_committed) into a ``ClusterState``, on a supervised thread.

    ``caught_up`` is set once every partition reached the end it had when the current run started: the
    controller does not reconcile before that (a half-read assignments topic would look like "nothing is
    placed" and the leader would move healthy replicas).  Heartbeats and replica-status are not
    compacted: only the last ``history_s`` seconds of them are read (``offsets_for_times``), enough for
    liveness and recent failures.  A run that dies is restarted (backoff) and resumes every partition
    after the last record it read; ``caught_up`` is cleared until that run reached the end again.

    How stale the state is, for the controller and health:

    * ``stale_reason()``: the state may miss records of any topic (not caught up, the loop died and waits
      to restart, or it has not polled for ``stall_limit_s``): nothing should act on it;
    * ``lag_reason()``: caught up once, but now behind the end of a heartbeats partition for more than
      ``lag_limit_s``: nodes look more silent than they are (evidence for the controller's mass-offline
      guard, which then holds removals).

    ``sync()`` asks for a ``ReadBarrier``: done once every partition was read to the end it had when the
    feeder thread took it (a new leader's takeover).  A partition counts as read to an offset when a record
    before it was applied, an end-of-partition event was reported there (the end may be a transaction
    marker, which no record shows), or the current run started past it (history outside the window).
    """

    def __init__(
        self,
        settings: Any,
        state: ClusterState,
        clock: Clock = time.time,
        history_s: float = 600.0,
        topics: Iterable[str] = STATE_TOPICS,
        clients: KafkaClients | None = None,
        lag_limit_s: float = 3.0,
        stall_limit_s: float = 15.0,
        on_skip: Callable[[str], None] | None = None,
        backoff_initial_s: float = 0.5,
        monotonic: Clock = time.monotonic,
        on_change: Callable[[str], None] | None = None,
    ) -> None:
        self._settings = settings
        self._clients = clients or KafkaClients()
        self._state = state
        self._clock = clock
        self._monotonic = monotonic
        self._history_s = history_s
        self._lag_limit_s = lag_limit_s
        self._stall_limit_s = stall_limit_s
        self._on_skip = on_skip
        #: called (with the topic suffix) after a live record of a ``WAKE_TOPICS`` topic was applied
        self._on_change = on_change
        self._topics = {settings.names.system_topic(s): s for s in topics if s in SYSTEM_TOPICS}
        self.caught_up = threading.Event()
        #: the feeder's clock when the current run caught up (None while not caught up)
        self.caught_up_at: float | None = None
        self._stop = threading.Event()
        self._thread = SupervisedThread("sie-control-state", self._run, self._stop, backoff_initial_s=backoff_initial_s)
        self._next: dict[tuple[str, int], int] = {}  # next offset to read, per partition (kept across runs)
        self._run_start: dict[tuple[str, int], int] = {}  # where the current run started, per partition
        self._behind: dict[tuple[str, int], tuple[float, int]] = {}  # heartbeats partition -> (since, end to reach)
        self._eof: dict[tuple[str, int], int] = {}  # where the latest end-of-partition event was, per partition
        #: heartbeats partition -> node key -> its latest record read while replaying (``_replayed``)
        self._replay_latest: dict[tuple[str, int], dict[bytes | None, Any]] = {}
        self._barriers: list[ReadBarrier] = []
        self._barriers_lock = threading.Lock()
        self._lag_checked = 0.0
        self._polled_at: float | None = None
        self.errors = 0
        self.skipped = 0
        self.last_error: str | None = None
        self.last_skipped: str | None = None

    def start(self) -> StateFeeder:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    # -- staleness ---------------------------------------------------------------------------------

    def stale_reason(self) -> str | None:
        """Why the state may miss records right now (None: caught up and reading)."""
        thread = self._thread.status()
        if thread.state == "restarting":
            return f"state reader died ({thread.last_error}); restart {thread.restarts} pending"
        if thread.state != "running":
            return f"state reader {thread.state}"
        if not self.caught_up.is_set():
            again = f" again after restart {thread.restarts}" if thread.restarts else ""
            return f"state reader is reading the control topics to their end{again} (not caught up)"
        polled = self._polled_at
        if polled is not None and self._monotonic() - polled > self._stall_limit_s:
            return f"state reader stalled: no poll for {self._monotonic() - polled:.0f}s"
        return None

    def sync(self, on_done: Callable[[], None] | None = None) -> ReadBarrier:
        """A read barrier over every control topic (``ReadBarrier``); ``on_done`` is called from the feeder's
        thread once it is reached."""
        barrier = ReadBarrier(on_done)
        with self._barriers_lock:
            self._barriers.append(barrier)
        return barrier

    def lag_s(self) -> float:
        """How long the feeder has been behind an end of a heartbeats partition it saw (0: not behind)."""
        behind = list(self._behind.values())
        return max((self._monotonic() - since for since, _end in behind), default=0.0)

    def lag_reason(self) -> str | None:
        lag = self.lag_s()
        if lag > self._lag_limit_s:
            return f"state reader {lag:.0f}s behind the end of the heartbeats topic"
        return None

    def thread_status(self) -> ThreadStatus:
        return self._thread.status()

    def status(self) -> dict[str, Any]:
        """The feeder as ``/healthz`` shows it."""
        thread = self._thread.status()
        problem = self.stale_reason() or self.lag_reason()
        return {
            "ok": problem is None,
            "detail": problem or "caught up",
            "state": thread.state,
            "restarts": thread.restarts,
            "last_death": thread.last_error,
            "caught_up": self.caught_up.is_set(),
            "lag_s": round(self.lag_s(), 1),
            "skipped_records": self.skipped,
            "last_skipped": self.last_skipped,
            "client_errors": self.errors - self.skipped,
            "last_error": self.last_error,
        }

    # -- the loop ----------------------------------------------------------------------------------

    def _assign_all(self, consumer: Any) -> dict[tuple[str, int], int]:
        """Assign every partition (resuming after the last record a previous run read); return the end
        offsets to reach before ``caught_up``."""
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        metadata = consumer.list_topics(timeout=10)
        since_ms = int((self._clock() - self._history_s) * 1000)
        parts: list[TopicPartition] = []
        ends: dict[tuple[str, int], int] = {}
        self._run_start = {}
        for topic, suffix in self._topics.items():
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None:
                log.warning("control topic %s missing (run `sie topics ensure`); skipping it", topic)
                continue
            for p in sorted(meta.partitions):
                lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                resume = self._next.get((topic, p))
                if resume is not None:
                    start = max(resume, lo)
                elif suffix in HISTORY_TOPICS:
                    found = consumer.offsets_for_times([TopicPartition(topic, p, since_ms)], timeout=10)[0]
                    start = found.offset if found.offset >= 0 else hi
                else:
                    start = OFFSET_BEGINNING
                parts.append(TopicPartition(topic, p, start))
                first = lo if start == OFFSET_BEGINNING else max(start, lo)
                self._run_start[(topic, p)] = first
                if hi > first:
                    ends[(topic, p)] = hi
        consumer.assign(parts)
        return ends

    def _caught_up(self) -> None:
        self.caught_up_at = self._clock()
        self.caught_up.set()

    def _run(self) -> None:
        """One run: a fresh consumer, every partition assigned, read until stopped.  Raises on whatever
        the run cannot go on with (the supervisor restarts it); one bad record never gets here."""
        from confluent_kafka import KafkaError, KafkaException

        self.caught_up.clear()
        self.caught_up_at = None
        self._behind.clear()
        self._polled_at = None
        names = self._settings.names
        consumer = self._clients.consumer(state_reader_config(
            self._settings, names.control_state_group, names.control_state_client_id))
        try:
            pending = self._assign_all(consumer)
            if not pending:
                self._caught_up()
            while not self._stop.is_set():
                self._polled_at = self._monotonic()
                msg = consumer.poll(0.2)
                if self.caught_up.is_set():
                    self._check_lag(consumer)
                if self._barriers:
                    self._serve_barriers()
                if msg is None:
                    continue
                key = (msg.topic(), msg.partition())
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        self._eof[key] = max(self._eof.get(key, 0), msg.offset())
                        if pending.pop(key, None) is not None:
                            self._replayed(key)
                            if not pending:
                                self._caught_up()
                        continue
                    self.errors += 1
                    self.last_error = f"consumer: {error}"
                    if error.fatal():
                        raise KafkaException(error)
                    continue
                self._next[key] = msg.offset() + 1
                if key in pending and self._topics.get(key[0]) == "heartbeats":
                    # history: only each node's latest heartbeat counts (its replayed_at, GPUs, replicas); a
                    # cold start at 200 nodes replays ~60,000 of them, decoded and applied in 70 s before
                    self._replay_latest.setdefault(key, {})[msg.key()] = msg
                else:
                    self._apply(msg, live=key not in pending)
                if key in pending and msg.offset() + 1 >= pending[key]:
                    del pending[key]
                    self._replayed(key)
                    if not pending:
                        self._caught_up()
        except Exception as exc:
            self.last_error = f"state reader died: {type(exc).__name__}: {exc}"
            raise
        finally:
            for key in list(self._replay_latest):  # read, so never read again (resumed after): applied now
                self._replayed(key)
            if not self._stop.is_set():
                self.caught_up.clear()  # whatever ended this run, the state is stale until the next one caught up
                self.caught_up_at = None
            try:
                consumer.close()
            except Exception as exc:
                log.warning("closing the state reader's consumer: %s", exc)

    def _replayed(self, key: tuple[str, int]) -> None:
        """A partition read to the end it had at start: apply what its replay kept back (the latest heartbeat
        of each node), in log order."""
        kept = self._replay_latest.pop(key, None)
        for msg in sorted((kept or {}).values(), key=lambda m: m.offset()):
            self._apply(msg, live=False)

    def _read_to(self, key: tuple[str, int]) -> int:
        """The offset up to which ``key`` has been read and applied in this feeder (``ReadBarrier``)."""
        return max(self._next.get(key, 0), self._eof.get(key, 0), self._run_start.get(key, 0))

    def _ends(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The high watermark of each partition now, asked through a consumer of its own: the reader's consumer
        would wait behind its own fetch long-poll on every call (a broker answers one request per connection at
        a time): 17 partitions took 5-7 s that way, measured on a takeover."""
        from confluent_kafka import TopicPartition

        names = self._settings.names
        probe = self._clients.consumer(state_reader_config(
            self._settings, names.control_state_group, names.control_state_ends_client_id))
        try:
            return {key: probe.get_watermark_offsets(TopicPartition(*key), timeout=5)[1] for key in keys}
        finally:
            probe.close()

    def _serve_barriers(self) -> None:
        """Take the end offsets of each new barrier; finish every barrier whose ends were all reached."""
        with self._barriers_lock:
            barriers = list(self._barriers)
        for barrier in barriers:
            if barrier.ends is None:
                try:
                    barrier.ends = self._ends(list(self._run_start))
                except Exception as exc:  # tried again on the next loop
                    barrier.error = f"{type(exc).__name__}: {exc}"
                    continue
            barrier.short = {key: (self._read_to(key), end) for key, end in barrier.ends.items()
                             if self._read_to(key) < end}
            if not barrier.short:
                with self._barriers_lock:
                    self._barriers.remove(barrier)
                barrier._finish()

    def _check_lag(self, consumer: Any) -> None:
        """Every second: is an end of a heartbeats partition seen earlier still not reached?"""
        from confluent_kafka import TopicPartition

        now = self._monotonic()
        if now - self._lag_checked < _LAG_CHECK_S:
            return
        self._lag_checked = now
        for (topic, p), start in self._run_start.items():
            if self._topics.get(topic) != "heartbeats":
                continue
            try:
                _lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
            except Exception as exc:  # no end known yet: nothing to compare with
                log.debug("watermarks of %s[%d]: %s", topic, p, exc)
                continue
            position = self._next.get((topic, p), start)
            target = self._behind.get((topic, p))
            if target is not None and position >= target[1]:
                del self._behind[(topic, p)]
                target = None
            if target is None and hi > position:
                self._behind[(topic, p)] = (now, hi)

    def _replayed_at(self, msg: Any) -> float | None:
        """A replayed heartbeat's proof of life: its broker timestamp, capped at now."""
        _kind, ts_ms = msg.timestamp()
        if ts_ms is None or ts_ms <= 0:
            return None
        return min(ts_ms / 1000.0, self._clock())

    def _apply(self, msg: Any, live: bool) -> None:
        """Decode and apply one record; anything wrong with it is counted and skipped (``_skip``)."""
        suffix = self._topics.get(msg.topic())
        try:
            raw_key = msg.key()
            key = raw_key.decode("utf-8") if raw_key else ""
            value = msg.value()
            record = decode_value(value, RECORD_OF_TOPIC.get(suffix or "")) if value is not None else None
            if suffix == "specs":
                self._state.apply_spec(key, record)
            elif suffix == "nodes":
                self._state.apply_node(key, record)
            elif suffix == "assignments":
                self._state.apply_assignment(key, record)
            elif suffix == "control-leader":
                self._state.apply_leader_epoch(record)
            elif suffix == "model-status":
                self._state.apply_model_status(key, record)
            elif suffix == "connectors":
                self._state.apply_connector(key, record)
            elif record is None:
                return
            elif suffix == "heartbeats":
                if live:
                    self._state.apply_heartbeat(record, seen_at=self._clock())
                else:
                    self._state.apply_heartbeat(record, seen_at=None, replayed_at=self._replayed_at(msg))
            elif suffix == "replica-status":
                self._state.apply_replica_status(record)
            elif suffix == "events":
                self._state.apply_event(record, (msg.partition(), msg.offset()))
        except Exception as exc:  # one bad record must not stop the feed
            self._skip(msg, suffix, exc)
            return
        if live and suffix in WAKE_TOPICS and self._on_change is not None:
            self._on_change(suffix)

    def _skip(self, msg: Any, suffix: str | None, exc: Exception) -> None:
        raw_key = msg.key()
        shown = raw_key[:_KEY_SHOWN].decode("utf-8", "backslashreplace") if raw_key else ""
        text = (str(exc).splitlines() or [""])[0][:200]
        self.errors += 1
        self.skipped += 1
        self.last_error = self.last_skipped = (
            f"{msg.topic()}[{msg.partition()}]@{msg.offset()} key={shown!r}: {type(exc).__name__}: {text}")
        log.warning("skipping a control record that cannot be applied: %s", self.last_skipped)
        if self._on_skip is not None:
            try:
                self._on_skip(suffix or msg.topic())
            except Exception:
                log.exception("counting a skipped record failed")
