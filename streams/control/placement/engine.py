"""Placement: which replica runs on which node and GPU (SIE's ``binpack`` strategy).

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
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from sie.schemas.replica_state import ReplicaState
from sie.streams.control.placement.demand import ReplicaDemand
from sie.streams.control.placement.host_memory import HostOverheads, describe_need, host_memory_mb
from sie.streams.control.placement.inventory import GPU_PRODUCT_LABEL, TIER0, TIER_LABEL, ClusterInventory, NodeState

#: an unplaced replica's reason starts with its state word ("unschedulable: needs ..."): the status
#: line then reads the same whether it quotes the reason alone or "state: reason"
UNSCHEDULABLE_PREFIX = f"{ReplicaState.UNSCHEDULABLE.value.lower()}: "
TIER0_ONLY_P0 = "tier-0 nodes host only P0 models"
_CPU_EPSILON = 1e-9


# --------------------------------------------------------------------------------------------- results


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
        where = f"{self.node}" + (f" gpu {','.join(map(str, self.gpu_indices))}" if self.gpu_indices else "")
        return (f"preempted by {self.by} ({self.by_priority}, needs {self.needed}) on {where}: "
                f"{self.victim} is {self.victim_priority}")


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


# ------------------------------------------------------------------------------------------- matching


def _tokens(text: str) -> frozenset[str]:
    return frozenset(t for t in re.split(r"[\s_\-/]+", text.lower()) if t and t != "nvidia")


def _product_matches(want: str, product: str) -> bool:
    wanted = _tokens(want)
    return bool(wanted) and wanted <= _tokens(product)


def _label_value(node: NodeState, key: str) -> str | None:
    """The node's value for a selector key (the GPU products for the product key when the label is missing)."""
    value = node.labels.get(key)
    if value is None and key == GPU_PRODUCT_LABEL and node.gpus:
        value = "+".join(sorted({g.product for g in node.gpus}))
    return value


def _key_matches(node: NodeState, key: str, want: str) -> bool:
    have = node.labels.get(key)
    if have is not None:
        return have == want
    if key == GPU_PRODUCT_LABEL:
        return any(_product_matches(want, g.product) for g in node.gpus)
    return False


def selector_matches(selector: Iterable[tuple[str, str]], node: NodeState) -> bool:
    return all(_key_matches(node, k, v) for k, v in selector)


def _tier_allows(demand: ReplicaDemand, node: NodeState) -> bool:
    if node.tier == TIER0 and demand.priority != "P0":
        return False
    return demand.tier is None or node.tier == demand.tier


def node_eligible(demand: ReplicaDemand, node: NodeState) -> bool:
    """Static eligibility (selector + tier rules); ignores liveness and free capacity."""
    return _tier_allows(demand, node) and selector_matches(demand.node_selector, node)


def _names(names: Sequence[str]) -> str:
    return ", ".join(names) if len(names) <= 4 else f"{', '.join(names[:3])} and {len(names) - 3} more"


def _selector_reason(selector: tuple[tuple[str, str], ...], online: Sequence[NodeState]) -> str:
    for key, want in selector:
        if any(_key_matches(n, key, want) for n in online):
            continue
        groups: dict[str | None, list[str]] = {}
        for n in online:
            groups.setdefault(_label_value(n, key), []).append(n.name)
        parts = []
        for value in sorted(groups, key=lambda v: (v is None, v or "")):
            names = groups[value]
            verb = "has" if len(names) == 1 else "have"
            parts.append(f"{_names(names)} {verb} {value}" if value is not None else f"{_names(names)} {verb} no {key}")
        return f"no online node matches nodeSelector {key}={want} (nodes: {'; '.join(parts)})"
    wanted = ",".join(f"{k}={v}" for k, v in selector)
    return f"no online node matches nodeSelector {wanted} (each key matches some node, none matches all)"


def _asks_tier0(tier: str | None, selector: Mapping[str, str]) -> str | None:
    if tier == TIER0:
        return "scheduling.tier=tier-0"
    if selector.get(TIER_LABEL) == TIER0:
        return f"nodeSelector {TIER_LABEL}={TIER0}"
    return None


