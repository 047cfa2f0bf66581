"""CDC connectors as the control plane sees them: demands to place, documents to assign, status to show.

A connector applied through the API (``POST /v1/connectors``, the ``connectors`` topic) is run by an agent
like a model's replica: the leader places ONE CPU-only replica per connector that is not paused, under
the replica "model" ``cdc:<name>`` (``Names.connector_replica_model``; ``:`` never occurs in a model
name, so the two never share replica ids), and the agent starts ``python -m sie.connectors.worker`` for
it.  Pausing removes the demand: the agent drains the replica (the stage commits its batch and leaves its
group) and resuming starts a new one from the committed offsets, so pause/resume keeps exactly-once.

Why one instance: the stage's transactional id is ``<p>.cdc.<connector>.<replica id>``, stable across
moves, so a replica moved to another node fences its predecessor; more instances of one connector would
split its source partitions and are not offered yet.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from sie.control.placement.demand import ReplicaDemand
from sie.kernel.names import Names
from sie.schemas.connector_spec import connector_replica_doc
from sie.schemas.replica_state import ReplicaState

#: what one connector replica asks of its node: conversion is cheap per row, and it needs no GPU
CONNECTOR_CPU = 0.25


def _doc_json(info: Any, specs: Mapping[str, Any]) -> str:
    model = specs.get(info.spec.model)
    field_types = {f.name: f.type for f in model.input_schema.fields} if model is not None else None
    request_topic = info.spec.request_topic or (model.topics.requests if model is not None else None)
    return json.dumps(connector_replica_doc(info.spec, field_types, request_topic), sort_keys=True,
                      separators=(",", ":"))


def connector_documents(connectors: Mapping[str, Any], specs: Mapping[str, Any]) -> dict[str, str]:
    """Replica "model" -> the JSON document its agent gets (the spec, the target model's field types and
    request topic): a new model version with other input types restarts the connector with them."""
    return {Names.connector_replica_model(name): _doc_json(info, specs) for name, info in connectors.items()}


def connector_demands(connectors: Mapping[str, Any], specs: Mapping[str, Any]) -> list[ReplicaDemand]:
    """One CPU-only replica per connector that is not paused; its version is a digest of its document."""
    out = []
    for name in sorted(connectors):
        info = connectors[name]
        if info.paused:
            continue
        version = hashlib.sha256(_doc_json(info, specs).encode()).hexdigest()[:12]
        out.append(ReplicaDemand(model=Names.connector_replica_model(name), index=0, version=version,
                                 priority="P1", cpu=CONNECTOR_CPU))
    return out


def connector_status(name: str, snap: Any, plan: Any, now: float, timeout_s: float) -> dict[str, Any] | None:
    """What ``GET /v1/connectors/{name}`` says of its replica: phase (Running, Starting, Paused, Degraded,
    Unschedulable, Invalid, Pending), reason, and where it runs."""
    from sie.control.reconcile.status import TROUBLE_STATES, _replica_view

    info = snap.connectors.get(name)
    if info is None:
        error = snap.connector_errors.get(name)
        return None if error is None else {"name": name, "phase": "Invalid", "reason": error, "replicas": []}
    model = Names.connector_replica_model(name)
    out: dict[str, Any] = {"name": name, "paused": info.paused, "applied_at_ms": info.applied_at_ms,
                           "spec": info.spec.model_dump(mode="json", by_alias=False)}
    replicas: list[dict[str, Any]] = []
    if plan is not None:
        for placed in (p for _rid, p in sorted(plan.placements.items()) if p.model == model):
            view = _replica_view(placed, snap, now, timeout_s).to_record()
            replicas.append({k: view[k] for k in ("replica_id", "node", "state", "reason", "restarts")})
        for rid, unplaced in sorted(plan.unplaced.items()):
            if unplaced.model == model:
                replicas.append({"replica_id": rid, "node": None, "state": ReplicaState.UNSCHEDULABLE.value,
                                 "reason": unplaced.reason, "restarts": 0})
    out["replicas"] = replicas
    if info.paused:
        running = _reported_running(snap, model)
        phase = "Paused"
        reason = "paused; offsets stay committed" + (f" (stopping {', '.join(running)})" if running else "")
    elif plan is None:
        phase, reason = "Pending", "not reconciled yet"
    elif not replicas:
        phase, reason = "Pending", "not placed yet"
    else:
        first = replicas[0]
        state = ReplicaState(first["state"])
        if state == ReplicaState.READY:
            phase, reason = "Running", None
        elif state == ReplicaState.UNSCHEDULABLE:
            phase, reason = "Unschedulable", first["reason"]
        elif state in TROUBLE_STATES:
            phase, reason = "Degraded", f"{first['replica_id']}: {state.value.lower()}: {first['reason']}"
        else:
            phase, reason = "Starting", first["reason"]
    out["phase"], out["reason"] = phase, reason
    return out


def _reported_running(snap: Any, model: str) -> list[str]:
    """Replicas of ``model`` whose last reported state still has a process (a paused connector draining)."""
    return sorted(rid for rid, r in snap.replica_status.items() if r.model == model and r.state.has_process)


def connector_offsets(settings: Any, spec: Any, clients: Any = None, timeout: float = 5.0) -> dict[str, Any]:
    """Per source partition: the stage's committed offset, the end of the partition, the lag (end - committed;
    a partition with nothing committed counts from its start).  Read from Kafka at request time with a
    reader that carries the stage's group id but never joins it (no rebalance of the running stage)."""
    from confluent_kafka import TopicPartition

    from sie.kernel.clients import KafkaClients, state_reader_config

    names = settings.names
    group = names.cdc_group(spec.name)
    out: dict[str, Any] = {"group": group, "source_topic": spec.source_topic}
    consumer = (clients or KafkaClients()).consumer(state_reader_config(
        settings, group, names.control_client_id("connector-offsets"), partition_eof=False))
    try:
        info = consumer.list_topics(spec.source_topic, timeout=timeout).topics.get(spec.source_topic)
        if info is None or info.error is not None:
            return {**out, "partitions": [], "lag": None, "error": "source topic not found"}
        parts = [TopicPartition(spec.source_topic, p) for p in sorted(info.partitions)]
        committed = {tp.partition: tp.offset for tp in consumer.committed(parts, timeout=timeout)}
        rows, total = [], 0
        for tp in parts:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout)
            done = committed.get(tp.partition, -1)
            lag = max(0, high - (done if done >= 0 else low))
            total += lag
            rows.append({"partition": tp.partition, "committed": done if done >= 0 else None, "end": high,
                         "lag": lag})
        return {**out, "partitions": rows, "lag": total}
    except Exception as exc:  # a status page must answer even when Kafka does not; no broker text in it
        return {**out, "partitions": [], "lag": None, "error": f"offsets unavailable ({type(exc).__name__})"}
    finally:
        consumer.close()
