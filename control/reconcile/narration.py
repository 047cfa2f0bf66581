"""Step 6 of a pass, narration: what a plan did, as events and reasons an operator reads.

One pass (after placement)::

    plan = explain_exclusions(plan, exclusions)              # unplaced while cooling down: lead with the FAILED report
    plan, evicted = explain_preemptions(plan, evicted)       # still without a node: "preempted by ..." stays first
    events = placement_events(plan, published, ...)          # preempted, placed, moved, unschedulable, removed
    events += capacity_events(capacity plans, reported)      # a rollout's replica plan, when it says something new

=====================  ==========================================================================================
event                  when (each replica once per change, never every pass)
=====================  ==========================================================================================
``preempted``          a published replica is evicted for a higher priority one (drained; re-placed or not)
``placed``             a replica gets a node for the first time (``where``: node and GPUs, or cpu)
``moved``              its node or GPUs changed; why: eviction, node gone/offline, GPU failed, its cool-down
``unschedulable``      no node fits (again only when the reason changes, or it lost its node)
``removed``            no longer wanted: the director's release, the autoscaler's scale-down, or the spec
``rollout_capacity``   a model's rollout replica plan changed its reason
=====================  ==========================================================================================

Pure functions over a plan and values; what must persist between passes (the reasons already announced, the
replicas evicted) is passed in and returned.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from sie.control.placement.engine import PlacementPlan
from sie.control.placement.inventory import ClusterInventory
from sie.control.placement.rollout_capacity import CapacityPlan
from sie.control.reconcile.autoscaler import ScaleDecision
from sie.control.reconcile.ports import OutRecord
from sie.control.reconcile.records import AssignedReplica, AssignmentInfo

if TYPE_CHECKING:
    from sie.control.reconcile.cooldowns import Exclusions

#: the event of each autoscaler action
EVENT_OF_ACTION = {"up": "scaled_up", "down": "scaled_down", "to_zero": "scaled_to_zero",
                   "wake": "woke_from_zero", "blocked": "scale_blocked", "bounds": "scaled_to_bounds"}


def event(now: float, kind: str, model: str | None, replica_id: str | None, node: str | None, detail: str) -> OutRecord:
    """One ``ControlEvent``, keyed by its model, else its node, else ``cluster``."""
    key = model or node or "cluster"
    return OutRecord("events", key, "ControlEvent", {
        "ts_ms": int(now * 1000), "kind": kind, "model": model, "replica_id": replica_id, "node": node, "detail": detail,
    })


def why_moved(rid: str, node: str, gpus: tuple[int, ...], inventory: ClusterInventory, exclusions: Exclusions) -> str:
    """Why replica ``rid`` left ``node`` (and its ``gpus``)."""
    state = inventory.get(node)
    if state is None:
        return f"node {node} is no longer registered"
    if not state.online:
        return f"node {node} offline"
    bad = [i for i in gpus if not any(g.index == i and g.healthy for g in state.gpus)]
    if bad:
        return f"gpu {node}/{bad[0]} failed"
    if (rid, node) in exclusions:
        return f"replica FAILED on {node}: {exclusions[(rid, node)].reason}"
    return "spec or constraints changed"


def placement_events(plan: PlacementPlan, published: Mapping[str, AssignmentInfo], inventory: ClusterInventory,
                     exclusions: Exclusions, decisions: Mapping[str, ScaleDecision], released: Mapping[str, str],
                     reported: Mapping[str, str], now: float, only: Collection[str] | None = None,
                     ) -> tuple[list[OutRecord], dict[str, str]]:
    """The events of ``plan`` against the ``published`` assignments (table), and the unschedulable reasons
    announced so far (``reported``: replica id -> reason, updated).  ``released``: model -> why the traffic
    director released its replica this pass; ``decisions``: the autoscaler's, for a removal's reason.
    ``only``: with the last pass's plan, the nodes whose published record changed (the others are told)."""
    out: list[OutRecord] = []
    reported = dict(reported)
    before: dict[str, tuple[str, AssignedReplica]] = {}
    for node in sorted(published if only is None else (n for n in only if n in published)):
        for a in published[node].replicas:
            before.setdefault(a.replica_id, (node, a))
    placements = plan.placements if only is None else {
        rid: p for node in only for p in plan.by_node.get(node, ()) for rid in (p.replica_id,)}
    for rid, pre in sorted(plan.preempted.items()):
        if rid not in before:
            continue  # evicted in the plan only (never published there): nothing to drain
        now_at = plan.placements.get(rid)
        after = (f"re-placed on {now_at.node}" if now_at is not None else
                 "unschedulable: no other node has room")
        out.append(event(now, "preempted", pre.victim_model, rid, pre.node, f"{pre.describe()}; drained; {after}"))
    for rid, p in sorted(placements.items()):
        old = before.get(rid)
        where = f"{p.node}" + (f" gpu {','.join(map(str, p.gpu_indices))}" if p.gpu_indices else " (cpu)")
        if old is None:
            out.append(event(now, "placed", p.model, rid, p.node, f"{rid} placed on {where}" + (f" ({p.note})" if p.note else "")))
        elif (old[0], old[1].gpu_indices) != (p.node, tuple(p.gpu_indices)):
            why = (plan.preempted[rid].describe() if rid in plan.preempted
                   else why_moved(rid, old[0], old[1].gpu_indices, inventory, exclusions))
            out.append(event(now, "moved", p.model, rid, p.node, f"{rid} moved from {old[0]} to {where}: {why}"))
        reported.pop(rid, None)
    for rid, u in sorted(plan.unplaced.items()):
        old = before.get(rid)
        if reported.get(rid) == u.reason and old is None:
            continue
        detail = (u.reason if old is None else
                  f"{u.reason} (was on {old[0]}: {why_moved(rid, old[0], old[1].gpu_indices, inventory, exclusions)})")
        out.append(event(now, "unschedulable", u.model, rid, None, detail))
        reported[rid] = u.reason
    for rid, (node, a) in sorted(before.items()):
        if rid not in plan.placements and rid not in plan.unplaced:
            decision = decisions.get(a.model)
            why = (released.get(a.model)
                   or (f"scaled down ({decision.reason})" if decision is not None and decision.scaled
                       else "no longer desired"))
            out.append(event(now, "removed", a.model, rid, node, f"{rid} removed from {node}: {why}"))
    for rid in list(reported):
        if rid not in plan.placements and rid not in plan.unplaced:
            del reported[rid]
    return out, reported