def validate_tier_request(spec, inventory: ClusterInventory) -> str | None:
    """Reason to refuse (HTTP 409 Conflict) a P1/P2 ModelService that asks for tier-0 nodes, else None.

    It asks for tier-0 by ``scheduling.tier: tier-0``, a ``sie.io/tier: tier-0`` selector, or a
    nodeSelector that only tier-0 nodes of the inventory match.
    """
    priority = spec.priority_level
    if priority == "P0":
        return None
    selector = dict(spec.scheduling.node_selector or {})
    via = _asks_tier0(spec.scheduling.tier, selector)
    if via is None and selector:
        matching = [n for n in inventory.nodes if selector_matches(selector.items(), n)]
        if matching and all(n.tier == TIER0 for n in matching):
            via = "nodeSelector " + ",".join(f"{k}={v}" for k, v in sorted(selector.items())) + " matches only tier-0 nodes"
    if via is None:
        return None
    return f"{TIER0_ONLY_P0}: {spec.name} is {priority} and asks for tier-0 nodes ({via})"


def _order_key(d: ReplicaDemand) -> tuple:
    return (d.priority_rank, -d.gpus, -d.gpu_memory_mb, -d.cpu, -d.memory_mb, d.model, d.index)


def _ordered(demands: Iterable[ReplicaDemand]) -> list[ReplicaDemand]:
    return sorted(demands, key=_order_key)


def _unique(demands: Iterable[ReplicaDemand]) -> list[ReplicaDemand]:
    out: dict[str, ReplicaDemand] = {}
    for d in demands:
        if d.replica_id in out and out[d.replica_id] != d:
            raise ValueError(f"replica {d.replica_id!r} is demanded twice with different resources")
        out[d.replica_id] = d
    return list(out.values())


# ------------------------------------------------------------------------------------------ allocator


class _Gpu:
    __slots__ = ("node", "index", "capacity", "free", "held", "models")

    def __init__(self, node: str, index: int, capacity: int) -> None:
        self.node, self.index, self.capacity, self.free = node, index, capacity, capacity
        self.held: dict[str, int] = {}  # replica id -> MiB
        self.models: Counter[str] = Counter()


class _Pool:
    """Nodes with identical labels and GPU products: eligibility is decided once per pool. Each pool keeps
    two sorted lists so best fit is a bisect, not a scan of every GPU: ``used`` = (free MiB, node, index)
    of GPUs hosting >= 1 replica, ``empty`` = (capacity MiB, node, index) of GPUs hosting none.
    ``free_total`` (MiB) tells how abundant the pool still is."""

    __slots__ = ("sample", "names", "used", "empty", "free_total")

    def __init__(self, sample: NodeState) -> None:
        self.sample = sample
        self.names: list[str] = []
        self.used: list[tuple[int, str, int]] = []
        self.empty: list[tuple[int, str, int]] = []
        self.free_total = 0


class _Node:
    __slots__ = ("state", "pool", "overheads", "cpu_free", "mem_free", "gpus", "models")

    def __init__(self, state: NodeState, pool: _Pool, overheads: HostOverheads) -> None:
        self.state, self.pool, self.overheads = state, pool, overheads
        self.cpu_free = float(state.cpu_count)
        self.mem_free: int | None = state.memory_mb or None
        self.gpus = {g.index: _Gpu(state.name, g.index, g.capacity_mb) for g in state.gpus if g.healthy}
        self.models: Counter[str] = Counter()

    def mem_need(self, d: ReplicaDemand) -> int:
        """Host memory ``d`` holds on this node (declared + process overhead)."""
        return host_memory_mb(d, self.state, self.overheads)

    def fits_host(self, d: ReplicaDemand) -> bool:
        return self.cpu_free + _CPU_EPSILON >= d.cpu and (self.mem_free is None or self.mem_free >= self.mem_need(d))


def _cpu_free(node: _Node) -> str:
    """``0 of 2 CPU free``: what the node's replicas have not declared."""
    return f"{max(0.0, node.cpu_free):g} of {node.state.cpu_count:g} CPU free"


def _pool_key(state: NodeState) -> tuple:
    return (tuple(sorted(state.labels.items())), tuple(sorted({g.product for g in state.gpus})))


