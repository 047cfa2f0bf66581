"""Preemption: the cheapest set of lower-priority replicas to evict on one node so that ``d`` fits there.

Pure: it reads the plan's ledger and changes nothing (``plan.Allocator`` evicts what it returns)::

    evictable = replicas of strictly lower priority (P2 for P1; P2, then P1 for P0; never a P0)
    whole GPUs:   d.gpus GPUs of >= per MiB whose holders are all evictable (P2-only GPUs, fewest, lowest index)
    GPU memory:   per GPU large enough, the greedy set that frees what is missing (P2 first, largest first)
    CPU only:     the greedy set of the node's replicas that frees its CPU and host memory
    every set:    with the victims gone, d's CPU and host memory fit the node too
    cost = (any P1 among the victims, how many, MiB freed beyond the need, ...)   lowest wins
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sie.control.placement.demand import ReplicaDemand
from sie.control.placement.eligibility import CPU_EPSILON, per_gpu_mb
from sie.control.placement.ledger import Gpu, Node
from sie.control.placement.results import Placement

#: (cost, victims, the GPUs ``d`` takes) of one node's cheapest eviction
Eviction = tuple[tuple[object, ...], list[ReplicaDemand], list[Gpu]]


def _victims(d: ReplicaDemand, demands: Mapping[str, ReplicaDemand], rids: Iterable[str]) -> list[ReplicaDemand] | None:
    """The demands behind ``rids`` if every one may be evicted for ``d`` (strictly lower priority)."""
    out = []
    for rid in sorted(set(rids)):
        v = demands[rid]
        if v.priority_rank <= d.priority_rank:
            return None
        out.append(v)
    return out


def host_fits_after(d: ReplicaDemand, node: Node, victims: Sequence[ReplicaDemand]) -> bool:
    """``eligibility.fits_host`` on ``node`` as it would be with ``victims`` gone."""
    cpu = node.cpu_free + sum(v.cpu for v in victims)
    if cpu + CPU_EPSILON < d.cpu:
        return False
    return node.mem_free is None or node.mem_free + sum(node.mem_need(v) for v in victims) >= node.mem_need(d)


def _greedy(d: ReplicaDemand, node: Node, demands: Mapping[str, ReplicaDemand], held: Mapping[str, int],
            missing_mb: int) -> list[ReplicaDemand] | None:
    """Fewest evictable replicas of ``held`` (rid -> MiB) that free ``missing_mb`` and the host room:
    P2 before P1, largest first (largest-first needs the fewest to cover an amount)."""
    pool = [(demands[rid], mb) for rid, mb in held.items() if demands[rid].priority_rank > d.priority_rank]
    pool.sort(key=lambda vm: (-vm[0].priority_rank, -vm[1], vm[0].replica_id))
    chosen: list[ReplicaDemand] = []
    freed = 0
    for v, mb in pool:
        if freed >= missing_mb and host_fits_after(d, node, chosen):
            break
        chosen.append(v)
        freed += mb
    if freed < missing_mb or not host_fits_after(d, node, chosen):
        return None
    return chosen


def _cost(victims: Sequence[ReplicaDemand], freed: int, need: int, extra: tuple[object, ...] = ()) -> tuple[object, ...]:
    uses_p1 = any(v.priority == "P1" for v in victims)
    return (uses_p1, len(victims), freed - need, *extra)


def eviction(d: ReplicaDemand, node: Node, demands: Mapping[str, ReplicaDemand],
             placements: Mapping[str, Placement]) -> Eviction | None:
    """The cheapest eviction on ``node`` that makes room for ``d`` (``demands``/``placements``: of the placed
    replicas), None when no evictable set does."""
    best: Eviction | None = None
    if d.gpus > 0:
        per = per_gpu_mb(d)
        options = []
        for g in node.gpus.values():
            if g.capacity < per or g.capacity <= 0:
                continue
            on_gpu = _victims(d, demands, g.held)
            if on_gpu is not None:
                options.append((len(on_gpu), -min((v.priority_rank for v in on_gpu), default=3), g.index, g, on_gpu))
        if len(options) < d.gpus:
            return None
        options.sort(key=lambda o: (o[1], o[0], o[2]))
        chosen = options[: d.gpus]
        victims = list({v.replica_id: v for o in chosen for v in o[4]}.values())
        if not victims or not host_fits_after(d, node, victims):
            return None
        freed = sum(sum(o[3].held.values()) for o in chosen)
        return _cost(victims, freed, 0), victims, sorted((o[3] for o in chosen), key=lambda g: g.index)
    if d.gpu_memory_mb > 0:
        for g in sorted(node.gpus.values(), key=lambda g: g.index):
            if g.capacity < d.gpu_memory_mb:
                continue
            found = _greedy(d, node, demands, g.held, d.gpu_memory_mb - g.free)
            if not found:
                continue
            freed = sum(g.held[v.replica_id] for v in found)
            level = 0 if not node.models[d.model] else 1
            cand: Eviction = (_cost(found, freed, d.gpu_memory_mb - g.free, (level, g.index)), found, [g])
            if best is None or cand[0] < best[0]:
                best = cand
        return best
    held = {rid: 0 for rid, p in placements.items() if p.node == node.state.name}
    found = _greedy(d, node, demands, held, 0)
    if not found:
        return None
    return _cost(found, 0, 0), found, []
