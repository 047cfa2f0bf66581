"""What the control plane tells about the cluster's metrics: Prometheus targets and live numbers per model.

Both come from the agents' heartbeats, which carry each node's and each worker's /metrics address
(the agent allocates the worker ports and advertises them) and each worker's consumer lag and recent
p99.  Only nodes that are online count: a dead node's last heartbeat would otherwise keep listing
endpoints nobody serves, and numbers nobody measures any more.

``prometheus_targets`` is Prometheus' ``http_sd`` format (``GET /v1/prometheus/targets``): one target
group per endpoint, labelled ``sie_component`` (agent / scorer), ``sie_node``, and for a scorer
``sie_replica`` and ``sie_model`` (a shared multi-model process, which serves one /metrics for all of
its models, is one target labelled ``sie_process`` instead).  The ``sie_`` prefix keeps them apart from the labels the
endpoints export themselves (``node``, ``model_id``), which Prometheus would otherwise rename.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sie.control.reconcile.records import StateSnapshot
from sie.schemas.replica_state import ReplicaState

#: replica states whose worker process runs (and so serves /metrics)
_SERVING = frozenset({ReplicaState.STARTING, ReplicaState.READY, ReplicaState.DRAINING})


def prometheus_targets(snap: StateSnapshot, now: float, timeout_s: float) -> list[dict[str, Any]]:
    """Every /metrics endpoint of the online nodes: their agents and the workers they run."""
    groups: list[dict[str, Any]] = []
    for node in sorted(snap.heartbeats):
        hb = snap.heartbeats[node]
        if not snap.node_online(node, now, timeout_s):
            continue
        if hb.metrics_address:
            groups.append({"targets": [hb.metrics_address], "labels": {"sie_component": "agent", "sie_node": node}})
        shared: set[str] = set()
        for r in sorted(hb.replicas, key=lambda r: r.replica_id):
            if not r.metrics_address or r.state not in _SERVING:
                continue
            if r.process and not r.process.startswith("pid-"):
                # a shared multi-model process: ONE /metrics for all its models (series carry model_id), one target
                if r.metrics_address not in shared:
                    shared.add(r.metrics_address)
                    groups.append({"targets": [r.metrics_address], "labels": {
                        "sie_component": "scorer", "sie_node": node, "sie_process": r.process}})
                continue
            groups.append({"targets": [r.metrics_address], "labels": {
                "sie_component": "scorer", "sie_node": node, "sie_replica": r.replica_id, "sie_model": r.model}})
    return groups


def model_numbers(snap: StateSnapshot, now: float, timeout_s: float) -> dict[str, dict[str, Any]]:
    """Per model, from the latest heartbeats of online nodes: ``lag`` (the sum over its replicas),
    ``p99_ms`` (the worst replica's recent p99; None when no replica scored anything lately) and
    ``reporting`` (replicas that reported numbers)."""
    out: dict[str, dict[str, Any]] = {}
    for node, hb in snap.heartbeats.items():
        if not snap.node_online(node, now, timeout_s):
            continue
        for r in hb.replicas:
            if r.lag is None and r.p99_ms is None:
                continue
            entry = out.setdefault(r.model, {"lag": 0, "p99_ms": None, "reporting": 0})
            entry["reporting"] += 1
            entry["lag"] += int(r.lag or 0)
            if r.p99_ms is not None and (entry["p99_ms"] is None or r.p99_ms > entry["p99_ms"]):
                entry["p99_ms"] = float(r.p99_ms)
    return out


def event_rows(events: Iterable[Any], limit: int) -> list[dict[str, Any]]:
    """The last ``limit`` events as JSON rows, oldest first, each event said more than once shown once, as
    ``kubectl describe`` does: ``count`` says how often, ``first_ts_ms`` when first, ``ts_ms`` when last, and
    the row sits at its latest time, even when other events came in between (a flapping pair, a leader that
    says "unschedulable" again after every election, a record read twice: one line each, not a screenful).
    The same event = same kind, model, replica, node and detail."""
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for e in events:
        ts_ms = int(e.at * 1000)
        key = (e.kind, e.model, e.replica_id, e.node, e.detail)
        row = rows.get(key)
        if row is not None:
            row["count"] += 1
            row["ts_ms"] = max(row["ts_ms"], ts_ms)
            row["first_ts_ms"] = min(row["first_ts_ms"], ts_ms)
            continue
        rows[key] = {"ts_ms": ts_ms, "first_ts_ms": ts_ms, "kind": e.kind, "model": e.model,
                     "replica_id": e.replica_id, "node": e.node, "detail": e.detail, "count": 1}
    ordered = sorted(rows.values(), key=lambda r: r["ts_ms"])  # stable: same time keeps arrival order
    return ordered[-limit:] if limit > 0 else []
