"""Steps 4b and 5 of a pass: placement, and each node's Assignment where its replica set changed.

One pass::

    current  = current_of(published)                      # healthy replicas keep their node and GPUs
    inputs   = (demands, placement_view(inventory), current, excluded, preferred)
    plan     = memo.plan if inputs == memo.inputs else place(*inputs, preempt, overheads)
    records  = assignment_records(plan, published, Templates(snap, cache), rollout templates)   # changed nodes only

==========================================  ================================================================
a node ...                                  its Assignment record this pass
==========================================  ================================================================
replica set equal to the published one      none (the epoch is not compared)
nothing published and nothing placed        none
anything else                               every replica with its template's JSON and hash; the epoch and
                                            ``issued_at_ms`` are stamped at publish time
==========================================  ================================================================

Pure functions over the plan and values; ``PlacementMemo`` (owned by the ``Controller``) keeps the latest
placement's inputs and plan: most passes change nothing placement reads, and placing again is a large share
of a pass (bench/bench_scale.py).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sie.control.placement.demand import ReplicaDemand
from sie.control.placement.engine import PlacementPlan, Replanner
from sie.control.placement.host_memory import HostOverheads
from sie.control.placement.inventory import ClusterInventory
from sie.control.reconcile.connectors import connector_documents
from sie.control.reconcile.demands import Current, SpecCache, companions
from sie.control.reconcile.director import Extra
from sie.control.reconcile.ports import OutRecord
from sie.control.reconcile.records import AssignedReplica, AssignmentInfo, StateSnapshot
from sie.schemas.replica_template import ReplicaTemplate, template_from_json

#: the template of a replica whose model has no spec any more (its Assignment entry says so with an empty document)
NO_TEMPLATE = template_from_json("")


def current_of(published: Mapping[str, AssignmentInfo]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Replica id -> (node, GPU indices) of the ``published`` assignments (a replica on two nodes: the first
    node by name)."""
    current: dict[str, tuple[str, tuple[int, ...]]] = {}
    for node in sorted(published):
        for a in published[node].replicas:
            current.setdefault(a.replica_id, (node, a.gpu_indices))
    return current


def preferred(demands: Sequence[ReplicaDemand], floors: Mapping[str, Extra], moving: Mapping[str, str]) -> dict[str, str]:
    """Replica id -> the node placement should try first: the traffic director's added replica on its cooler
    node, then a rebalance move's target (``moving``)."""
    out = {d.replica_id: floors[d.model].node for d in demands
           if d.model in floors and d.index == floors[d.model].floor - 1}
    for rid, node in moving.items():
        out.setdefault(rid, node)
    return out


def placement_view(inventory: ClusterInventory) -> tuple[Any, ...]:
    """What placement reads of the inventory, as a comparable value: every node but its momentary available
    memory (shown to operators, never packed against; it moves with every heartbeat)."""
    return tuple((n.name, n.online, n.cpu_count, n.memory_mb, n.process_slots, tuple(sorted(n.labels.items())), n.gpus)
                 for n in inventory.nodes)


@dataclass
class PlacementMemo:
    """The inputs of the latest placement and its plan, and the allocator behind it (``Replanner``)."""

    inputs: tuple[Any, ...] | None = None
    plan: PlacementPlan | None = None
    replanner: Replanner = field(default_factory=Replanner)

    def place(self, demands: list[ReplicaDemand], inventory: ClusterInventory, current: Current,
              excluded: Mapping[str, frozenset[str]], preferred: Mapping[str, str], preempt: bool,
              overheads: HostOverheads) -> PlacementPlan:
        """``place``'s plan, or the latest one when its inputs are equal ("same inputs -> equal plan",
        placement module), over this pass's inventory."""
        inputs = (demands, placement_view(inventory), current, excluded, preferred)
        if self.plan is not None and self.inputs == inputs:
            return PlacementPlan(self.plan.placements, self.plan.unplaced, inventory, self.plan.preempted)
        plan = self.replanner.place_all(demands, inventory, current, excluded=excluded, preempt=preempt,
                                        overheads=overheads, preferred=preferred)
        self.inputs, self.plan = inputs, plan
        return plan

    def replace(self, demands: Mapping[str, list[ReplicaDemand]], inventory: ClusterInventory) -> PlacementPlan:
        """Place only the models of ``demands`` again (``Replanner.replace``); the next ``place`` places afresh
        unless its inputs equal the ones it last placed with."""
        self.plan = self.replanner.replace(demands, inventory)
        self.inputs = None
        return self.plan


class Templates(Mapping[str, ReplicaTemplate]):
    """model -> the replica template its Assignment entries carry, made when asked for (a pass writes the
    Assignments of a few nodes: building all 10,000 was most of a pass after one apply): a connector's, else its
    applied spec's (``SpecCache``)."""

    def __init__(self, snap: StateSnapshot, cache: SpecCache) -> None:
        self._specs, self._cache = snap.specs, cache
        self._connectors = {m: template_from_json(doc)
                            for m, doc in connector_documents(snap.connectors, snap.specs).items()}
        cache.trim(self._specs)

    def __getitem__(self, model: str) -> ReplicaTemplate:
        connector = self._connectors.get(model)
        if connector is not None:
            return connector
        return self._cache.template(model, self._specs[model])

    def __iter__(self) -> Iterator[str]:
        return iter(set(self._specs) | set(self._connectors))

    def __len__(self) -> int:
        return len(set(self._specs) | set(self._connectors))


def assignment_records(plan: PlacementPlan, published: Mapping[str, AssignmentInfo],
                       templates: Mapping[str, ReplicaTemplate],
                       versions: Mapping[tuple[str, str], ReplicaTemplate],
                       only: Collection[str] | None = None) -> list[OutRecord]:
    """An Assignment record per node whose replica set changed (table).  ``templates``: model -> its applied
    spec's (or connector's) template; ``versions``: (model, version) -> the template of a rollout version,
    which wins, and whose other version a replica serves as its companion.  ``only``: compare only these
    nodes (the others are known equal, ``incremental``)."""
    out: list[OutRecord] = []
    if only is None:
        nodes = set(plan.by_node) | {n for n, a in published.items() if a.replicas}
    else:
        nodes = {n for n in only if n in plan.by_node or (n in published and published[n].replicas)}
    for node in sorted(nodes):
        wanted = tuple(
            AssignedReplica(p.replica_id, p.model, p.version, tuple(p.gpu_indices), int(p.gpu_memory_mb),
                            t.json, companions(versions, p.model, p.version), t.hash)
            for p in plan.assignments(node)
            for t in (versions.get((p.model, p.version)) or templates.get(p.model) or NO_TEMPLATE,)
        )
        last = published.get(node)
        if last is not None and last.replicas == wanted:
            continue
        if last is None and not wanted:
            continue
        out.append(OutRecord("assignments", node, "Assignment", {
            "node": node,
            "epoch": 0,  # stamped at publish time with the leader epoch
            "issued_at_ms": 0,
            "replicas": [a.to_record() for a in wanted],
        }))
    return out
