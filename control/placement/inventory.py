"""Frozen view of the cluster's nodes and GPUs, as the agents report them.

WHY frozen: the placement engine is a pure function of (demands, inventory, current placement);
an event (node down, GPU failed) produces a new inventory value instead of mutating a shared one,
so a plan can always be recomputed from the exact inputs that produced it.

Free memory/CPU are NOT stored here: the placer derives them from the replicas it places
(requests vs capacity). What a GPU loses to things outside SIE (driver context, foreign
processes) is ``GpuState.memory_reserved_mb``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

TIER_LABEL = "sie.io/tier"
TIER0 = "tier-0"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


@dataclass(frozen=True)
class GpuState:
    """One GPU of a node. ``simulated`` GPUs come from agents started with a fake probe (tests, benches)."""

    index: int
    product: str
    memory_total_mb: int
    healthy: bool = True
    simulated: bool = False
    memory_reserved_mb: int = 0

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ValueError(f"GpuState.index: must be >= 0 (got {self.index})")
        if self.memory_total_mb < 0 or self.memory_reserved_mb < 0:
            raise ValueError(
                f"GpuState {self.index}: memory_total_mb/memory_reserved_mb must be >= 0 "
                f"(got {self.memory_total_mb}/{self.memory_reserved_mb})"
            )

    @property
    def capacity_mb(self) -> int:
        """Memory SIE may hand out on this GPU."""
        return max(0, self.memory_total_mb - self.memory_reserved_mb)


@dataclass(frozen=True)
class NodeState:
    """One node: labels (incl. ``sie.io/tier``), liveness, host capacity and GPUs.

    ``memory_mb``: host memory SIE may pack replicas into (total less what the warm pool holds); 0 means the
    agent did not report host memory: host memory is then not enforced on this node.
    ``memory_available_mb``: what the node's kernel last said is available (MemAvailable), None = not
    reported. Shown to operators, never packed against: it already excludes what running replicas use, and a
    number that moves with every heartbeat would make still-valid placements flap.
    ``process_slots``: how the node's agent runs replicas, from its heartbeat: None = not reported (an agent
    older than host-memory reporting; placement counts no process overhead there, only declared
    ``memoryMb``), 0 = every replica in a worker process of its own, N > 0 = small
    P1/P2 models share multi-model processes of N models each (``host_memory.process_overhead_mb``).
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    online: bool = True
    cpu_count: float = 8.0
    memory_mb: int = 0
    gpus: tuple[GpuState, ...] = ()
    memory_available_mb: int | None = None
    process_slots: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("NodeState.name: must not be empty")
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))
        gpus = tuple(sorted(self.gpus, key=lambda g: g.index))
        if len({g.index for g in gpus}) != len(gpus):
            raise ValueError(f"NodeState {self.name}: duplicate GPU index in {[g.index for g in gpus]}")
        object.__setattr__(self, "gpus", gpus)
        if self.cpu_count < 0:
            raise ValueError(f"NodeState {self.name}: cpu_count must be >= 0 (got {self.cpu_count})")
        for key in ("memory_mb", "memory_available_mb", "process_slots"):
            value = getattr(self, key)
            if value is not None and value < 0:
                raise ValueError(f"NodeState {self.name}: {key} must be >= 0 (got {value})")

    @property
    def tier(self) -> str | None:
        """The node's pool tier from the ``sie.io/tier`` label (None = general pool)."""
        return self.labels.get(TIER_LABEL)

    def gpu(self, index: int) -> GpuState:
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(f"node {self.name} has no GPU {index} (has {[g.index for g in self.gpus]})")

    def with_gpu_health(self, index: int, healthy: bool) -> NodeState:
        self.gpu(index)  # raises with a clear message
        return replace(
            self, gpus=tuple(replace(g, healthy=healthy) if g.index == index else g for g in self.gpus)
        )


@dataclass(frozen=True)
class ClusterInventory:
    """All known nodes, sorted by name (the order every tie-break uses, so plans are deterministic)."""

    nodes: tuple[NodeState, ...] = ()
    #: name -> node, for ``get`` (asked per node and model by a pass: a scan would make it nodes x nodes)
    _by_name: Mapping[str, NodeState] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        nodes = tuple(sorted(self.nodes, key=lambda n: n.name))
        by_name = {n.name: n for n in nodes}
        if len(by_name) != len(nodes):
            names = [n.name for n in nodes]
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"ClusterInventory: duplicate node names {dupes}")
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "_by_name", MappingProxyType(by_name))

    @classmethod
    def of(cls, nodes: Iterable[NodeState]) -> ClusterInventory:
        return cls(tuple(nodes))

    def names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)

    def get(self, name: str) -> NodeState | None:
        return self._by_name.get(name)

    def node(self, name: str) -> NodeState:
        n = self.get(name)
        if n is None:
            raise KeyError(f"unknown node {name!r} (known: {', '.join(self.names()) or 'none'})")
        return n

    def with_node(self, node: NodeState) -> ClusterInventory:
        """Add or replace a node (registration, heartbeat with new state)."""
        return ClusterInventory(tuple(n for n in self.nodes if n.name != node.name) + (node,))

    def without_node(self, name: str) -> ClusterInventory:
        return ClusterInventory(tuple(n for n in self.nodes if n.name != name))

    def set_online(self, name: str, online: bool) -> ClusterInventory:
        return self.with_node(replace(self.node(name), online=online))

    def set_gpu_health(self, name: str, index: int, healthy: bool) -> ClusterInventory:
        return self.with_node(self.node(name).with_gpu_health(index, healthy))
