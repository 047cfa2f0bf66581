"""Cluster state as the control plane sees it: pure records and their fold, rebuilt from Kafka (level-triggered).

WHY one container fed by plain ``apply_*`` calls: the reconcile loop must be testable without a
broker (a test calls ``apply_heartbeat(...)`` with a fake clock), and a restarted control plane must
reach the same state by replaying the topics from the beginning (the compacted ones hold the latest
value per key, so a restart loses nothing).  ``ClusterState`` is that container and ``StateSnapshot`` the
frozen view of it one reconcile pass reads; the Kafka-facing reader that feeds it is ``feeder.StateFeeder``.

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
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sie.control.placement.inventory import TIER_LABEL, ClusterInventory, GpuState, NodeState
from sie.schemas.replica_state import ReplicaState, parse_state
from sie.schemas.replica_template import read_replica

log = logging.getLogger(__name__)

Clock = Callable[[], float]

#: ``ControlEvent.kind`` of an operator's request to end a replica's cool-down (``sie replica reset``)
COOLDOWN_RESET_KIND = "cooldown_reset_requested"
#: ``ControlEvent.kind`` of an operator's request to forget an offline node (``sie node forget``); the leader acts on it
NODE_FORGET_KIND = "node_forget_requested"
#: ``ControlEvent.kind`` the leader publishes with the node's tombstones: every reader drops the node then, and
#: ignores its heartbeats sent before (a replay of the last 10 minutes does not bring it back)
NODE_FORGOTTEN_KIND = "node_forgotten"

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
        seen, replayed = self.seen_at, self.replayed_at
        if seen is None or replayed is None:
            return seen if replayed is None else replayed
        return seen if seen >= replayed else replayed


@dataclass(frozen=True)
class AssignedReplica:
    """One entry of an Assignment record; compared by value to decide whether to re-publish."""

    replica_id: str
    model: str
    version: str
    gpu_indices: tuple[int, ...]
    gpu_memory_mb: int
    #: the replica template (``sie.schemas.replica_template``: the spec without counts and rollout block, JSON)
    spec_json: str
    #: during a rollout, the other version's template (JSON) the replica serves from a process of its own
    companions: tuple[str, ...] = ()
    #: ``template_hash(spec_json)``: with the GPUs, the replica's target (a change restarts its worker)
    template_hash: str = ""

    def to_record(self) -> dict[str, Any]:
        return {
            "replica_id": self.replica_id,
            "model": self.model,
            "version": self.version,
            "gpu_indices": list(self.gpu_indices),
            "gpu_memory_mb": self.gpu_memory_mb,
            "spec_json": self.spec_json,
            "companions": list(self.companions),
            "template_hash": self.template_hash,
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
class Changes:
    """What the records read since the last acting pass touched (``ClusterState.take_changes``): the incremental
    pass plans only these (``incremental``).  ``everything``: a record whose effect is not tracked per model or
    node (a connector, a cool-down reset, a node forgotten; the first pass of all): plan everything."""

    #: models whose spec, replica reports (heartbeat or replica-status) or assignment entries changed
    models: set[str] = field(default_factory=set)
    #: nodes whose registration or Assignment changed
    nodes: set[str] = field(default_factory=set)
    everything: bool = False
    #: nodes whose GPUs' utilisation changed, models whose replicas' lag or p99 changed (the director's signals)
    gpus: set[str] = field(default_factory=set)
    signals: set[str] = field(default_factory=set)
    #: a spec or connector record was read (an operator's change: the periodic check waits for a pass without one)
    applied: bool = False
    #: the models whose spec record was read
    specs: set[str] = field(default_factory=set)

    def merge(self, other: Changes) -> Changes:
        return Changes(self.models | other.models, self.nodes | other.nodes, self.everything or other.everything,
                       self.gpus | other.gpus, self.signals | other.signals, self.applied or other.applied,
                       self.specs | other.specs)


def _report_key(r: ReplicaReport) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """What a heartbeat says of a replica that a status shows, and what the traffic director reads (its lag and
    p99).  Not its time (it moves with every heartbeat), nor the counters only the autoscaler reads (its models
    are planned every pass) or the API shows from the state itself."""
    return ((r.model, r.version, r.state, r.reason, r.restarts, r.process, r.outage, r.outage_since, r.versions),
            (r.lag, r.p99_ms))


class Tracked(dict):
    """A dict that keeps one copy of itself for the snapshots until it changes (``frozen``): at 10,000 models,
    copying the specs and 30,000 replica reports for every pass grew a steady pass with the fleet."""

    __slots__ = ("_copy",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._copy: dict[Any, Any] | None = None

    def frozen(self) -> dict[Any, Any]:
        """A copy no one changes (shared by the snapshots taken while this dict did not change)."""
        if self._copy is None:
            self._copy = dict(self)
        return self._copy

    def __setitem__(self, key: Any, value: Any) -> None:
        self._copy = None
        super().__setitem__(key, value)

    def __delitem__(self, key: Any) -> None:
        self._copy = None
        super().__delitem__(key)

    def pop(self, *args: Any) -> Any:
        self._copy = None
        return super().pop(*args)

    def popitem(self) -> Any:
        self._copy = None
        return super().popitem()

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self._copy = None
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._copy = None
        super().update(*args, **kwargs)

    def clear(self) -> None:
        self._copy = None
        super().clear()

    def __ior__(self, other: Any) -> Tracked:  # type: ignore[misc]
        self._copy = None
        super().__ior__(other)
        return self


#: the state's dictionaries that grow with the models: a snapshot shares their copy until they change
_TRACKED = ("specs", "spec_errors", "replica_status", "spec_applied_at")


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
    #: node -> the latest `sie node forget` of it (the leader forgets it if it is still offline)
    forget_requests: dict[str, float] = field(default_factory=dict)
    #: node -> when it was forgotten: heartbeats it sent before are history and do not bring it back
    forgotten: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        for name in _TRACKED:
            setattr(self, name, Tracked(getattr(self, name)))
        self.events = deque(self.events, maxlen=self.max_events)
        #: the positions of ``events`` (a re-read record is found in O(1), not by a scan of the 500 kept: a cold
        #: start replays 10 minutes of events, thousands at 1,000 models)
        self._event_positions: set[tuple[int, int]] = {e.position for e in self.events if e.position is not None}
        self._node_states: dict[str, Any] = {}  # ``StateSnapshot.inventory``'s, shared by the snapshots
        #: node -> replica id -> ``_report_key`` of its latest heartbeat's report
        self._report_keys: dict[str, dict[str, tuple[tuple[Any, ...], tuple[Any, ...]]]] = {}
        #: what the records applied since the last ``take_changes`` touched, and each reader's share of it
        self._changes = Changes()
        self._readers: dict[int | None, Changes] = {}

    # -- apply (one per topic) ----------------------------------------------------------------------

    def apply_spec(self, name: str, record: Mapping[str, Any] | None) -> None:
        """A ModelSpecRecord, or None (tombstone / ``deleted``) = the model is gone."""
        from sie.schemas.spec import ModelService

        with self._lock:
            self._changes.models.add(name)
            self._changes.specs.add(name)
            self._changes.applied = True
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
            self._changes.everything = self._changes.applied = True  # a connector's replicas are few: not tracked
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
            self._changes.nodes.add(name)
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
        if node in self.forgotten and at <= self.forgotten[node]:
            return  # from before the node was forgotten (a replay); a live one after it brings the node back
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
            self._heartbeat_changes(node, reports)
            if old is None or [g.utilization_pct for g in old.gpus] != [g.utilization_pct for g in gpus]:
                self._changes.gpus.add(node)
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

    def _heartbeat_changes(self, node: str, reports: tuple[ReplicaReport, ...]) -> None:
        """The models whose replicas this heartbeat reports differently from the node's last one (O(its replicas);
        the last one's keys are kept, not made again)."""
        before = self._report_keys.get(node, {})
        now: dict[str, tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
        for r in reports:
            key = now[r.replica_id] = _report_key(r)
            old = before.get(r.replica_id)
            if old is None or old[0] != key[0]:
                self._changes.models.add(r.model)
            elif old[1] != key[1]:
                self._changes.signals.add(r.model)
        for rid, key in before.items():
            if rid not in now:  # no longer reported
                self._changes.models.add(key[0][0])
        self._report_keys[node] = now

    def touch_heartbeat(self, node: str, seen_at: float, sent_at: float, seq: int) -> bool:
        """A live heartbeat that says what the node's last one said (the feeder compared their bytes): only its
        time and sequence move.  False (the caller applies the whole record): no heartbeat of the node kept, the
        node was forgotten, or the last one reports a FAILED replica (each report of it is a failure to record)."""
        with self._lock:
            hb = self.heartbeats.get(node)
            if hb is None or node in self.forgotten:
                return False
            failed = hb.__dict__.get("_failed")
            if failed is None:
                failed = any(r.state == ReplicaState.FAILED for r in hb.replicas)
                object.__setattr__(hb, "_failed", failed)
            if failed:
                return False
            touched = replace(hb, seen_at=seen_at, sent_at=sent_at, seq=seq)
            for cached in ("_by_id", "_failed"):  # same replicas, same answers
                if cached in hb.__dict__:
                    object.__setattr__(touched, cached, hb.__dict__[cached])
            self.heartbeats[node] = touched
            return True

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
            self._changes.models.add(report.model)
            old = self.replica_status.get(report.replica_id)
            if old is None or report.at >= old.at:
                self.replica_status[report.replica_id] = report
            if report.state == ReplicaState.FAILED:
                self.failures.append(report)

    def apply_assignment(self, node: str, record: Mapping[str, Any] | None) -> None:
        with self._lock:
            old = self.assignments.get(node)
            new = assignment_from_record(record) if record is not None else None
            if new is None:
                self.assignments.pop(node, None)
            else:
                self.assignments[node] = new
            changed = set(old.replicas if old else ()) ^ set(new.replicas if new else ())
            if changed or (old is None) != (new is None):
                self._changes.nodes.add(node)
                self._changes.models.update(a.model for a in changed)

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
            if event.kind in (COOLDOWN_RESET_KIND, NODE_FORGET_KIND, NODE_FORGOTTEN_KIND):
                self._changes.everything = True
            if event.kind == COOLDOWN_RESET_KIND and event.replica_id:
                rid = str(event.replica_id)
                self.cooldown_resets[rid] = max(event.at, self.cooldown_resets.get(rid, 0.0))
            elif event.kind == NODE_FORGET_KIND and event.node:
                node = str(event.node)
                self.forget_requests[node] = max(event.at, self.forget_requests.get(node, 0.0))
            elif event.kind == NODE_FORGOTTEN_KIND and event.node:
                self._forget(str(event.node), event.at)

    def _forget(self, node: str, at: float) -> None:
        """Drop what was known of ``node`` up to ``at`` (its registration and assignment are tombstoned in the same
        transaction as the event; the heartbeats are not on a compacted topic, so they are filtered here)."""
        self.forgotten[node] = max(at, self.forgotten.get(node, 0.0))
        hb = self.heartbeats.get(node)
        if hb is not None and (hb.alive_at or 0.0) <= at:
            del self.heartbeats[node]
            self._report_keys.pop(node, None)
        info = self.nodes.get(node)
        if info is not None and info.started_at <= at:
            del self.nodes[node]
        self.forget_requests.pop(node, None)
        self.replica_status = Tracked({rid: r for rid, r in self.replica_status.items() if r.node != node or r.at > at})

    def apply_model_status(self, name: str, record: Mapping[str, Any] | None) -> None:
        with self._lock:
            self._changes.models.add(name)  # a standby follows the leader's decisions and floors from it
            if record is None:
                self.model_status.pop(name, None)
            else:
                self.model_status[name] = dict(record)

    # -- queries ------------------------------------------------------------------------------------

    def next_offline_at(self, now: float, timeout_s: float) -> float | None:
        """When the next node already silent for more than half ``timeout_s`` turns offline, unless it is heard
        before (None: no node is that silent).  The reconcile loop runs a pass then rather than at its next
        interval; a node heard from every heartbeat interval (a third of the timeout) is never a candidate."""
        with self._lock:
            due = [alive + timeout_s for hb in self.heartbeats.values()
                   if (alive := hb.alive_at) is not None and timeout_s / 2 < now - alive <= timeout_s]
        return min(due) if due else None

    def drain_failures(self) -> list[ReplicaReport]:
        """FAILED reports seen since the last call (the controller turns them into exclusions)."""
        with self._lock:
            out, self.failures = self.failures, []
            return out

    def take_changes(self, reader: Any = None) -> Changes:
        """What the records applied since ``reader``'s last call touched, and start anew for it.  Each reader (a
        controller; None is one too) has its own: one reading does not take the changes from another.  A
        reader's first call says everything changed."""
        with self._lock:
            fresh, self._changes = self._changes, Changes()
            key = id(reader) if reader is not None else None
            for k in self._readers:
                self._readers[k] = self._readers[k].merge(fresh)
            out = self._readers.get(key)
            if out is None:
                out = Changes(everything=True)
                if reader is not None:  # a reader that is gone stops collecting
                    weakref.finalize(reader, self._readers.pop, key, None)
            self._readers[key] = Changes()
            return out

    def snapshot_and_changes(self, reader: Any = None) -> tuple[StateSnapshot, Changes]:
        """A snapshot and what changed up to it, atomically (a record applied between the two would be lost)."""
        with self._lock:
            return self.snapshot(), self.take_changes(reader)

    def snapshot(self) -> StateSnapshot:
        with self._lock:
            return StateSnapshot(
                specs=_frozen(self.specs),
                spec_errors=_frozen(self.spec_errors),
                nodes=dict(self.nodes),
                heartbeats=dict(self.heartbeats),
                replica_status=_frozen(self.replica_status),
                assignments=dict(self.assignments),
                leader_epoch=self.leader_epoch,
                leader_instance=self.leader_instance,
                events=tuple(self.events),
                connectors=dict(self.connectors),
                connector_errors=dict(self.connector_errors),
                spec_applied_at=_frozen(self.spec_applied_at),
                cooldown_resets=dict(self.cooldown_resets),
                forget_requests=dict(self.forget_requests),
                _node_states=self._node_states,
            )


def _frozen(d: dict[Any, Any]) -> dict[Any, Any]:
    """A snapshot's copy of one of the state's dictionaries (shared while it does not change, ``Tracked``)."""
    return d.frozen() if isinstance(d, Tracked) else dict(d)


def _assigned_replica(r: Mapping[str, Any]) -> AssignedReplica:
    """One replica of an Assignment record; an older control plane's whole spec read as its template
    (``read_replica``), so a record of the release before compares equal to what this one would publish."""
    template, companions = read_replica(r)
    return AssignedReplica(
        replica_id=str(r["replica_id"]),
        model=str(r["model"]),
        version=str(r["version"]),
        gpu_indices=tuple(int(i) for i in r.get("gpu_indices") or ()),
        gpu_memory_mb=int(r.get("gpu_memory_mb") or 0),
        spec_json=template.json,
        companions=companions,
        template_hash=template.hash,
    )


def assignment_from_record(record: Mapping[str, Any]) -> AssignmentInfo:
    replicas = tuple(sorted((_assigned_replica(r) for r in record.get("replicas") or ()), key=lambda a: a.replica_id))
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
    forget_requests: Mapping[str, float] = field(default_factory=dict)
    #: node -> (its registration, what else its state is made of, the NodeState): ``inventory`` builds a node's
    #: state once per value (at 1,000 nodes x 8 GPUs, building them every pass was most of the nodes step)
    _node_states: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    #: (node, now, timeout) -> online: asked for every replica of a status and every node of a pass
    _online: dict[tuple[str, float, float], bool] = field(default_factory=dict, compare=False, repr=False)

    def node_online(self, name: str, now: float, timeout_s: float) -> bool:
        """A heartbeat of the node was seen (live, or replayed at its broker time) within ``timeout_s``."""
        key = (name, now, timeout_s)
        online = self._online.get(key)
        if online is None:
            hb = self.heartbeats.get(name)
            alive_at = hb.alive_at if hb is not None else None
            online = self._online[key] = alive_at is not None and now - alive_at <= timeout_s
        return online

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
        cache = self._node_states
        for name, info in self.nodes.items():
            hb = self.heartbeats.get(name)
            online = self.node_online(name, now, timeout_s)
            # what the node's state is made of besides its registration (one NodeState per value, not per pass)
            key = (online, tuple((g.index, g.healthy) for g in hb.gpus), hb.memory_total_mb, hb.reserved_memory_mb,
                   hb.memory_available_mb, hb.shared_process_slots) if hb is not None else (online,)
            kept = cache.get(name)
            if kept is not None and kept[0] is info and kept[1] == key:
                nodes.append(kept[2])
                continue
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
                        online=online,
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
                continue
            cache[name] = (info, key, nodes[-1])
        if len(cache) > len(self.nodes) + 64:  # nodes forgotten or deregistered
            for gone in set(cache) - set(self.nodes):
                cache.pop(gone, None)
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
