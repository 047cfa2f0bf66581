"""What a plan is: the placement engine's results, plain frozen values (``place`` and ``Placer`` return them).

    PlacementPlan = one outcome per wanted replica: a Placement (node, GPUs, what it holds there, a ``note``
                    when a soft rule was relaxed) or an Unplaced (its reason, from ``explain``), the
                    evictions made for it (Preemption), and the inventory it was made for
    PlanUpdate    = an incremental event's new plan + what it changed (PlanDiff)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from sie.control.placement import explain
from sie.control.placement.inventory import ClusterInventory


@dataclass(frozen=True)
class Placement:
    """Where one replica runs. ``gpu_memory_mb`` is what it holds on its GPU(s); ``note`` explains a
    relaxed rule (anti-affinity)."""

    replica_id: str
    model: str
    version: str
    node: str
    gpu_indices: tuple[int, ...]
    gpu_memory_mb: int
    whole_gpus: bool = False
    note: str | None = None

    @property
    def slot(self) -> tuple[str, tuple[int, ...]]:
        return (self.node, self.gpu_indices)


@dataclass(frozen=True)
class Unplaced:
    """A replica that could not be placed; ``reason`` starts with ``unschedulable:``."""

    replica_id: str
    model: str
    version: str
    reason: str


@dataclass(frozen=True)
class Preemption:
    """A replica evicted so that a higher-priority one fits: ``victim`` left ``node``/``gpu_indices``
    for ``by``, which needed ``needed`` (what the victims held there is ``freed_mb``)."""

    victim: str
    victim_model: str
    victim_priority: str
    node: str
    gpu_indices: tuple[int, ...]
    by: str
    by_model: str
    by_priority: str
    needed: str
    freed_mb: int

    def describe(self) -> str:
        """``preempted by ...``: the event's text and the lead of the victim's reason (``explain``)."""
        return explain.preempted_by(self)


# The current placement given to a full pass: replica id -> Placement or (node, gpu indices).
Current = Mapping[str, Placement | tuple[str, Sequence[int]]]
# Nodes a replica must not be placed on: replica id -> node names.
Excluded = Mapping[str, Collection[str]]


@dataclass(frozen=True)
class PlanStats:
    replicas_placed: int
    replicas_unplaced: int
    gpus_healthy: int
    gpus_in_use: int
    nodes_in_use: int
    gpu_memory_placed_mb: int
    gpu_memory_capacity_in_use_mb: int
    relaxed_anti_affinity: int

    @property
    def utilisation(self) -> float:
        """GPU memory held by replicas / capacity of the GPUs hosting at least one replica."""
        cap = self.gpu_memory_capacity_in_use_mb
        return self.gpu_memory_placed_mb / cap if cap else 0.0


@dataclass(frozen=True)
class PlacementPlan:
    """The placer's output: one outcome per wanted replica. Compare plans with ``==``."""

    placements: Mapping[str, Placement]
    unplaced: Mapping[str, Unplaced]
    inventory: ClusterInventory
    #: evictions made by this plan: victim replica id -> Preemption
    preempted: Mapping[str, Preemption] = field(default_factory=lambda: MappingProxyType({}))

    def outcome(self, replica_id: str) -> Placement | Unplaced:
        found = self.placements.get(replica_id) or self.unplaced.get(replica_id)
        if found is None:
            raise KeyError(f"replica {replica_id!r} is not in this plan")
        return found

    def current(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """The ``current`` argument for the next full pass."""
        return {rid: p.slot for rid, p in self.placements.items()}

    @cached_property
    def by_node(self) -> Mapping[str, tuple[Placement, ...]]:
        """Per-node assignment lists (what the controller publishes to each agent), sorted by replica id.
        Every inventory node is present, an empty tuple meaning "run nothing"."""
        out: dict[str, list[Placement]] = {n.name: [] for n in self.inventory.nodes}
        for p in self.placements.values():
            out.setdefault(p.node, []).append(p)
        return MappingProxyType({k: tuple(sorted(v, key=lambda p: p.replica_id)) for k, v in out.items()})

    def assignments(self, node: str) -> tuple[Placement, ...]:
        return self.by_node.get(node, ())

    @cached_property
    def stats(self) -> PlanStats:
        capacity = {
            (n.name, g.index): g.capacity_mb for n in self.inventory.nodes if n.online for g in n.gpus if g.healthy
        }
        held: Counter[tuple[str, int]] = Counter()
        for p in self.placements.values():
            for gi in p.gpu_indices:
                key = (p.node, gi)
                held[key] += capacity.get(key, 0) if p.whole_gpus else p.gpu_memory_mb
        return PlanStats(
            replicas_placed=len(self.placements),
            replicas_unplaced=len(self.unplaced),
            gpus_healthy=len(capacity),
            gpus_in_use=len(held),
            nodes_in_use=len({p.node for p in self.placements.values()}),
            gpu_memory_placed_mb=sum(held.values()),
            gpu_memory_capacity_in_use_mb=sum(capacity.get(k, 0) for k in held),
            relaxed_anti_affinity=sum(1 for p in self.placements.values() if p.note),
        )


@dataclass(frozen=True)
class PlanDiff:
    """What an incremental event changed: ``removed`` holds the old placements that no longer exist
    (model removed, or the replica is now unplaced); ``moved`` holds the new placements of moved ones."""

    placed: tuple[Placement, ...] = ()
    moved: tuple[Placement, ...] = ()
    removed: tuple[Placement, ...] = ()
    unplaced: tuple[Unplaced, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.placed or self.moved or self.removed or self.unplaced)


@dataclass(frozen=True)
class PlanUpdate:
    plan: PlacementPlan
    diff: PlanDiff

