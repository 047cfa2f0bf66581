"""ModelStatus: desired vs actual for one model, with each replica's state and the reason.

WHY a value published on a compacted topic (``model-status``, key = model): ``sie describe`` and
``sie get replicas`` must answer without the HTTP API (a control plane may be down, or there may be
two of them); the leader publishes a model's status only when it changes, so the topic is small and
the last record per model is the answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from sie.control.placement.engine import Placement, PlacementPlan
from sie.control.reconcile.autoscaler import ROLLOUT_HOLD
from sie.control.reconcile.records import StateSnapshot
from sie.schemas.replica_state import ReplicaState, parse_state

#: how a READY replica's reason starts while its backend is in an outage (it runs, but scores nothing: its
#: batches are retried because the backend fails on a known-good row): the model is Degraded
BACKEND_OUTAGE = "backend outage since "

#: a desired replica in one of these is not serving and will not get there by itself: the model is Degraded
TROUBLE_STATES: frozenset[ReplicaState] = frozenset(
    {ReplicaState.UNSCHEDULABLE, ReplicaState.FAILED, ReplicaState.CRASHED, ReplicaState.UNKNOWN}
)


@dataclass(frozen=True)
class ReplicaView:
    """One desired replica: where it should run and what its agent says it is doing."""

    replica_id: str
    model: str
    version: str
    node: str | None
    gpu_indices: tuple[int, ...]
    gpu_memory_mb: int
    state: ReplicaState
    reason: str | None = None
    restarts: int = 0
    actual_version: str | None = None
    #: the worker process hosting it, as its agent reports (``pid-<pid>``, or a shared process's id)
    process: str | None = None
    #: nodes the replica is kept off after it FAILED there: ``{node, until_ms, reason}`` (``Cooldown``)
    cooldowns: tuple[Mapping[str, Any], ...] = ()
    #: during a rollout: the other version it serves from a process of its own, and its state
    #: (``1.1.0 ready``, ``1.1.0 failed: <why>``), as its agent reports it
    other_version: str | None = None

    def to_record(self) -> dict[str, Any]:
        return {
            "replica_id": self.replica_id,
            "model": self.model,
            "version": self.version,
            "node": self.node,
            "gpu_indices": list(self.gpu_indices),
            "gpu_memory_mb": self.gpu_memory_mb,
            "state": self.state.value,  # a plain str in the record: Avro ``string``, JSON, YAML alike
            "reason": self.reason,
            "restarts": self.restarts,
            "actual_version": self.actual_version,
            "process": self.process,
            "other_version": self.other_version,
            "cooldowns": [dict(c) for c in self.cooldowns],
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> ReplicaView:
        return cls(
            replica_id=rec["replica_id"],
            model=rec["model"],
            version=rec["version"],
            node=rec.get("node"),
            gpu_indices=tuple(rec.get("gpu_indices") or ()),
            gpu_memory_mb=int(rec.get("gpu_memory_mb") or 0),
            state=parse_state(rec["state"]),
            reason=rec.get("reason"),
            restarts=int(rec.get("restarts") or 0),
            actual_version=rec.get("actual_version"),
            process=rec.get("process"),
            cooldowns=tuple(dict(c) for c in rec.get("cooldowns") or ()),
            other_version=rec.get("other_version"),
        )


@dataclass(frozen=True)
class ModelStatus:
    """Desired vs actual for one model. ``phase``: Ready, Progressing, Degraded, Unschedulable, Invalid."""

    name: str
    version: str
    priority_level: str
    service_type: str
    phase: str
    reason: str | None
    desired_replicas: int
    ready_replicas: int
    replicas: tuple[ReplicaView, ...]
    epoch: int = 0
    updated_at_ms: int = 0
    #: the autoscaler's decision (``autoscaler.ScaleDecision.to_record``); None for a fixed-size model
    autoscale: Mapping[str, Any] | None = None
    #: the replica the traffic director holds for the model (``director.Extra.to_record``); None: none
    director: Mapping[str, Any] | None = None

    def to_record(self) -> dict[str, Any]:
        """The Avro ``ModelStatus`` record (also the JSON the HTTP API returns)."""
        return {
            "name": self.name,
            "version": self.version,
            "priority_level": self.priority_level,
            "service_type": self.service_type,
            "phase": self.phase,
            "reason": self.reason,
            "desired_replicas": self.desired_replicas,
            "ready_replicas": self.ready_replicas,
            "replicas": [r.to_record() for r in self.replicas],
            "epoch": self.epoch,
            "updated_at_ms": self.updated_at_ms,
            "autoscale": dict(self.autoscale) if self.autoscale is not None else None,
            "director": dict(self.director) if self.director is not None else None,
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> ModelStatus:
        return cls(
            name=rec["name"],
            version=rec.get("version") or "",
            priority_level=rec.get("priority_level") or "",
            service_type=rec.get("service_type") or "",
            phase=rec.get("phase") or "",
            reason=rec.get("reason"),
            desired_replicas=int(rec.get("desired_replicas") or 0),
            ready_replicas=int(rec.get("ready_replicas") or 0),
            replicas=tuple(ReplicaView.from_record(r) for r in rec.get("replicas") or ()),
            epoch=int(rec.get("epoch") or 0),
            updated_at_ms=int(rec.get("updated_at_ms") or 0),
            autoscale=dict(rec["autoscale"]) if rec.get("autoscale") else None,
            director=dict(rec["director"]) if rec.get("director") else None,
        )

    def same_as(self, other: ModelStatus | None) -> bool:
        """Equal apart from when/by whom it was computed and the autoscaler's moving numbers (decides whether
        to re-publish: the lag and rates change every pass, the decision rarely)."""
        if other is None:
            return False
        auto_a, auto_b = self.autoscale, other.autoscale
        if (auto_a is None) != (auto_b is None):
            return False
        if auto_a is not None and auto_b is not None and _decision_identity(auto_a) != _decision_identity(auto_b):
            return False
        # field by field, as values (every model, every pass: no records built to compare them)
        return (replace(self, epoch=0, updated_at_ms=0, autoscale=None)
                == replace(other, epoch=0, updated_at_ms=0, autoscale=None))


#: the fields of an autoscale record that are the decision (the rest are the numbers behind it)
_DECISION_FIELDS = ("desired", "action", "last_scale_at_ms", "blocked_until_ms", "woke_at_ms", "first_result_ms")


def _decision_identity(record: Mapping[str, Any]) -> tuple[Any, ...]:
    """The decision's fields, and a rollout hold's reason: it changes with the rollout's steps only (not every pass,
    as the numbers in other reasons do), so a status is re-published when the rollout's step changes (else it
    would say ``Surging`` while the rollout is at Canary 50 %)."""
    reason = str(record.get("reason") or "")
    return (*(record.get(k) for k in _DECISION_FIELDS), reason if ROLLOUT_HOLD in reason else None)


def _replica_view(
    placement: Placement, snap: StateSnapshot, now: float, timeout_s: float
) -> ReplicaView:
    view = partial(
        ReplicaView,
        replica_id=placement.replica_id,
        model=placement.model,
        version=placement.version,
        node=placement.node,
        gpu_indices=placement.gpu_indices,
        gpu_memory_mb=placement.gpu_memory_mb,
    )
    if not snap.node_online(placement.node, now, timeout_s):
        return view(state=ReplicaState.UNKNOWN, reason=f"node {placement.node} offline")
    report = snap.reported(placement.node, placement.replica_id, now, timeout_s)
    if report is None:
        return view(state=ReplicaState.PENDING, reason=f"assigned to {placement.node}; not yet reported by its agent")
    reason = report.reason
    if report.outage and report.state == ReplicaState.READY:  # running, scoring nothing: the worker says why
        since = (datetime.fromtimestamp(report.outage_since, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                 if report.outage_since else "?")
        reason = f"{BACKEND_OUTAGE}{since}: {report.outage}; its batches are retried, nothing is scored"
    if report.version and report.version != placement.version:
        reason = f"running version {report.version}; {placement.version} requested" + (f"; {reason}" if reason else "")
    other = "; ".join(f"{v} {state}" + (f": {detail}" if detail else "") for v, state, detail in report.versions)
    return view(
        state=report.state, reason=reason, restarts=report.restarts, actual_version=report.version or None,
        process=report.process, other_version=other or None,
    )


def _explain(view: ReplicaView) -> str:
    """``fraud-0: unschedulable: needs ...`` (no doubled state word when the reason already starts with it)."""
    state = view.state.value.lower()
    if view.reason and view.reason.lower().startswith(state + ":"):
        return f"{view.replica_id}: {view.reason}"
    return f"{view.replica_id}: {state}" + (f": {view.reason}" if view.reason else "")


def build_status(
    name: str,
    spec: Any | None,
    spec_error: str | None,
    plan: PlacementPlan,
    snap: StateSnapshot,
    now: float,
    timeout_s: float,
    epoch: int,
    cooldowns: Mapping[str, list[dict[str, Any]]] | None = None,
    replica_ids: Iterable[str] | None = None,
) -> ModelStatus:
    """Desired (the plan) vs actual (agents' reports) for one model; ``cooldowns`` by replica id.
    ``replica_ids``: the model's replicas in ``plan`` when the caller grouped them already (one sweep of the plan
    for every model, instead of one per model: ``Controller._statuses``)."""
    if spec is None:
        return ModelStatus(name, "", "", "", "Invalid", spec_error or "spec missing", 0, 0, (), epoch, int(now * 1000))
    views: list[ReplicaView] = []
    if replica_ids is None:
        replica_ids = ([r for r in plan.placements if plan.placements[r].model == name]
                       + [r for r in plan.unplaced if plan.unplaced[r].model == name])
    for rid in sorted(set(replica_ids)):
        placed = plan.placements.get(rid)
        if placed is not None:
            views.append(_replica_view(placed, snap, now, timeout_s))
        else:
            u = plan.unplaced[rid]
            views.append(ReplicaView(rid, u.model, u.version, None, (), 0, ReplicaState.UNSCHEDULABLE, u.reason))
    if cooldowns:
        views = [replace(v, cooldowns=tuple(cooldowns[v.replica_id])) if v.replica_id in cooldowns else v
                 for v in views]
    desired = len(views)
    ready = sum(1 for v in views if v.state == ReplicaState.READY and (v.actual_version in (None, v.version)))
    # READY on another version than placed (a replica being replaced by a new version) is not ready yet
    not_ready = [v for v in views if v.state != ReplicaState.READY or v.actual_version not in (None, v.version)]
    outages = [v for v in views if v.state == ReplicaState.READY and BACKEND_OUTAGE in (v.reason or "")]
    if outages:  # READY counts them (their processes run), but the model answers nothing through them
        phase, reason = "Degraded", (f"{len(outages)} of {desired} replica(s) in a backend outage; "
                                     f"{outages[0].replica_id}: {outages[0].reason}")
    elif desired == ready:
        phase, reason = "Ready", None
    elif all(v.state == ReplicaState.UNSCHEDULABLE for v in views):
        phase, reason = "Unschedulable", not_ready[0].reason
    elif any(v.state in TROUBLE_STATES for v in views):
        phase = "Degraded"
        worst = next(v for v in not_ready if v.state in TROUBLE_STATES)
        reason = _explain(worst)
    else:
        phase = "Progressing"
        first = not_ready[0]
        reason = _explain(first)
    return ModelStatus(
        name=name,
        version=str(spec.version),
        priority_level=str(spec.priority_level),
        service_type=str(spec.service_type),
        phase=phase,
        reason=reason,
        desired_replicas=desired,
        ready_replicas=ready,
        replicas=tuple(views),
        epoch=epoch,
        updated_at_ms=int(now * 1000),
    )
