"""Explain: the words of placement.  Every reason an operator reads (``sie describe``, ``sie explain``, the
API's replica status, ``unschedulable``/``placed``/``preempted`` events) is written here, from the plan's
ledger as the plan leaves it; nothing here decides where a replica goes.

    unschedulable(reason, evicted)  "unschedulable: " + ("preempted by ...; no other node has room (" reason ")")
    why no node may hold it         no_node: no online nodes | tier-0 only P0 | the nodeSelector key no node
                                    matches, with what the nodes have | no node of its tier
                                    excluded_everywhere: the eligible nodes it is kept off
    why no eligible node has room   gpu_memory: the largest free GPU | whole_gpus: most free GPUs on one node
                                    host: which of declared CPU / host memory ran out, on which nodes
    a relaxed rule, on a placement  anti_affinity_note
    an eviction                     preempted_by, preemption_need

A reason describes the cluster (what the eligible nodes have), so it names the resource that is short and
where the most of it is: an operator reads what to change, not a search to repeat.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from sie.control.placement.demand import ReplicaDemand
from sie.control.placement.eligibility import (
    CPU_EPSILON,
    TIER0_ONLY_P0,
    asks_tier0,
    key_matches,
    label_value,
    selector_matches,
)
from sie.control.placement.host_memory import HostOverheads, describe_need
from sie.control.placement.inventory import TIER0, ClusterInventory, NodeState
from sie.control.placement.ledger import Gpu, Node, Pool
from sie.schemas.replica_state import ReplicaState

if TYPE_CHECKING:
    from sie.control.placement.results import Preemption

#: an unplaced replica's reason starts with its state word ("unschedulable: needs ..."): the status
#: line then reads the same whether it quotes the reason alone or "state: reason"
UNSCHEDULABLE_PREFIX = f"{ReplicaState.UNSCHEDULABLE.value.lower()}: "

#: the eligible pools of a replica as the plan searches them: (preference, pool)
Pools = Sequence[tuple[int, Pool]]


class Ledger(Protocol):
    """What a reason reads of the plan (``plan.Allocator``)."""

    inventory: ClusterInventory
    nodes: dict[str, Node]
    overheads: HostOverheads

    def banned(self, d: ReplicaDemand) -> frozenset[str]: ...


def unschedulable(reason: str, evicted: Preemption | None) -> str:
    """The whole reason of an unplaced replica; an evicted one says so first."""
    if evicted is not None:
        reason = f"{preempted_by(evicted)}; no other node has room ({reason})"
    return UNSCHEDULABLE_PREFIX + reason


def names(nodes: Sequence[str]) -> str:
    return ", ".join(nodes) if len(nodes) <= 4 else f"{', '.join(nodes[:3])} and {len(nodes) - 3} more"


def cpu_free(node: Node) -> str:
    """``0 of 2 CPU free``: what the node's replicas have not declared."""
    return f"{max(0.0, node.cpu_free):g} of {node.state.cpu_count:g} CPU free"


# ------------------------------------------------------------------------------------- no eligible node


def selector_reason(selector: tuple[tuple[str, str], ...], online: Sequence[NodeState]) -> str:
    """The first nodeSelector key no online node matches, with the values the nodes have for it."""
    for key, want in selector:
        if any(key_matches(n, key, want) for n in online):
            continue
        groups: dict[str | None, list[str]] = {}
        for n in online:
            groups.setdefault(label_value(n, key), []).append(n.name)
        parts = []
        for value in sorted(groups, key=lambda v: (v is None, v or "")):
            group = groups[value]
            verb = "has" if len(group) == 1 else "have"
            parts.append(f"{names(group)} {verb} {value}" if value is not None else f"{names(group)} {verb} no {key}")
        return f"no online node matches nodeSelector {key}={want} (nodes: {'; '.join(parts)})"
    wanted = ",".join(f"{k}={v}" for k, v in selector)
    return f"no online node matches nodeSelector {wanted} (each key matches some node, none matches all)"


def no_node(d: ReplicaDemand, inventory: ClusterInventory) -> str:
    """Why no online node is eligible for ``d`` at all (eligibility's rules, in the order a reader checks them)."""
    online = [n for n in inventory.nodes if n.online]
    if not online:
        return "no online nodes"
    if d.priority != "P0" and asks_tier0(d.tier, d.selector):
        return TIER0_ONLY_P0
    matching = [n for n in online if selector_matches(d.node_selector, n)]
    if not matching:
        return selector_reason(d.node_selector, online)
    if d.tier is not None and not any(n.tier == d.tier for n in matching):
        return f"no online node in {d.tier} matches the nodeSelector" if d.node_selector else f"no online node in {d.tier}"
    if d.priority != "P0" and all(n.tier == TIER0 for n in matching):
        return TIER0_ONLY_P0
    return "no eligible online node"