class _Allocator:
    """Mutable free-capacity bookkeeping behind ``place`` and ``Placer`` (never exposed)."""

    def __init__(self, inventory: ClusterInventory, excluded: Excluded | None = None, preempt: bool = False,
                 overheads: HostOverheads | None = None, preferred: Mapping[str, str] | None = None) -> None:
        self.inventory = inventory
        self.preferred: dict[str, str] = dict(preferred or {})
        self.preempt = preempt
        self.overheads = overheads or HostOverheads()
        self.preempted: dict[str, Preemption] = {}
        self.excluded: dict[str, frozenset[str]] = {rid: frozenset(n) for rid, n in (excluded or {}).items() if n}
        self.nodes: dict[str, _Node] = {}
        self.pools: dict[tuple, _Pool] = {}
        self.placements: dict[str, Placement] = {}
        self.unplaced: dict[str, Unplaced] = {}
        self.demands: dict[str, ReplicaDemand] = {}  # of placed replicas
        self.unplaced_demands: dict[str, ReplicaDemand] = {}
        self._eligible_cache: dict[tuple, list[tuple[int, _Pool]]] = {}
        #: (demand shape, id of a live pool) -> eligible: cleared with the pools (an id may be reused)
        self._allows_cache: dict[tuple, bool] = {}
        for state in inventory.nodes:
            if state.online:
                self.add_node(state)

    def plan(self) -> PlacementPlan:
        return PlacementPlan(
            MappingProxyType(dict(self.placements)), MappingProxyType(dict(self.unplaced)), self.inventory,
            MappingProxyType({rid: p for rid, p in self.preempted.items()}),
        )

    # -- nodes and GPUs

    def add_node(self, state: NodeState) -> None:
        key = _pool_key(state)
        pool = self.pools.get(key)
        if pool is None:
            pool = self.pools[key] = _Pool(state)
            self._eligible_cache.clear()
            self._allows_cache.clear()
        insort(pool.names, state.name)
        node = self.nodes[state.name] = _Node(state, pool, self.overheads)
        for g in node.gpus.values():
            self._index_add(pool, g)
            pool.free_total += g.free

    def drop_node(self, name: str) -> list[str]:
        node = self.nodes.get(name)
        if node is None:
            return []
        released = sorted(rid for rid, p in self.placements.items() if p.node == name)
        for rid in released:
            self.release(rid)
        pool = node.pool
        for g in node.gpus.values():
            self._index_remove(pool, g)
            pool.free_total -= g.free
        pool.names.remove(name)
        del self.nodes[name]
        if not pool.names:
            del self.pools[_pool_key(pool.sample)]
            self._eligible_cache.clear()
            self._allows_cache.clear()
        return released

    def fail_gpu(self, name: str, index: int) -> list[str]:
        node = self.nodes.get(name)
        g = node.gpus.get(index) if node else None
        if node is None or g is None:
            return []
        released = sorted(g.held)
        for rid in released:
            self.release(rid)
        self._index_remove(node.pool, g)
        node.pool.free_total -= g.free
        del node.gpus[index]
        return released

    @staticmethod
    def _index_add(pool: _Pool, g: _Gpu) -> None:
        insort(pool.used if g.held else pool.empty, (g.free, g.node, g.index))

    @staticmethod
    def _index_remove(pool: _Pool, g: _Gpu) -> None:
        index = pool.used if g.held else pool.empty
        entry = (g.free, g.node, g.index)
        i = bisect_left(index, entry)
        assert i < len(index) and index[i] == entry, f"GPU index out of sync at {g.node}/{g.index}"
        del index[i]

    def _hold(self, node: _Node, g: _Gpu, rid: str, mb: int) -> None:
        self._index_remove(node.pool, g)
        g.held[rid] = mb
        g.free -= mb
        node.pool.free_total -= mb
        self._index_add(node.pool, g)

    def _unhold(self, node: _Node, g: _Gpu, rid: str) -> None:
        self._index_remove(node.pool, g)
        mb = g.held.pop(rid)
        g.free += mb
        node.pool.free_total += mb
        self._index_add(node.pool, g)

    # -- commit / release

    def release(self, rid: str) -> None:
        p = self.placements.pop(rid)
        d = self.demands.pop(rid)
        node = self.nodes[p.node]
        node.cpu_free += d.cpu
        if node.mem_free is not None:
            node.mem_free += node.mem_need(d)
        node.models[d.model] -= 1
        for gi in p.gpu_indices:
            g = node.gpus.get(gi)
            if g is not None:
                g.models[d.model] -= 1
                self._unhold(node, g, rid)

    def _commit(self, d: ReplicaDemand, node: _Node, gpus: Sequence[_Gpu]) -> Placement:
        note = None
        if node.models[d.model]:
            where = f"GPU {node.state.name}/{gpus[0].index}" if any(g.models[d.model] for g in gpus) else f"node {node.state.name}"
            note = f"anti-affinity relaxed: shares {where} with another replica of {d.model} (no other node fits)"
        whole = d.gpus > 0
        for g in gpus:
            g.models[d.model] += 1
            self._hold(node, g, d.replica_id, g.free if whole else d.gpu_memory_mb)
        node.cpu_free -= d.cpu
        if node.mem_free is not None:
            node.mem_free -= node.mem_need(d)
        node.models[d.model] += 1
        p = Placement(
            replica_id=d.replica_id,
            model=d.model,
            version=d.version,
            node=node.state.name,
            gpu_indices=tuple(g.index for g in gpus),
            gpu_memory_mb=sum(g.held[d.replica_id] for g in gpus),
            whole_gpus=whole,
            note=note,
        )
        self.placements[d.replica_id] = p
        self.demands[d.replica_id] = d
        self.forget_unplaced(d.replica_id)
        return p

    def forget_unplaced(self, rid: str) -> None:
        self.unplaced.pop(rid, None)
        self.unplaced_demands.pop(rid, None)

    def refresh_unplaced(self) -> None:
        """Re-evaluate every unplaced replica against the final state, so its reason describes the cluster
        as the plan leaves it (and a fresh pass, a stable pass and an incremental event agree)."""
        for d in _ordered(self.unplaced_demands.values()):
            self.place(d)

    def _fail(self, d: ReplicaDemand, reason: str) -> Unplaced:
        evicted = self.preempted.get(d.replica_id)
        if evicted is not None:
            reason = f"{evicted.describe()}; no other node has room ({reason})"
        u = Unplaced(d.replica_id, d.model, d.version, UNSCHEDULABLE_PREFIX + reason)
        self.unplaced[d.replica_id] = u
        self.unplaced_demands[d.replica_id] = d
        return u

    # -- keep an existing placement

    def keep(self, d: ReplicaDemand, node_name: str, gpu_indices: Sequence[int]) -> Placement | None:
        """Re-commit a current placement if it is still valid; None when it must be re-placed."""
        node = self.nodes.get(node_name)
        if node is None or d.replica_id in self.placements or node_name in self._banned(d):
            return None
        if not self._pool_allows(d, node.pool) or not node.fits_host(d):
            return None
        gpus = [g for i in gpu_indices if (g := node.gpus.get(i)) is not None]
        if len(gpus) != len(gpu_indices) or len(set(gpu_indices)) != len(gpus):
            return None
        if d.gpus > 0:
            per = math.ceil(d.gpu_memory_mb / d.gpus)
            ok = len(gpus) == d.gpus and all(not g.held and g.capacity >= per and g.capacity > 0 for g in gpus)
        elif d.gpu_memory_mb > 0:
            ok = len(gpus) == 1 and gpus[0].free >= d.gpu_memory_mb
        else:
            ok = not gpus
        return self._commit(d, node, gpus) if ok else None

    # -- search

    def _eligible(self, d: ReplicaDemand) -> list[tuple[int, _Pool]]:
        key = (d.priority, d.tier, d.node_selector)
        pools = self._eligible_cache.get(key)
        if pools is None:
            pools = sorted(
                (
                    (1 if d.priority == "P0" and pool.sample.tier != TIER0 else 0, pool)
                    for pool in self.pools.values()
                    if node_eligible(d, pool.sample)
                ),
                key=lambda t: (t[0], t[1].names[0]),
            )
            self._eligible_cache[key] = pools
        return pools

    def _pool_allows(self, d: ReplicaDemand, pool: _Pool) -> bool:
        """``node_eligible`` for every node of ``pool`` (same labels, tier and GPU products), once per demand
        shape: asked for every kept replica, every pass (3,000 selector checks a pass at 1,000 models)."""
        key = (d.priority, d.tier, d.node_selector, id(pool))
        ok = self._allows_cache.get(key)
        if ok is None:
            ok = self._allows_cache[key] = node_eligible(d, pool.sample)
        return ok

    def _banned(self, d: ReplicaDemand) -> frozenset[str]:
        return self.excluded.get(d.replica_id, frozenset())

    def place(self, d: ReplicaDemand) -> Placement | Unplaced:
        """Place ``d`` by the rules; when it finds no room and may preempt, evict for it (module docstring)."""
        hinted = self._place_preferred(d)
        if hinted is not None:
            return hinted
        out = self._place_plain(d)
        if isinstance(out, Unplaced) and self.preempt and d.priority != "P2":
            placed = self._preempt(d)
            if placed is not None:
                return placed
        return out

    def _place_preferred(self, d: ReplicaDemand) -> Placement | None:
        """The soft node hint (module docstring), the one place it is honoured: place ``d`` by the usual rules
        with every other node banned; None (and nothing recorded) when the preferred node does not fit."""
        node = self.preferred.get(d.replica_id)
        if node is None or node not in self.nodes or node in self._banned(d):
            return None
        saved = self.excluded.get(d.replica_id)
        self.excluded[d.replica_id] = frozenset(self.nodes) - {node} | (saved or frozenset())
        try:
            out = self._place_plain(d)
        finally:
            if saved is None:
                del self.excluded[d.replica_id]
            else:
                self.excluded[d.replica_id] = saved
        if isinstance(out, Placement):
            return out
        self.forget_unplaced(d.replica_id)
        return None

    def _place_plain(self, d: ReplicaDemand) -> Placement | Unplaced:
        pools = self._eligible(d)
        if not pools:
            return self._fail(d, self._explain_no_node(d))
        banned = self._banned(d)
        if banned and all(n in banned for _, pool in pools for n in pool.names):
            names = sorted(n for _, pool in pools for n in pool.names)
            return self._fail(d, f"{d.replica_id} is excluded from every eligible node ({_names(names)})")
        if d.gpus > 0:
            return self._place_whole(d, pools)
        if d.gpu_memory_mb > 0:
            return self._place_shared(d, pools)
        return self._place_cpu(d, pools)

    # -- preemption

    def _victims(self, d: ReplicaDemand, node: _Node, rids: Iterable[str]) -> list[ReplicaDemand] | None:
        """The demands behind ``rids`` if every one may be evicted for ``d`` (strictly lower priority)."""
        out = []
        for rid in sorted(set(rids)):
            v = self.demands[rid]
            if v.priority_rank <= d.priority_rank:
                return None
            out.append(v)
        return out

    def _host_fits_after(self, d: ReplicaDemand, node: _Node, victims: Sequence[ReplicaDemand]) -> bool:
        cpu = node.cpu_free + sum(v.cpu for v in victims)
        if cpu + _CPU_EPSILON < d.cpu:
            return False
        return node.mem_free is None or node.mem_free + sum(node.mem_need(v) for v in victims) >= node.mem_need(d)

    def _greedy(self, d: ReplicaDemand, node: _Node, held: Mapping[str, int], missing_mb: int) -> list[ReplicaDemand] | None:
        """Fewest evictable replicas of ``held`` (rid -> MiB) that free ``missing_mb`` and the host room:
        P2 before P1, largest first (largest-first needs the fewest to cover an amount)."""
        pool = [(self.demands[rid], mb) for rid, mb in held.items() if self.demands[rid].priority_rank > d.priority_rank]
        pool.sort(key=lambda vm: (-vm[0].priority_rank, -vm[1], vm[0].replica_id))
        chosen: list[ReplicaDemand] = []
        freed = 0
        for v, mb in pool:
            if freed >= missing_mb and self._host_fits_after(d, node, chosen):
                break
            chosen.append(v)
            freed += mb
        if freed < missing_mb or not self._host_fits_after(d, node, chosen):
            return None
        return chosen

    def _eviction(self, d: ReplicaDemand, node: _Node) -> tuple[tuple, list[ReplicaDemand], list[_Gpu]] | None:
        """The cheapest eviction on ``node`` that makes room for ``d``: (cost, victims, gpus to use)."""
        def cost(victims: Sequence[ReplicaDemand], freed: int, need: int, extra: tuple = ()) -> tuple:
            uses_p1 = any(v.priority == "P1" for v in victims)
            return (uses_p1, len(victims), freed - need, *extra)

        best: tuple[tuple, list[ReplicaDemand], list[_Gpu]] | None = None
        if d.gpus > 0:
            per = math.ceil(d.gpu_memory_mb / d.gpus)
            options = []
            for g in node.gpus.values():
                if g.capacity < per or g.capacity <= 0:
                    continue
                victims = self._victims(d, node, g.held)
                if victims is not None:
                    options.append((len(victims), -min((v.priority_rank for v in victims), default=3), g.index, g, victims))
            if len(options) < d.gpus:
                return None
            options.sort(key=lambda o: (o[1], o[0], o[2]))
            chosen = options[: d.gpus]
            victims = list({v.replica_id: v for o in chosen for v in o[4]}.values())
            if not victims or not self._host_fits_after(d, node, victims):
                return None
            freed = sum(sum(o[3].held.values()) for o in chosen)
            return cost(victims, freed, 0), victims, sorted((o[3] for o in chosen), key=lambda g: g.index)
        if d.gpu_memory_mb > 0:
            for g in sorted(node.gpus.values(), key=lambda g: g.index):
                if g.capacity < d.gpu_memory_mb:
                    continue
                victims = self._greedy(d, node, g.held, d.gpu_memory_mb - g.free)
                if not victims:
                    continue
                freed = sum(g.held[v.replica_id] for v in victims)
                level = 0 if not node.models[d.model] else 1
                cand = (cost(victims, freed, d.gpu_memory_mb - g.free, (level, g.index)), victims, [g])
                if best is None or cand[0] < best[0]:
                    best = cand
            return best
        held = {rid: 0 for rid, p in self.placements.items() if p.node == node.state.name}
        victims = self._greedy(d, node, held, 0)
        if not victims:
            return None
        return cost(victims, 0, 0), victims, []

    def _preempt(self, d: ReplicaDemand) -> Placement | None:
        """Evict the cheapest set of lower-priority replicas on one eligible node for ``d``, place ``d`` there,
        then place the evicted replicas again (elsewhere if there is room)."""
        banned = self._banned(d)
        best: tuple | None = None
        for pref, pool in self._eligible(d):
            for name in pool.names:
                node = self.nodes[name]
                if name in banned:
                    continue
                found = self._eviction(d, node)
                if found is not None and (best is None or (found[0], pref, name) < best[0]):
                    best = ((found[0], pref, name), node, found[1], found[2])
        if best is None:
            return None
        _, node, victims, gpus = best
        needed = (f"{d.gpus} whole GPU(s)" if d.gpus else f"{d.gpu_memory_mb} MiB GPU memory" if d.gpu_memory_mb
                  else f"{d.cpu:g} CPU" + (f", {node.mem_need(d)} MiB host memory" if node.mem_free is not None
                                            and node.mem_need(d) else ""))
        for v in victims:
            p = self.placements[v.replica_id]
            freed = sum(self.nodes[p.node].gpus[i].held.get(v.replica_id, 0) for i in p.gpu_indices if i in node.gpus)
            self.preempted[v.replica_id] = Preemption(
                v.replica_id, v.model, v.priority, p.node, p.gpu_indices, d.replica_id, d.model, d.priority, needed, freed)
            self.release(v.replica_id)
        placed = self._commit(d, node, gpus)
        for v in _ordered(victims):
            self.place(v)
        return placed

    def _place_shared(self, d: ReplicaDemand, pools: list[tuple[int, _Pool]]) -> Placement | Unplaced:
        """Best fit among GPUs already in use; only when none fits, open an empty GPU, taken from the most
        abundant eligible pool (most free MiB) so scarce pools (e.g. L4 nodes that some models pin) are
        not drained by models that could run anywhere."""
        need, model = d.gpu_memory_mb, d.model
        banned = self._banned(d)
        probe = (need, "", -1)
        best: tuple | None = None  # (level, pref, is_empty, ...)
        for pref, pool in pools:
            for is_empty, index in ((0, pool.used), (1, pool.empty)):
                if best is not None and best[0] == 0 and (best[1], best[2]) < (pref, is_empty):
                    continue  # this list cannot beat an anti-affine candidate already found
                for j in range(bisect_left(index, probe), len(index)):
                    free, name, gi = index[j]
                    node = self.nodes[name]
                    if name in banned or not node.fits_host(d):
                        continue
                    level = 0 if not node.models[model] else (2 if node.gpus[gi].models[model] else 1)
                    cand: tuple[int | str, ...]
                    if is_empty:
                        cand = (level, pref, 1, -pool.free_total, free - need, name, gi)
                    else:
                        cand = (level, pref, 0, free - need, name, gi)
                    if best is None or cand < best:
                        best = cand
                    if level == 0:
                        break  # sorted by free: the first anti-affine GPU is this list's best fit
        if best is None:
            return self._fail(d, self._explain_gpu_memory(d, pools))
        node = self.nodes[best[-2]]
        return self._commit(d, node, [node.gpus[best[-1]]])

    def _explain_gpu_memory(self, d: ReplicaDemand, pools: list[tuple[int, _Pool]]) -> str:
        need = d.gpu_memory_mb
        banned = self._banned(d)
        largest: tuple[int, str, int] | None = None
        for _, pool in pools:
            for index in (pool.used, pool.empty):
                allowed = [e for e in index if e[1] not in banned] if banned else index
                if allowed:
                    entry = allowed[bisect_left(allowed, (allowed[-1][0], "", -1))]
                    if largest is None or (-entry[0], entry[1], entry[2]) < (-largest[0], largest[1], largest[2]):
                        largest = entry
        if largest is None:
            return f"needs {need} MiB GPU memory; no healthy GPU on eligible nodes"
        if largest[0] >= need:
            return self._explain_host(d, pools, what=f"{need} MiB GPU memory")
        return f"needs {need} MiB GPU memory; largest free is {largest[0]} MiB on {largest[1]}/{largest[2]}"

    def _place_whole(self, d: ReplicaDemand, pools: list[tuple[int, _Pool]]) -> Placement | Unplaced:
        per = math.ceil(d.gpu_memory_mb / d.gpus)
        best: tuple | None = None
        chosen: list[_Gpu] = []
        most = (0, "")
        banned = self._banned(d)
        for pref, pool in pools:
            for name in pool.names:
                if name in banned:
                    continue
                node = self.nodes[name]
                free = [g for g in node.gpus.values() if not g.held and g.capacity >= per and g.capacity > 0]
                if len(free) > most[0]:
                    most = (len(free), name)
                if len(free) < d.gpus or not node.fits_host(d):
                    continue
                cand = (0 if not node.models[d.model] else 1, pref, len(free) - d.gpus, name)
                if best is None or cand < best:
                    best = cand
                    chosen = sorted(free, key=lambda g: (g.capacity, g.index))[: d.gpus]
        if best is None:
            each = f" with >= {per} MiB each" if per else ""
            if most[0] >= d.gpus:
                return self._fail(d, self._explain_host(d, pools, what=f"{d.gpus} whole free GPU(s){each}"))
            where = f" on {most[1]}" if most[0] else ""
            return self._fail(
                d, f"needs {d.gpus} whole free GPU(s){each} on one node; most on one node is {most[0]}{where}"
            )
        return self._commit(d, self.nodes[best[3]], sorted(chosen, key=lambda g: g.index))

    def _place_cpu(self, d: ReplicaDemand, pools: list[tuple[int, _Pool]]) -> Placement | Unplaced:
        best: tuple | None = None
        banned = self._banned(d)
        for pref, pool in pools:
            for name in pool.names:
                node = self.nodes[name]
                if name not in banned and node.fits_host(d):
                    cand = (0 if not node.models[d.model] else 1, pref, node.cpu_free - d.cpu, name)
                    if best is None or cand < best:
                        best = cand
        if best is None:
            return self._fail(d, self._explain_host(d, pools, what=None))
        return self._commit(d, self.nodes[best[3]], [])

    def _explain_host(self, d: ReplicaDemand, pools: list[tuple[int, _Pool]], what: str | None) -> str:
        """Why no eligible node has the CPU and host memory ``d`` declares (after ``what``, e.g. its GPU, did
        fit somewhere).  CPU is packed by what the placed replicas declare (``resources.cpu``), never by
        their load, so a node whose cores sit idle can be full: the reason says *declared* CPU, and which
        resource ran out on which node, so nobody hunts for a memory problem that is not there."""
        banned = self._banned(d)
        nodes = [self.nodes[n] for _, pool in pools for n in pool.names if n not in banned]
        cpu_short = [n for n in nodes if n.cpu_free + _CPU_EPSILON < d.cpu]
        mem_short = [n for n in nodes if n.mem_free is not None and n.mem_free < n.mem_need(d)]
        if len(cpu_short) == len(nodes):
            node = min(nodes, key=lambda n: (-n.cpu_free, n.state.name))
            where = f"on {node.state.name}:" if len(nodes) == 1 else f"on every eligible node; most free on {node.state.name}:"
            return (f"needs {d.cpu:g} CPU; declared CPU is used up {where} {_cpu_free(node)} (its replicas declare "
                    f"{node.state.cpu_count - node.cpu_free:g}; CPU is packed by resources.cpu, not by load)")
        if len(mem_short) == len(nodes):
            mem_node = min(mem_short, key=lambda n: (-(n.mem_free or 0), n.state.name))
            need = describe_need(d, mem_node.state, self.overheads)
            return f"needs {need}; most free is {mem_node.mem_free} MiB on {mem_node.state.name}"
        host = [describe_need(d, nodes[0].state, self.overheads)] if nodes[0].mem_need(d) else []
        parts = ([what] if what else []) + [f"{d.cpu:g} CPU"] + host
        short = [f"{n.state.name}: {_cpu_free(n)} (declared)" if n in cpu_short else
                 f"{n.state.name}: {n.mem_free} MiB host memory free" for n in dict.fromkeys(cpu_short + mem_short)]
        more = f"; and {len(short) - 3} more" if len(short) > 3 else ""
        return (f"needs {', '.join(parts)} on one node; no eligible node has all of them free"
                + (f" ({'; '.join(short[:3])}{more})" if short else ""))

    def _explain_no_node(self, d: ReplicaDemand) -> str:
        online = [n for n in self.inventory.nodes if n.online]
        if not online:
            return "no online nodes"
        if d.priority != "P0" and _asks_tier0(d.tier, d.selector):
            return TIER0_ONLY_P0
        matching = [n for n in online if selector_matches(d.node_selector, n)]
        if not matching:
            return _selector_reason(d.node_selector, online)
        if d.tier is not None and not any(n.tier == d.tier for n in matching):
            return f"no online node in {d.tier} matches the nodeSelector" if d.node_selector else f"no online node in {d.tier}"
        if d.priority != "P0" and all(n.tier == TIER0 for n in matching):
            return TIER0_ONLY_P0
        return "no eligible online node"


