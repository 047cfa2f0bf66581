"""Step 1 of a pass, failures: a replica that FAILED on a node is kept off it for a cool-down.

One pass (``Controller``'s ``failures`` step)::

    exclusions, events = clear(exclusions, snap, now)        # ended by an operator, or ran out
    exclusions, events += record_failures(exclusions, drained FAILED reports, assigned, snap, now, cooldown_s)
    placement takes excluded(exclusions, ...) (replica -> nodes it must not use)

==================================================  ===========================================================
a cool-down of (replica, node) ...                  happens
==================================================  ===========================================================
starts: FAILED on the node it is assigned to        ``replica_failed`` event; until = report + cooldown_s
FAILED report not from its assigned node, already   nothing (a report read late, or a cool-down running)
excluded, or already past its end
FAILED before its spec's last apply or a reset      nothing (stale: made before the operator's fix)
its model's spec or connector re-applied after it   ended, ``cooldown_cleared`` event
its model deleted                                    ended, ``cooldown_cleared`` event
``sie replica reset`` after it                      ended, ``cooldown_cleared`` event
``until`` reached                                    ended quietly (placement uses the node again)
==================================================  ===========================================================

Pure functions over the snapshot; the exclusions persist on the ``Controller`` and are passed in and returned
(a new mapping, insertion order kept).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sie.control.reconcile.narration import event
from sie.control.reconcile.ports import OutRecord
from sie.control.reconcile.records import ReplicaReport, StateSnapshot
from sie.kernel.names import Names

#: (replica id, node) -> its cool-down
Exclusions = Mapping[tuple[str, str], "Cooldown"]


@dataclass(frozen=True)
class Cooldown:
    """A replica kept off a node after it FAILED there: until when, why, and since when (the FAILED report).

    It ends at ``until``, or earlier (operators control it) when the model's spec is applied again after
    ``since`` (a fix shipped as a new version, or the same spec re-applied), when the model is deleted, or
    when ``sie replica reset`` asks for it after ``since``.  FAILED reports made before such a clear are
    stale (a heartbeat read late) and start nothing.
    """

    until: float
    reason: str
    model: str
    since: float

    def to_json(self, node: str) -> dict[str, Any]:
        return {"node": node, "until_ms": int(self.until * 1000), "reason": self.reason}


def applied(snap: StateSnapshot, model: str) -> tuple[str, str, float | None]:
    """(``model`` or ``connector``, what was applied, when it was last applied; None: it no longer is).
    A connector's replicas (``cdc:<name>``) are applied on the connectors topic (apply, pause and resume
    each write its record), a model's on the specs topic."""
    connector = Names.connector_of_replica_model(model)
    if connector is not None:
        info = snap.connectors.get(connector)
        return "connector", f"connector {connector}", None if info is None else info.applied_at_ms / 1000.0
    spec = snap.specs.get(model)
    if spec is None:
        return "model", f"spec {model}", None
    return "model", f"spec {model} {spec.version}", snap.spec_applied_at.get(model, 0.0)


def cleared_since(snap: StateSnapshot, model: str, replica_id: str) -> float:
    """The latest time a cool-down of ``replica_id`` was ended by an operator: its spec or connector
    (re)applied, or a reset asked for; FAILED reports made before it are stale."""
    return max(applied(snap, model)[2] or 0.0, snap.cooldown_resets.get(replica_id, 0.0))


def clear(exclusions: Exclusions, snap: StateSnapshot, now: float) -> tuple[dict[tuple[str, str], Cooldown], list[OutRecord]]:
    """The cool-downs still running, and a ``cooldown_cleared`` event for each an operator ended (table)."""
    kept: dict[tuple[str, str], Cooldown] = {}
    out: list[OutRecord] = []
    for key, cd in exclusions.items():
        rid, node = key
        why = None
        kind, what, applied_at = applied(snap, cd.model)
        if applied_at is None:
            why = f"the {kind} is no longer applied"
        elif applied_at > cd.since:
            why = f"{what} applied after the failure"
        elif snap.cooldown_resets.get(rid, 0.0) > cd.since:
            why = f"reset by hand (sie replica reset {rid})"
        elif cd.until <= now:
            continue  # ran out: placement simply uses the node again
        if why is not None:
            out.append(event(now, "cooldown_cleared", cd.model, rid, node, f"cool-down of {rid} on {node} cleared: {why}"))
            continue
        kept[key] = cd
    return kept, out


def record_failures(exclusions: Exclusions, reports: Iterable[ReplicaReport], assigned: set[tuple[str, str]],
                    snap: StateSnapshot, now: float, cooldown_s: float) -> tuple[dict[tuple[str, str], Cooldown], list[OutRecord]]:
    """``exclusions`` with a cool-down for each FAILED report of a replica on the node it is ``assigned`` to
    ((replica id, node) pairs of the published assignments), and its ``replica_failed`` event."""
    out: list[OutRecord] = []
    result = dict(exclusions)
    for report in reports:
        key = (report.replica_id, report.node)
        until = report.at + cooldown_s
        if key not in assigned or until <= now or key in result:
            continue
        if report.at <= cleared_since(snap, report.model, report.replica_id):
            continue  # FAILED before the spec was re-applied or the replica reset: stale
        reason = report.reason or "crashed too often"
        result[key] = Cooldown(until, reason, report.model, report.at)
        out.append(event(now, "replica_failed", report.model, report.replica_id, report.node,
                         f"replica FAILED on {report.node}: {reason}; kept off it for {cooldown_s:g}s (or until a "
                         f"re-apply or `sie replica reset {report.replica_id}`)"))
    return result, out


def by_replica(exclusions: Exclusions) -> dict[str, list[dict[str, Any]]]:
    """Replica id -> its cool-downs (node, until_ms, reason): what ``ModelStatus`` shows."""
    out: dict[str, list[dict[str, Any]]] = {}
    for (rid, node), cd in sorted(exclusions.items()):
        out.setdefault(rid, []).append(cd.to_json(node))
    return out


def excluded(exclusions: Exclusions, moving: Mapping[str, Iterable[str]]) -> dict[str, frozenset[str]]:
    """Exclusions as the placement engine takes them: replica id -> nodes it must not use (its cool-downs, and
    ``moving``: the nodes a replica being moved off a crowded node leaves, ``RebalanceOutcome.excluded``)."""
    out: dict[str, set[str]] = {}
    for rid, node in exclusions:
        out.setdefault(rid, set()).add(node)
    for rid, nodes in moving.items():
        out.setdefault(rid, set()).update(nodes)
    return {rid: frozenset(nodes) for rid, nodes in out.items()}