def excluded_everywhere(d: ReplicaDemand, pools: Pools) -> str:
    return f"{d.replica_id} is excluded from every eligible node ({names(sorted(n for _, pool in pools for n in pool.names))})"


# -------------------------------------------------------------------------------------------- no room


def gpu_memory(ledger: Ledger, d: ReplicaDemand, pools: Pools) -> str:
    """A shared-GPU replica: the largest free GPU it may use, or (it would fit there) what else is short."""
    need = d.gpu_memory_mb
    banned = ledger.banned(d)
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
        return host(ledger, d, pools, what=f"{need} MiB GPU memory")
    return f"needs {need} MiB GPU memory; largest free is {largest[0]} MiB on {largest[1]}/{largest[2]}"


def whole_gpus(ledger: Ledger, d: ReplicaDemand, pools: Pools, per: int, most: tuple[int, str]) -> str:
    """A whole-GPU replica: the most free GPUs (of ``per`` MiB) on one node, or what else is short."""
    each = f" with >= {per} MiB each" if per else ""
    if most[0] >= d.gpus:
        return host(ledger, d, pools, what=f"{d.gpus} whole free GPU(s){each}")
    where = f" on {most[1]}" if most[0] else ""
    return f"needs {d.gpus} whole free GPU(s){each} on one node; most on one node is {most[0]}{where}"


def host(ledger: Ledger, d: ReplicaDemand, pools: Pools, what: str | None) -> str:
    """Why no eligible node has the CPU and host memory ``d`` declares (after ``what``, e.g. its GPU, did
    fit somewhere).  CPU is packed by what the placed replicas declare (``resources.cpu``), never by
    their load, so a node whose cores sit idle can be full: the reason says *declared* CPU, and which
    resource ran out on which node, so nobody hunts for a memory problem that is not there."""
    banned = ledger.banned(d)
    nodes = [ledger.nodes[n] for _, pool in pools for n in pool.names if n not in banned]
    cpu_short = [n for n in nodes if n.cpu_free + CPU_EPSILON < d.cpu]
    mem_short = [n for n in nodes if n.mem_free is not None and n.mem_free < n.mem_need(d)]
    if len(cpu_short) == len(nodes):
        node = min(nodes, key=lambda n: (-n.cpu_free, n.state.name))
        where = f"on {node.state.name}:" if len(nodes) == 1 else f"on every eligible node; most free on {node.state.name}:"
        return (f"needs {d.cpu:g} CPU; declared CPU is used up {where} {cpu_free(node)} (its replicas declare "
                f"{node.state.cpu_count - node.cpu_free:g}; CPU is packed by resources.cpu, not by load)")
    if len(mem_short) == len(nodes):
        mem_node = min(mem_short, key=lambda n: (-(n.mem_free or 0), n.state.name))
        need = describe_need(d, mem_node.state, ledger.overheads)
        return f"needs {need}; most free is {mem_node.mem_free} MiB on {mem_node.state.name}"
    memory = [describe_need(d, nodes[0].state, ledger.overheads)] if nodes[0].mem_need(d) else []
    parts = ([what] if what else []) + [f"{d.cpu:g} CPU"] + memory
    short = [f"{n.state.name}: {cpu_free(n)} (declared)" if n in cpu_short else
             f"{n.state.name}: {n.mem_free} MiB host memory free" for n in dict.fromkeys(cpu_short + mem_short)]
    more = f"; and {len(short) - 3} more" if len(short) > 3 else ""
    return (f"needs {', '.join(parts)} on one node; no eligible node has all of them free"
            + (f" ({'; '.join(short[:3])}{more})" if short else ""))


# ------------------------------------------------------------------------------- relaxed rules, evictions


def anti_affinity_note(d: ReplicaDemand, node: Node, gpus: Sequence[Gpu]) -> str | None:
    """The ``note`` of a placement that shares a node (or a GPU) with another replica of its model."""
    if not node.models[d.model]:
        return None
    where = f"GPU {node.state.name}/{gpus[0].index}" if any(g.models[d.model] for g in gpus) else f"node {node.state.name}"
    return f"anti-affinity relaxed: shares {where} with another replica of {d.model} (no other node fits)"


def preemption_need(d: ReplicaDemand, node: Node) -> str:
    """What ``d`` needed when it evicted on ``node`` (``Preemption.needed``)."""
    return (f"{d.gpus} whole GPU(s)" if d.gpus else f"{d.gpu_memory_mb} MiB GPU memory" if d.gpu_memory_mb
            else f"{d.cpu:g} CPU" + (f", {node.mem_need(d)} MiB host memory" if node.mem_free is not None
                                     and node.mem_need(d) else ""))


def preempted_by(p: Preemption) -> str:
    where = f"{p.node}" + (f" gpu {','.join(map(str, p.gpu_indices))}" if p.gpu_indices else "")
    return f"preempted by {p.by} ({p.by_priority}, needs {p.needed}) on {where}: {p.victim} is {p.victim_priority}"

