"""Placement: which replica runs on which node and GPU (SIE's ``binpack`` strategy): the entry points.

Every rule with its reason: docs/control-plane.md, "Placement: the rules".  One plan::

    place(demands, inventory, current, excluded, preferred, preempt):
        keep each current placement still valid (node online and eligible, GPUs healthy, room, not excluded)
        for each other replica, P0, P1, P2, larger first, then by replica id (first-fit-decreasing):
            candidates = nodes its nodeSelector (GPU products by token), tier and exclusions allow
            preferred node first, if it fits (a soft hint: never evicts)
            anti-affinity: a node without a replica of the model first (soft: a shared node gets a ``note``);
                           a P0 replica prefers tier-0 nodes after that
            gpus = N:  N entirely free GPUs on the node left with the fewest free ones
            GPU memory: best fit among GPUs in use, else an empty GPU in the pool with the most free memory
            CPU only:  the node with the least CPU left
            every replica: cpu and host memory (declared + ``host_memory.process_overhead_mb``) fit the node
            no room and preempt: evict the cheapest lower-priority set on one node (P2 before P1, fewest,
                                 least memory beyond the need; never a P0), place the victims again
            still no room -> Unplaced with its reason (``preempted by ...`` first for a victim)

Who decides what: ``eligibility`` (which nodes and GPUs may hold a replica), ``plan`` (choosing among them,
keeping, evicting: the allocator; ``preemption`` picks the victims), ``explain`` (every reason's words),
``results`` (the plan as values).  Here: the full pass ``place``, the incremental ``Placer``, and ``Replanner``
(the reconcile pass's: a full pass whose allocator is kept, then only some models placed again).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from sie.control.placement.demand import ReplicaDemand
from sie.control.placement.eligibility import (
    TIER0_ONLY_P0,
    node_eligible,
    selector_matches,
    validate_tier_request,
)
from sie.control.placement.explain import UNSCHEDULABLE_PREFIX
from sie.control.placement.host_memory import HostOverheads
from sie.control.placement.inventory import ClusterInventory, NodeState
from sie.control.placement.plan import Allocator, full_pass, order_key, ordered, unique
from sie.control.placement.results import (
    Current,
    Excluded,
    Placement,
    PlacementPlan,
    PlanDiff,
    PlanStats,
    PlanUpdate,
    Preemption,
    Unplaced,
)

__all__ = [
    "TIER0_ONLY_P0", "UNSCHEDULABLE_PREFIX", "Current", "Excluded", "Placement", "PlacementPlan", "PlanDiff",
    "PlanStats", "PlanUpdate", "Placer", "Preemption", "Replanner", "Unplaced", "node_eligible", "place",
    "selector_matches", "validate_tier_request",
]


def place(
    demands: Iterable[ReplicaDemand],
    inventory: ClusterInventory,
    current: Current | None = None,
    excluded: Excluded | None = None,
    preempt: bool = False,
    overheads: HostOverheads | None = None,
    preferred: Mapping[str, str] | None = None,
) -> PlacementPlan:
    """Full placement pass: keep the still-valid ``current`` placements, then place the rest in priority
    order, never putting a replica on a node of ``excluded[replica_id]``; with ``preempt``, a P0/P1 replica
    that finds no room evicts lower-priority ones (module docstring); ``overheads``: the host memory a
    replica's process costs beyond its declared ``memory_mb`` (None: none counted); ``preferred``: replica id
    -> the node it should go to when it fits there (a soft hint, module docstring). Same inputs (in any
    order) -> equal plan."""
    return full_pass(demands, inventory, current, excluded, preempt, overheads, preferred).plan()


class Replanner:
    """A full pass, then passes that place only the models whose demands changed, on its kept allocator::

        place_all(demands, ...)          = place(demands, ...), the allocator kept
        replace({model: demands}, inv)   = release each model's replicas, keep each one's old slot when it is
                                           still valid, place the rest in order (preempting as the full pass
                                           does), re-evaluate every unplaced replica

    The other models keep their placements, as a full pass with this plan as ``current`` keeps every valid one.
    Where capacity is short a full pass may keep a changed model's slot and move another model's replica
    instead; ``replace`` moves the changed model's.  Valid only while the inventory, exclusions, hints and
    overheads are the ones ``place_all`` used: the caller places afresh when any changed.
    """

    def __init__(self) -> None:
        self._alloc: Allocator | None = None
        self._ids: dict[str, list[str]] = {}  # model -> its demanded replica ids
        #: (the placements of the plan before, those of the last ``replace``, the replica ids it placed or
        #: released): what a follower of the plans compares instead of every placement (None after ``place_all``)
        self.delta: tuple[Mapping[str, Any], Mapping[str, Any], frozenset[str]] | None = None
        self._last: Mapping[str, Any] | None = None

    @property
    def ready(self) -> bool:
        return self._alloc is not None

    def place_all(self, demands: Iterable[ReplicaDemand], inventory: ClusterInventory, current: Current | None = None,
                  excluded: Excluded | None = None, preempt: bool = False, overheads: HostOverheads | None = None,
                  preferred: Mapping[str, str] | None = None) -> PlacementPlan:
        demands = unique(demands)
        self._alloc = full_pass(demands, inventory, current, excluded, preempt, overheads, preferred)
        self._ids = {}
        for d in demands:
            self._ids.setdefault(d.model, []).append(d.replica_id)
        plan = self._alloc.plan()
        self.delta, self._last = None, plan.placements
        return plan

    def replace(self, demands: Mapping[str, list[ReplicaDemand]], inventory: ClusterInventory) -> PlacementPlan:
        """Place again the models of ``demands`` (model -> its demands now; empty: it is gone)."""
        alloc = self._alloc
        if alloc is None:
            raise RuntimeError("Replanner.replace before place_all")
        alloc.preempted = {}
        alloc.touched = set()
        slots: dict[str, tuple[str, tuple[int, ...]]] = {}
        for model in sorted(demands):
            for rid in self._ids.pop(model, ()):
                p = alloc.placements.get(rid)
                if p is not None:
                    slots[rid] = p.slot
                    alloc.release(rid)
                alloc.forget_unplaced(rid)
            if demands[model]:
                self._ids[model] = [d.replica_id for d in demands[model]]
        pending = []
        for d in ordered(unique(d for wanted in demands.values() for d in wanted)):
            slot = slots.get(d.replica_id)
            if slot is None or alloc.keep(d, *slot) is None:
                pending.append(d)
        for d in pending:
            alloc.place(d)
        alloc.refresh_unplaced()
        plan = alloc.plan()
        self.delta = None if self._last is None else (self._last, plan.placements, frozenset(alloc.touched))
        self._last = plan.placements
        return PlacementPlan(plan.placements, plan.unplaced, inventory, plan.preempted)


class Placer:
    """Holds the last plan and applies events to it incrementally (no full re-pass).

    Each event releases what it invalidates, then re-places the released replicas together with every
    replica still unplaced, in priority order; the result equals a full ``place()`` with the previous
    plan as ``current``. Every method returns a ``PlanUpdate`` (new plan + diff).
    """

    def __init__(self, inventory: ClusterInventory | None = None, excluded: Excluded | None = None,
                 overheads: HostOverheads | None = None) -> None:
        self._alloc = Allocator(inventory or ClusterInventory(), excluded, overheads=overheads)
        self._wanted: dict[str, ReplicaDemand] = {}
        self._plan = self._alloc.plan()

    @property
    def plan(self) -> PlacementPlan:
        return self._plan

    @property
    def inventory(self) -> ClusterInventory:
        return self._alloc.inventory

    def demands(self) -> list[ReplicaDemand]:
        return ordered(self._wanted.values())

    def place_all(
        self,
        demands: Iterable[ReplicaDemand],
        inventory: ClusterInventory | None = None,
        current: Current | None = None,
        excluded: Excluded | None = None,
    ) -> PlacementPlan:
        """Full pass; ``current`` defaults to this placer's last plan (stability across passes) and
        ``excluded`` to the exclusions in force."""
        demands = unique(demands)
        self._alloc = full_pass(demands, inventory or self._alloc.inventory, self._plan.placements if current is None else current,
                                 self._alloc.excluded if excluded is None else excluded, overheads=self._alloc.overheads)
        self._wanted = {d.replica_id: d for d in demands}
        self._plan = self._alloc.plan()
        return self._plan

    def add_model(self, demands: Iterable[ReplicaDemand]) -> PlanUpdate:
        """Add a model, or replace its demands (new version, scale up/down): replicas that keep their id
        stay where they are if that is still valid."""
        demands = unique(demands)
        models = {d.model for d in demands}
        if len(models) != 1:
            raise ValueError(f"add_model: demands must belong to exactly one model (got {sorted(models) or 'none'})")
        (name,) = models
        previous = {rid: self._alloc.placements.get(rid) for rid in self._model_ids(name)}
        self._forget(previous)
        pending = []
        for d in ordered(demands):
            self._wanted[d.replica_id] = d
            old = previous.get(d.replica_id)
            if old is None or self._alloc.keep(d, *old.slot) is None:
                pending.append(d.replica_id)
        return self._settle(set(previous) | set(pending))

    def remove_model(self, name: str) -> PlanUpdate:
        ids = self._model_ids(name)
        self._forget(ids)
        return self._settle(set(ids))

    def node_down(self, name: str) -> PlanUpdate:
        """A node went offline (heartbeat timeout): its replicas move; those that can't get a reason."""
        self._alloc.inventory = self._alloc.inventory.set_online(name, False)
        return self._settle(set(self._alloc.drop_node(name)))

    def node_up(self, node: NodeState) -> PlanUpdate:
        """A node registered or reported new state (labels, GPU health): replicas on it stay if still valid."""
        before = self._alloc.placements
        kept = sorted(
            (self._alloc.demands[rid] for rid, p in before.items() if p.node == node.name), key=order_key
        )
        slots = {d.replica_id: before[d.replica_id].slot for d in kept}
        released = self._alloc.drop_node(node.name)
        self._alloc.inventory = self._alloc.inventory.with_node(node)
        if node.online:
            self._alloc.add_node(node)
            for d in kept:
                self._alloc.keep(d, *slots[d.replica_id])
        return self._settle(set(released))

    def gpu_failed(self, node: str, index: int) -> PlanUpdate:
        """A GPU became unhealthy: the replicas on it (whole-GPU ones with all their GPUs) move."""
        self._alloc.inventory = self._alloc.inventory.set_gpu_health(node, index, False)
        return self._settle(set(self._alloc.fail_gpu(node, index)))

    def gpu_recovered(self, node: str, index: int) -> PlanUpdate:
        return self.node_up(self._alloc.inventory.node(node).with_gpu_health(index, True))

    def exclude(self, replica_id: str, nodes: Collection[str]) -> PlanUpdate:
        """Set the nodes ``replica_id`` must not use (empty = none): if it runs on one of them it moves;
        if it is unplaced it is retried (an exclusion lifted may let it in)."""
        if nodes:
            self._alloc.excluded[replica_id] = frozenset(nodes)
        else:
            self._alloc.excluded.pop(replica_id, None)
        current = self._alloc.placements.get(replica_id)
        touched = {replica_id}
        if current is not None and current.node in self._alloc.excluded.get(replica_id, ()):
            self._alloc.release(replica_id)
        return self._settle(touched)

    # -- internals

    def _model_ids(self, name: str) -> list[str]:
        return sorted(rid for rid, d in self._wanted.items() if d.model == name)

    def _forget(self, ids: Iterable[str]) -> None:
        for rid in ids:
            if rid in self._alloc.placements:
                self._alloc.release(rid)
            self._alloc.forget_unplaced(rid)
            self._wanted.pop(rid, None)

    def _settle(self, touched: set[str]) -> PlanUpdate:
        """Place every wanted replica that is not placed (released ones and earlier unplaced ones)."""
        touched |= set(self._alloc.unplaced)
        for d in ordered(self._wanted[rid] for rid in touched if rid in self._wanted and rid not in self._alloc.placements):
            self._alloc.place(d)
        self._alloc.refresh_unplaced()
        old, new = self._plan, self._alloc.plan()
        self._plan = new
        return PlanUpdate(new, _diff(old, new, touched))


def _diff(old: PlacementPlan, new: PlacementPlan, touched: Iterable[str]) -> PlanDiff:
    placed, moved, removed, unplaced = [], [], [], []
    for rid in sorted(touched):
        before, after = old.placements.get(rid), new.placements.get(rid)
        if after is not None:
            if before is None:
                placed.append(after)
            elif before != after:
                moved.append(after)
        else:
            if before is not None:
                removed.append(before)
            u = new.unplaced.get(rid)
            if u is not None and old.unplaced.get(rid) != u:
                unplaced.append(u)
    return PlanDiff(tuple(placed), tuple(moved), tuple(removed), tuple(unplaced))
