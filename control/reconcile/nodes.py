"""Step 2 of a pass, nodes: the inventory placement packs against, its changes as events, nodes to forget.

One pass (``Controller``'s ``nodes`` and ``forget`` steps)::

    inventory = snap.inventory(now, node_timeout_s)            # liveness by heartbeat, GPU health
    decision  = guard.assess(now, *guard_inputs(inventory, snap), lag)
    inventory = held_online(inventory, decision)               # the mass-offline guard's held nodes count online
    events    = guard_events(decision) + transitions(inventory, memory)   # node_offline/online, gpu_failed/recovered
    events   += forget(snap, inventory, published, memory, now, after)     # tombstones + node_forgotten

=============================================  ==================================================================
a node ...                                     happens
=============================================  ==================================================================
goes offline / comes back                      ``node_offline`` / ``node_online`` (only on a change this process saw)
reports a GPU unhealthy / healthy again        ``gpu_failed`` / ``gpu_recovered``
offline, an operator asked to forget it        tombstones of its registration (and assignment), ``node_forgotten``
(after it was last alive), or offline for
``node_forget_after_s``
... while its assignment holds replicas        waits for the pass that moved them
... forgetting published < 10 s ago            nothing (not read back yet)
forgotten and read back (gone from the state)  its memory here is dropped (``read_back``)
=============================================  ==================================================================

Pure functions over the snapshot and the inventory; what persists between passes is ``NodeMemory`` (owned by
the ``Controller``), passed in and updated in place.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from sie.control.placement.inventory import ClusterInventory
from sie.control.reconcile.liveness import GuardDecision
from sie.control.reconcile.narration import event
from sie.control.reconcile.ports import OutRecord
from sie.control.reconcile.records import NODE_FORGOTTEN_KIND, AssignmentInfo, StateSnapshot

log = logging.getLogger(__name__)

#: a forgetting published this recently is not published again (it is on its way back through the state)
FORGET_REPUBLISH_S = 10.0


@dataclass
class NodeMemory:
    """What the node steps remember between passes (this process's own observations)."""

    #: node -> online at the last pass; (node, gpu index) -> healthy at the last pass
    online: dict[str, bool] = field(default_factory=dict)
    gpu_healthy: dict[tuple[str, int], bool] = field(default_factory=dict)
    #: node -> when this process first saw it offline (a node without a heartbeat in the replayed window)
    offline_since: dict[str, float] = field(default_factory=dict)
    #: node -> when this process published its forgetting (not again until read back, or 10 s later)
    forgetting: dict[str, float] = field(default_factory=dict)


def guard_inputs(inventory: ClusterInventory, snap: StateSnapshot) -> tuple[dict[str, float | None], set[str]]:
    """What ``MassOfflineGuard.assess`` takes: every node's latest proof of life, and the nodes online."""
    alive_at: dict[str, float | None] = {}
    for node in inventory.nodes:
        hb = snap.heartbeats.get(node.name)
        alive_at[node.name] = hb.alive_at if hb is not None else None
    return alive_at, {n.name for n in inventory.nodes if n.online}


def guard_events(decision: GuardDecision, now: float) -> list[OutRecord]:
    """The guard engaging or releasing, as events (and warnings in the log)."""
    out = []
    if decision.engaged:
        log.warning("liveness guard: %s", decision.engaged)
        out.append(event(now, "liveness_guard", None, None, None, decision.engaged))
    if decision.released:
        log.warning("liveness guard released: %s", decision.released)
        out.append(event(now, "liveness_guard_released", None, None, None, decision.released))
    return out


def held_online(inventory: ClusterInventory, decision: GuardDecision) -> ClusterInventory:
    """The mass-offline guard's verdict applied: held nodes count as online this pass."""
    if not decision.holding:
        return inventory
    return ClusterInventory.of(replace(n, online=True) if n.name in decision.holding else n for n in inventory.nodes)


def transitions(inventory: ClusterInventory, memory: NodeMemory, now: float, timeout_s: float) -> list[OutRecord]:
    """An event per node that went offline or came back, and per GPU whose health changed, since the last pass
    (``memory`` updated)."""
    out: list[OutRecord] = []
    for node in inventory.nodes:
        was = memory.online.get(node.name)
        if was is not None and was != node.online:
            kind = "node_online" if node.online else "node_offline"
            detail = (f"node {node.name} is back" if node.online
                      else f"node {node.name} offline: no heartbeat for > {timeout_s:g}s")
            out.append(event(now, kind, None, None, node.name, detail))
        memory.online[node.name] = node.online
        for g in node.gpus:
            key = (node.name, g.index)
            was_ok = memory.gpu_healthy.get(key)
            if was_ok is not None and was_ok != g.healthy:
                kind = "gpu_recovered" if g.healthy else "gpu_failed"
                out.append(event(now, kind, None, None, node.name,
                                 f"gpu {node.name}/{g.index} ({g.product}) "
                                 f"{'healthy again' if g.healthy else 'reported unhealthy'}"))
            memory.gpu_healthy[key] = g.healthy
    return out


def forget(snap: StateSnapshot, inventory: ClusterInventory, published: Mapping[str, AssignmentInfo],
           memory: NodeMemory, now: float, after_s: float) -> list[OutRecord]:
    """Forget offline nodes an operator asked to forget (after the node was last alive), or offline for
    ``after_s`` (``node_forget_after_s``; 0: never by time): tombstones of the registration and the assignment
    with a ``node_forgotten`` event, in this pass's transaction.  A node whose ``published`` assignment still
    holds replicas waits for the pass that moves them; a node held online by the mass-offline guard is online
    here."""
    out: list[OutRecord] = []
    for node in inventory.nodes:
        name = node.name
        if node.online:
            memory.offline_since.pop(name, None)
            continue
        hb = snap.heartbeats.get(name)
        last_alive = hb.alive_at if hb is not None else None
        offline_for = now - (last_alive if last_alive is not None else memory.offline_since.setdefault(name, now))
        asked = snap.forget_requests.get(name)
        if asked is not None and asked > (last_alive or 0.0):
            why = "an operator asked (sie node forget)"
        elif after_s > 0 and offline_for >= after_s:
            why = f"offline for {offline_for:.0f}s (control.node_forget_after_s: {after_s:g})"
        else:
            continue
        if now - memory.forgetting.get(name, float("-inf")) < FORGET_REPUBLISH_S:
            continue  # published, not read back yet
        assigned = published.get(name)
        if assigned is not None and assigned.replicas:
            continue  # its replicas are moved first (this pass's placement), then it is forgotten
        out.append(OutRecord("nodes", name, "NodeRegistration", None))
        if assigned is not None:
            out.append(OutRecord("assignments", name, "Assignment", None))
        out.append(event(now, NODE_FORGOTTEN_KIND, None, None, name,
                         f"node {name} forgotten: {why}; gone from inventory, status and alerts (an agent "
                         f"started on it again registers anew)"))
        memory.forgetting[name] = now
    return out


def read_back(snap: StateSnapshot, memory: NodeMemory) -> list[str]:
    """The forgotten nodes the state dropped (read back): their memory here is dropped too; returned so that
    the caller drops what else it keeps of them."""
    gone = [name for name in memory.forgetting if name not in snap.nodes and name not in snap.heartbeats]
    for name in gone:
        del memory.forgetting[name]
        memory.online.pop(name, None)
        memory.offline_since.pop(name, None)
    return gone