# -------------------------------------------------------------------------------------------- passes


def _slot(value: Placement | tuple[str, Sequence[int]]) -> tuple[str, tuple[int, ...]]:
    if isinstance(value, Placement):
        return value.slot
    node, gpus = value
    return node, tuple(gpus)


def _full_pass(
    demands: Iterable[ReplicaDemand], inventory: ClusterInventory, current: Current | None, excluded: Excluded | None = None,
    preempt: bool = False, overheads: HostOverheads | None = None, preferred: Mapping[str, str] | None = None,
) -> _Allocator:
    alloc = _Allocator(inventory, excluded, preempt, overheads, preferred)
    pending = []
    for d in _ordered(_unique(demands)):
        cur = current.get(d.replica_id) if current else None
        if cur is None or alloc.keep(d, *_slot(cur)) is None:
            pending.append(d)
    for d in pending:
        alloc.place(d)
    alloc.refresh_unplaced()
    return alloc


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
    return _full_pass(demands, inventory, current, excluded, preempt, overheads, preferred).plan()


class Placer:
    """Holds the last plan and applies events to it incrementally (no full re-pass).

    Each event releases what it invalidates, then re-places the released replicas together with every
    replica still unplaced, in priority order; the result equals a full ``place()`` with the previous
    plan as ``current``. Every method returns a ``PlanUpdate`` (new plan + diff).
    """

    def __init__(self, inventory: ClusterInventory | None = None, excluded: Excluded | None = None,
                 overheads: HostOverheads | None = None) -> None:
        self._alloc = _Allocator(inventory or ClusterInventory(), excluded, overheads=overheads)
        self._wanted: dict[str, ReplicaDemand] = {}
        self._plan = self._alloc.plan()

    @property
    def plan(self) -> PlacementPlan:
        return self._plan

    @property
    def inventory(self) -> ClusterInventory:
        return self._alloc.inventory

    def demands(self) -> list[ReplicaDemand]:
        return _ordered(self._wanted.values())

    def place_all(
        self,
        demands: Iterable[ReplicaDemand],
        inventory: ClusterInventory | None = None,
        current: Current | None = None,
        excluded: Excluded | None = None,
    ) -> PlacementPlan:
        """Full pass; ``current`` defaults to this placer's last plan (stability across passes) and
        ``excluded`` to the exclusions in force."""
        demands = _unique(demands)
        self._alloc = _full_pass(demands, inventory or self._alloc.inventory, self._plan.placements if current is None else current,
                                 self._alloc.excluded if excluded is None else excluded, overheads=self._alloc.overheads)
        self._wanted = {d.replica_id: d for d in demands}
        self._plan = self._alloc.plan()
        return self._plan

    def add_model(self, demands: Iterable[ReplicaDemand]) -> PlanUpdate:
        """Add a model, or replace its demands (new version, scale up/down): replicas that keep their id
        stay where they are if that is still valid."""
        demands = _unique(demands)
        models = {d.model for d in demands}
        if len(models) != 1:
            raise ValueError(f"add_model: demands must belong to exactly one model (got {sorted(models) or 'none'})")
        (name,) = models
        previous = {rid: self._alloc.placements.get(rid) for rid in self._model_ids(name)}
        self._forget(previous)
        pending = []
        for d in _ordered(demands):
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
            (self._alloc.demands[rid] for rid, p in before.items() if p.node == node.name), key=_order_key
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
        for d in _ordered(self._wanted[rid] for rid in touched if rid in self._wanted and rid not in self._alloc.placements):
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
