"""The agent's Kafka records as dicts shaped like the Avro schemas (schemas/avro/*.avsc).

The one module that knows the field names of NodeRegistration, Heartbeat,
ReplicaReport, ReplicaStatus and (reading) Assignment/ReplicaAssignment, so a
schema change touches one file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from sie.schemas.replica_template import read_replica
from sie.workers.replica import DesiredReplica
from sie.workers.supervisor import ReplicaSnapshot

AGENT_VERSION = "sie-agent/0.1"


def gpu_record(gpu: Any) -> dict[str, Any]:
    record = dataclasses.asdict(gpu)
    record["temperature_c"] = float(record["temperature_c"])
    record["utilization_pct"] = float(record["utilization_pct"])
    return record


def node_registration(
    node: str, labels: Mapping[str, str], tier: str | None, inventory: Any, started_at_ms: int
) -> dict[str, Any]:
    return {
        "node": node,
        "labels": dict(labels),
        "tier": tier,
        "cpu_count": int(inventory.cpu_count),
        "memory_mb": int(inventory.memory_mb),
        "gpus": [gpu_record(g) for g in inventory.gpus],
        "simulated": any(g.simulated for g in inventory.gpus),
        "agent_version": AGENT_VERSION,
        "started_at_ms": started_at_ms,
    }


def address(host: str | None, port: int | None) -> str | None:
    """``host:port`` of a /metrics endpoint (IPv6 literals bracketed); None without a host or a port."""
    if not host or not port:
        return None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def dedicated_process(pid: int | None) -> str | None:
    """The ``process`` of a replica running in a worker process of its own: ``pid-<pid>`` (None: no process)."""
    return f"pid-{pid}" if pid else None


def replica_report(snapshot: ReplicaSnapshot, host: str | None = None, process: str | None = None) -> dict[str, Any]:
    """``process``: the id of the shared worker process hosting the replica (a multi-model runtime passes
    it); None = the replica runs in a process of its own, reported as ``pid-<pid>`` (``dedicated_process``)."""
    return {
        "replica_id": snapshot.replica_id,
        "model": snapshot.model,
        "version": snapshot.version,
        "state": snapshot.state.value,
        "pid": snapshot.pid,
        "restarts": snapshot.restarts,
        # the readiness gate's "holding no partitions: ..." joins the reason (sie get replicas, the status page)
        "reason": "; ".join(r for r in (snapshot.reason, snapshot.holding) if r) or None,
        "metrics_address": address(host, snapshot.metrics_port),
        "lag": snapshot.lag,
        "p99_ms": snapshot.p99_ms,
        "records": snapshot.records,
        "inference_rps": snapshot.inference_rps,
        "process": process or dedicated_process(snapshot.pid),
        "versions": [{"version": v, "state": info["state"], "detail": info.get("detail") or None}
                     for v, info in sorted(snapshot.versions.items())],
        "outage_since_ms": snapshot.outage["since_ms"] if snapshot.outage else None,
        "outage": snapshot.outage["detail"] if snapshot.outage else None,
    }


def heartbeat(node: str, seq: int, ts_ms: int, gpus: Iterable[Any], snapshots: Iterable[ReplicaSnapshot],
              host: str | None = None, metrics_port: int | None = None,
              warm_workers: int = 0, reserved_memory_mb: int = 0,
              memory_total_mb: int | None = None, memory_available_mb: int | None = None,
              shared_process_slots: int = 0, processes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``host``: where Prometheus reaches this node; ``metrics_port``: the agent's own /metrics;
    ``warm_workers`` / ``reserved_memory_mb``: its warm pool (placement subtracts the memory it holds);
    ``memory_total_mb`` / ``memory_available_mb``: host memory now (None: unknown, e.g. no /proc/meminfo);
    ``shared_process_slots``: models one shared worker process hosts (0: none shared, every replica in a process
    of its own); ``processes``: replica id -> the shared process hosting it (replicas not named run alone)."""
    processes = processes or {}
    return {
        "node": node,
        "ts_ms": ts_ms,
        "seq": seq,
        "gpus": [gpu_record(g) for g in gpus],
        "replicas": [replica_report(s, host, processes.get(s.replica_id)) for s in snapshots],
        "metrics_address": address(host, metrics_port),
        "warm_workers": warm_workers,
        "reserved_memory_mb": reserved_memory_mb,
        "memory_total_mb": memory_total_mb or None,
        "memory_available_mb": memory_available_mb if memory_total_mb else None,
        "shared_process_slots": shared_process_slots,
    }


def replica_status(node: str, snapshot: ReplicaSnapshot, ts_ms: int) -> dict[str, Any]:
    return {
        "replica_id": snapshot.replica_id,
        "node": node,
        "model": snapshot.model,
        "version": snapshot.version,
        "state": snapshot.state.value,
        "reason": snapshot.reason or None,
        "exit_code": snapshot.exit_code,
        "signal": snapshot.signal,
        "restarts": snapshot.restarts,
        "ts_ms": ts_ms,
    }


def desired_from_assignment(record: Mapping[str, Any]) -> list[DesiredReplica]:
    """The replicas an Assignment asks for (duplicated replica ids: the last one wins).  Each runs its replica
    template as carried; a record of a control plane before Assignment v3 carries the whole spec, whose template
    ``read_replica`` derives (the same one, and hash, this release's control plane sends)."""
    epoch = int(record.get("epoch", 0))
    by_id: dict[str, DesiredReplica] = {}
    for item in record.get("replicas") or ():
        template, companions = read_replica(item)
        by_id[item["replica_id"]] = DesiredReplica(
            replica_id=item["replica_id"],
            model=item["model"],
            version=item["version"],
            template_json=template.json,
            gpu_indices=tuple(int(i) for i in item.get("gpu_indices") or ()),
            gpu_memory_mb=int(item.get("gpu_memory_mb") or 0),
            epoch=epoch,
            companions=companions,
            template_hash=template.hash,
        )
    return list(by_id.values())
