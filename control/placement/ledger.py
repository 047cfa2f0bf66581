"""The plan's ledger: what is free on each online node and GPU while a plan is made (mutable, never exposed).

Nodes with identical labels and GPU products form a ``Pool``: eligibility is decided once per pool, and
each pool keeps its GPUs in two sorted lists so that a best fit is a bisect, not a scan of every GPU::

    pool.used  = sorted (free MiB, node, index)      of GPUs holding >= 1 replica
    pool.empty = sorted (capacity MiB, node, index)  of GPUs holding none
    node.hold(gpu, replica, mb):  take the entry out, change the GPU, put it back (the lists stay sorted)

Only healthy GPUs of online nodes are in the ledger.  ``plan`` writes it; ``explain`` reads it.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter

from sie.control.placement.demand import ReplicaDemand
from sie.control.placement.host_memory import HostOverheads, host_memory_mb
from sie.control.placement.inventory import NodeState


class Gpu:
    __slots__ = ("node", "index", "capacity", "free", "held", "models")

    def __init__(self, node: str, index: int, capacity: int) -> None:
        self.node, self.index, self.capacity, self.free = node, index, capacity, capacity
        self.held: dict[str, int] = {}  # replica id -> MiB
        self.models: Counter[str] = Counter()


class Pool:
    """Nodes with identical labels and GPU products; ``free_total`` (MiB) tells how abundant it still is."""

    __slots__ = ("sample", "names", "used", "empty", "free_total")

    def __init__(self, sample: NodeState) -> None:
        self.sample = sample
        self.names: list[str] = []
        self.used: list[tuple[int, str, int]] = []
        self.empty: list[tuple[int, str, int]] = []
        self.free_total = 0

    def index(self, g: Gpu) -> None:
        insort(self.used if g.held else self.empty, (g.free, g.node, g.index))

    def unindex(self, g: Gpu) -> None:
        index = self.used if g.held else self.empty
        entry = (g.free, g.node, g.index)
        i = bisect_left(index, entry)
        assert i < len(index) and index[i] == entry, f"GPU index out of sync at {g.node}/{g.index}"
        del index[i]


def pool_key(state: NodeState) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    return (tuple(sorted(state.labels.items())), tuple(sorted({g.product for g in state.gpus})))


class Node:
    __slots__ = ("state", "pool", "overheads", "cpu_free", "mem_free", "gpus", "models", "replicas")

    def __init__(self, state: NodeState, pool: Pool, overheads: HostOverheads) -> None:
        self.state, self.pool, self.overheads = state, pool, overheads
        self.cpu_free = float(state.cpu_count)
        self.mem_free: int | None = state.memory_mb or None
        self.gpus = {g.index: Gpu(state.name, g.index, g.capacity_mb) for g in state.gpus if g.healthy}
        self.models: Counter[str] = Counter()
        self.replicas = 0  # held by this plan, of every model: what a spreading search balances

    def mem_need(self, d: ReplicaDemand) -> int:
        """Host memory ``d`` holds on this node (declared + process overhead)."""
        return host_memory_mb(d, self.state, self.overheads)

    def hold(self, g: Gpu, rid: str, mb: int) -> None:
        self.pool.unindex(g)
        g.held[rid] = mb
        g.free -= mb
        self.pool.free_total -= mb
        self.pool.index(g)

    def unhold(self, g: Gpu, rid: str) -> None:
        self.pool.unindex(g)
        mb = g.held.pop(rid)
        g.free += mb
        self.pool.free_total += mb
        self.pool.index(g)