def capacity_events(capacity: Mapping[str, CapacityPlan], reported: Mapping[str, str],
                    now: float) -> tuple[list[OutRecord], dict[str, str]]:
    """A ``rollout_capacity`` event each time a model's replica plan says something new (not every pass), and
    the reasons announced (``reported``: model -> reason, updated)."""
    out: list[OutRecord] = []
    reported = dict(reported)
    for name, plan in sorted(capacity.items()):
        if reported.get(name) != plan.reason:
            reported[name] = plan.reason
            out.append(event(now, "rollout_capacity", name, None, None, f"{plan.mode}: {plan.reason}"))
    for gone in set(reported) - set(capacity):
        del reported[gone]
    return out, reported


def explain_preemptions(plan: PlacementPlan, evicted: Mapping[str, str]) -> tuple[PlacementPlan, dict[str, str]]:
    """A replica evicted by an earlier pass and still without a node keeps "preempted by ..." leading its
    reason (the next pass only sees that no node has room, not why it lost its place).  ``evicted``: replica
    id -> why it was evicted, while it has no node again (returned updated)."""
    evicted = dict(evicted)
    for rid, pre in plan.preempted.items():
        evicted[rid] = pre.describe()
    for rid in list(evicted):
        if rid not in plan.unplaced:
            del evicted[rid]  # placed again, or no longer wanted
    stale = {rid: note for rid, note in evicted.items() if "preempted by" not in plan.unplaced[rid].reason}
    if not stale:
        return plan, evicted
    unplaced: dict[str, Any] = dict(plan.unplaced)
    for rid, note in stale.items():
        u = unplaced[rid]
        unplaced[rid] = replace(u, reason=f"unschedulable: {note}; no other node has room "
                                          f"({u.reason.removeprefix('unschedulable: ')})")
    return PlacementPlan(plan.placements, MappingProxyType(unplaced), plan.inventory, plan.preempted), evicted


def explain_exclusions(plan: PlacementPlan, exclusions: Exclusions) -> PlacementPlan:
    """Unplaced while excluded from some node: lead with the FAILED report that caused it."""
    if not exclusions or not plan.unplaced:
        return plan
    unplaced: dict[str, Any] = dict(plan.unplaced)
    for rid, u in plan.unplaced.items():
        nodes = sorted(n for r, n in exclusions if r == rid)
        if nodes:
            reason = f"unschedulable: FAILED on {', '.join(nodes)} (cool-down); no other eligible node fits"
            if "excluded from every eligible node" not in u.reason:
                reason += f" ({u.reason.removeprefix('unschedulable: ')})"
            unplaced[rid] = replace(u, reason=reason)
    return PlacementPlan(plan.placements, MappingProxyType(unplaced), plan.inventory, plan.preempted)
