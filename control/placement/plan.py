"""Plan: choosing among the eligible nodes, keeping what still fits, evicting for priority (SIE's ``binpack``).

``Allocator`` is the state a plan is made in: the ledger of what is free (``ledger``), the placements made so
far and the unplaced replicas with their reasons.  ``place`` and ``Placer`` (``engine``) drive it::

    keep(d, slot):   the current slot still eligible (eligibility), not excluded, and d still fits -> commit
    place(d):
        preferred node first, if it fits (a soft hint: searched with every other node banned; never evicts)
        pools = the eligible pools (same labels and GPU products), tier-0 first for a P0 replica
        none -> Unplaced(explain.no_node); every eligible node excluded -> Unplaced(explain.excluded_everywhere)
        gpus = N:   N whole free GPUs on the node left with the fewest (a node without the model first)
        GPU memory: best fit among GPUs in use; else an empty GPU of the pool with the most free memory
        CPU only:   the node with the least CPU left
        (every search: a node without a replica of the model first [soft anti-affinity, the note says when
         relaxed], then the pool's preference, and the node's host must fit)
        no room and preempt (P0/P1): the cheapest eviction on one node (preemption), then the victims again
        still no room -> Unplaced with explain's reason
    refresh_unplaced(): every unplaced replica tried again, so its reason describes the plan as it ends

Order (``ordered``): P0, P1, P2, larger first, then by replica id (first-fit-decreasing, deterministic).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from sie.control.placement import explain
from sie.control.placement.demand import ReplicaDemand
from sie.control.placement.eligibility import (
    fits_host,
    keeps,
    node_eligible,
    per_gpu_mb,
    prefers,
    whole_gpu_fits,
)
from sie.control.placement.host_memory import HostOverheads
from sie.control.placement.inventory import ClusterInventory, NodeState
from sie.control.placement.ledger import Gpu, Node, Pool, pool_key
from sie.control.placement.preemption import eviction
from sie.control.placement.results import Current, Excluded, Placement, PlacementPlan, Preemption, Unplaced

Pools = list[tuple[int, Pool]]


def order_key(d: ReplicaDemand) -> tuple[Any, ...]:
    return (d.priority_rank, -d.gpus, -d.gpu_memory_mb, -d.cpu, -d.memory_mb, d.model, d.index)


def ordered(demands: Iterable[ReplicaDemand]) -> list[ReplicaDemand]:
    return sorted(demands, key=order_key)


def unique(demands: Iterable[ReplicaDemand]) -> list[ReplicaDemand]:
    out: dict[str, ReplicaDemand] = {}
    for d in demands:
        if d.replica_id in out and out[d.replica_id] != d:
            raise ValueError(f"replica {d.replica_id!r} is demanded twice with different resources")
        out[d.replica_id] = d
    return list(out.values())


class Allocator:
    """Mutable free-capacity bookkeeping behind ``place`` and ``Placer`` (never exposed)."""

    def __init__(self, inventory: ClusterInventory, excluded: Excluded | None = None, preempt: bool = False,
                 overheads: HostOverheads | None = None, preferred: Mapping[str, str] | None = None) -> None:
        self.inventory = inventory
        self.preferred: dict[str, str] = dict(preferred or {})
        self.preempt = preempt
        self.overheads = overheads or HostOverheads()
        self.preempted: dict[str, Preemption] = {}
        self.excluded: dict[str, frozenset[str]] = {rid: frozenset(n) for rid, n in (excluded or {}).items() if n}
        self.nodes: dict[str, Node] = {}
        self.pools: dict[tuple[Any, ...], Pool] = {}
        self.placements: dict[str, Placement] = {}
        #: replica ids whose placement was committed or released since the owner last cleared it (``Replanner``)
        self.touched: set[str] = set()
        self.unplaced: dict[str, Unplaced] = {}
        self.demands: dict[str, ReplicaDemand] = {}  # of placed replicas
        self.unplaced_demands: dict[str, ReplicaDemand] = {}
        self._eligible_cache: dict[tuple[Any, ...], Pools] = {}
        #: (demand shape, id of a live pool) -> eligible: cleared with the pools (an id may be reused)
        self._allows_cache: dict[tuple[Any, ...], bool] = {}
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
        key = pool_key(state)
        pool = self.pools.get(key)
        if pool is None:
            pool = self.pools[key] = Pool(state)
            self._eligible_cache.clear()
            self._allows_cache.clear()
        insort(pool.names, state.name)
        node = self.nodes[state.name] = Node(state, pool, self.overheads)
        for g in node.gpus.values():
            pool.index(g)
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
            pool.unindex(g)
            pool.free_total -= g.free
        pool.names.remove(name)
        del self.nodes[name]
        if not pool.names:
            del self.pools[pool_key(pool.sample)]
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
        node.pool.unindex(g)
        node.pool.free_total -= g.free
        del node.gpus[index]
        return released

    # -- commit / release

    def release(self, rid: str) -> None:
        p = self.placements.pop(rid)
        self.touched.add(rid)
        d = self.demands.pop(rid)
        node = self.nodes[p.node]
        node.cpu_free += d.cpu
        if node.mem_free is not None:
            node.mem_free += node.mem_need(d)
        node.models[d.model] -= 1
        node.replicas -= 1
        for gi in p.gpu_indices:
            g = node.gpus.get(gi)
            if g is not None:
                g.models[d.model] -= 1
                node.unhold(g, rid)

    def _commit(self, d: ReplicaDemand, node: Node, gpus: Sequence[Gpu]) -> Placement:
        note = explain.anti_affinity_note(d, node, gpus)
        whole = d.gpus > 0
        for g in gpus:
            g.models[d.model] += 1
            node.hold(g, d.replica_id, g.free if whole else d.gpu_memory_mb)
        node.cpu_free -= d.cpu
        if node.mem_free is not None:
            node.mem_free -= node.mem_need(d)
        node.models[d.model] += 1
        node.replicas += 1
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
        self.touched.add(d.replica_id)
        self.demands[d.replica_id] = d
        self.forget_unplaced(d.replica_id)
        return p

    def forget_unplaced(self, rid: str) -> None:
        self.unplaced.pop(rid, None)
        self.unplaced_demands.pop(rid, None)

    def refresh_unplaced(self) -> None:
        """Re-evaluate every unplaced replica against the final state, so its reason describes the cluster
        as the plan leaves it (and a fresh pass, a stable pass and an incremental event agree)."""
        for d in ordered(self.unplaced_demands.values()):
            self.place(d)

    def _fail(self, d: ReplicaDemand, reason: str) -> Unplaced:
        u = Unplaced(d.replica_id, d.model, d.version, explain.unschedulable(reason, self.preempted.get(d.replica_id)))
        self.unplaced[d.replica_id] = u
        self.unplaced_demands[d.replica_id] = d
        return u

    # -- keep an existing placement

    def keep(self, d: ReplicaDemand, node_name: str, gpu_indices: Sequence[int]) -> Placement | None:
        """Re-commit a current placement if it is still valid; None when it must be re-placed."""
        node = self.nodes.get(node_name)
        if node is None or d.replica_id in self.placements or node_name in self.banned(d):
            return None
        if not self._pool_allows(d, node.pool) or not fits_host(node, d):
            return None
        gpus = [g for i in gpu_indices if (g := node.gpus.get(i)) is not None]
        if len(gpus) != len(gpu_indices) or len(set(gpu_indices)) != len(gpus):
            return None
        return self._commit(d, node, gpus) if keeps(d, gpus) else None

    # -- eligibility, once per pool

    def _eligible(self, d: ReplicaDemand) -> Pools:
        key = (d.priority, d.tier, d.node_selector)
        pools = self._eligible_cache.get(key)
        if pools is None:
            pools = sorted(
                ((prefers(d, pool.sample), pool) for pool in self.pools.values() if node_eligible(d, pool.sample)),
                key=lambda t: (t[0], t[1].names[0]),
            )
            self._eligible_cache[key] = pools
        return pools

    def _pool_allows(self, d: ReplicaDemand, pool: Pool) -> bool:
        """``node_eligible`` for every node of ``pool`` (same labels, tier and GPU products), once per demand
        shape: asked for every kept replica, every pass (3,000 selector checks a pass at 1,000 models)."""
        key = (d.priority, d.tier, d.node_selector, id(pool))
        ok = self._allows_cache.get(key)
        if ok is None:
            ok = self._allows_cache[key] = node_eligible(d, pool.sample)
        return ok

    def banned(self, d: ReplicaDemand) -> frozenset[str]:
        """The nodes ``d`` is excluded from (``excluded``: per replica, checked per node)."""
        return self.excluded.get(d.replica_id, frozenset())

    # -- search

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
        if node is None or node not in self.nodes or node in self.banned(d):
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
            return self._fail(d, explain.no_node(d, self.inventory))
        banned = self.banned(d)
        if banned and all(n in banned for _, pool in pools for n in pool.names):
            return self._fail(d, explain.excluded_everywhere(d, pools))
        if d.gpus > 0:
            return self._place_whole(d, pools)
        if d.gpu_memory_mb > 0:
            return self._place_shared(d, pools)
        return self._place_cpu(d, pools)

    def _place_shared(self, d: ReplicaDemand, pools: Pools) -> Placement | Unplaced:
        """Best fit among GPUs already in use; only when none fits, open an empty GPU, taken from the most
        abundant eligible pool (most free MiB) so scarce pools (e.g. L4 nodes that some models pin) are
        not drained by models that could run anywhere.  A spreading replica takes the other end instead
        (``_spread_shared``)."""
        if d.spread:
            return self._spread_shared(d, pools)
        need, model = d.gpu_memory_mb, d.model
        banned = self.banned(d)
        probe = (need, "", -1)
        best: tuple[Any, ...] | None = None  # (level, pref, is_empty, ...)
        for pref, pool in pools:
            for is_empty, index in ((0, pool.used), (1, pool.empty)):
                if best is not None and best[0] == 0 and (best[1], best[2]) < (pref, is_empty):
                    continue  # this list cannot beat an anti-affine candidate already found
                for j in range(bisect_left(index, probe), len(index)):
                    free, name, gi = index[j]
                    node = self.nodes[name]
                    if name in banned or not fits_host(node, d):
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
            return self._fail(d, explain.gpu_memory(self, d, pools))
        node = self.nodes[best[-2]]
        return self._commit(d, node, [node.gpus[best[-1]]])

    def _spread_shared(self, d: ReplicaDemand, pools: Pools) -> Placement | Unplaced:
        """A spreading replica's GPU: on the node holding the fewest replicas, the GPU with the most memory
        left after it (every GPU of the eligible pools is looked at: spreading asks for it, packing does not)."""
        need, banned = d.gpu_memory_mb, self.banned(d)
        best: tuple[Any, ...] | None = None
        for pref, pool in pools:
            for index in (pool.used, pool.empty):
                for j in range(bisect_left(index, (need, "", -1)), len(index)):
                    free, name, gi = index[j]
                    node = self.nodes[name]
                    if name in banned or not fits_host(node, d):
                        continue
                    level = 0 if not node.models[d.model] else (2 if node.gpus[gi].models[d.model] else 1)
                    cand = (level, pref, node.replicas, need - free, name, gi)
                    if best is None or cand < best:
                        best = cand
        if best is None:
            return self._fail(d, explain.gpu_memory(self, d, pools))
        node = self.nodes[best[-2]]
        return self._commit(d, node, [node.gpus[best[-1]]])

    def _place_whole(self, d: ReplicaDemand, pools: Pools) -> Placement | Unplaced:
        per = per_gpu_mb(d)
        best: tuple[Any, ...] | None = None
        chosen: list[Gpu] = []
        most = (0, "")
        banned = self.banned(d)
        for pref, pool in pools:
            for name in pool.names:
                if name in banned:
                    continue
                node = self.nodes[name]
                free = [g for g in node.gpus.values() if whole_gpu_fits(g, per)]
                if len(free) > most[0]:
                    most = (len(free), name)
                if len(free) < d.gpus or not fits_host(node, d):
                    continue
                left = len(free) - d.gpus
                cand = (0 if not node.models[d.model] else 1, pref,
                        *((node.replicas, -left) if d.spread else (left,)), name)
                if best is None or cand < best:
                    best = cand
                    chosen = sorted(free, key=lambda g: (g.capacity, g.index))[: d.gpus]
        if best is None:
            return self._fail(d, explain.whole_gpus(self, d, pools, per, most))
        return self._commit(d, self.nodes[best[-1]], sorted(chosen, key=lambda g: g.index))

    def _place_cpu(self, d: ReplicaDemand, pools: Pools) -> Placement | Unplaced:
        best: tuple[Any, ...] | None = None
        banned = self.banned(d)
        for pref, pool in pools:
            for name in pool.names:
                node = self.nodes[name]
                if name not in banned and fits_host(node, d):
                    room = node.cpu_free - d.cpu
                    cand = (0 if not node.models[d.model] else 1, pref,
                            *((node.replicas, -room) if d.spread else (room,)), name)
                    if best is None or cand < best:
                        best = cand
        if best is None:
            return self._fail(d, explain.host(self, d, pools, what=None))
        return self._commit(d, self.nodes[best[-1]], [])

    # -- preemption

    def _preempt(self, d: ReplicaDemand) -> Placement | None:
        """Evict the cheapest set of lower-priority replicas on one eligible node for ``d`` (``preemption``),
        place ``d`` there, then place the evicted replicas again (elsewhere if there is room)."""
        banned = self.banned(d)
        best: tuple[Any, ...] | None = None
        for pref, pool in self._eligible(d):
            for name in pool.names:
                node = self.nodes[name]
                if name in banned:
                    continue
                found = eviction(d, node, self.demands, self.placements)
                if found is not None and (best is None or (found[0], pref, name) < best[0]):
                    best = ((found[0], pref, name), node, found[1], found[2])
        if best is None:
            return None
        _, node, victims, gpus = best
        needed = explain.preemption_need(d, node)
        for v in victims:
            p = self.placements[v.replica_id]
            freed = sum(self.nodes[p.node].gpus[i].held.get(v.replica_id, 0) for i in p.gpu_indices if i in node.gpus)
            self.preempted[v.replica_id] = Preemption(
                v.replica_id, v.model, v.priority, p.node, p.gpu_indices, d.replica_id, d.model, d.priority, needed, freed)
            self.release(v.replica_id)
        placed = self._commit(d, node, gpus)
        for v in ordered(victims):
            self.place(v)
        return placed


def _slot(value: Placement | tuple[str, Sequence[int]]) -> tuple[str, tuple[int, ...]]:
    if isinstance(value, Placement):
        return value.slot
    node, gpus = value
    return node, tuple(gpus)


def full_pass(
    demands: Iterable[ReplicaDemand], inventory: ClusterInventory, current: Current | None, excluded: Excluded | None = None,
    preempt: bool = False, overheads: HostOverheads | None = None, preferred: Mapping[str, str] | None = None,
) -> Allocator:
    """Keep every still-valid current placement first, then place the rest in order (module docstring)."""
    alloc = Allocator(inventory, excluded, preempt, overheads, preferred)
    pending = []
    for d in ordered(unique(demands)):
        cur = current.get(d.replica_id) if current else None
        if cur is None or alloc.keep(d, *_slot(cur)) is None:
            pending.append(d)
    for d in pending:
        alloc.place(d)
    alloc.refresh_unplaced()
    return alloc
