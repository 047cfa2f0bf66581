"""Eligibility: which nodes and GPUs may hold a replica.  Each rule is a small pure function; the plan asks them.

Per node (static: labels, tier, GPU products; liveness and room are not looked at)::

    node_eligible(d, node) = tier_allows(d, node) and selector_matches(d.node_selector, node)
    tier_allows:       a tier-0 node hosts only P0 replicas; scheduling.tier admits only nodes of that tier
    selector_matches:  every nodeSelector key equals the node's label; nvidia.com/gpu.product without the
                       label matches a GPU whose product name holds every wanted token ("nvidia" ignored)
    prefers:           0 for the nodes tried first (tier-0 for a P0 replica), 1 for the rest

Per node and moment (room left, from the plan's ledger)::

    fits_host(node, d):                          declared CPU and host memory (declared + process overhead,
                                                 ``host_memory``) fit; an unreported memory is no constraint
    whole_gpu_fits(gpu, per):                    a GPU nobody holds with >= ceil(gpu_memory_mb / gpus) MiB
    keeps(d, gpus):                              a current slot still holds ``d`` (right GPUs, room)

Per request (the API's 409): ``validate_tier_request`` returns the reason to refuse a P1/P2 ModelService that
asks for tier-0 nodes, else None.  Offline nodes and exclusions (a replica's banned nodes) are applied by the
plan (``plan``), which never holds an offline node in its ledger.  Why a replica fits nowhere, in words, is
``explain``'s: a reason describes the cluster (what the nodes have), not one node.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from sie.control.placement.demand import ReplicaDemand
from sie.control.placement.inventory import GPU_PRODUCT_LABEL, TIER0, TIER_LABEL, ClusterInventory, NodeState

#: the tier rule, as every reason that cites it says it
TIER0_ONLY_P0 = "tier-0 nodes host only P0 models"
#: declared CPU is a float sum: a replica fits when what is left is short of its ask by rounding only
CPU_EPSILON = 1e-9


class GpuRoom(Protocol):
    """What the GPU rules read of a GPU in the plan's ledger (``ledger.Gpu``)."""

    @property
    def capacity(self) -> int: ...
    @property
    def free(self) -> int: ...
    @property
    def held(self) -> Mapping[str, int]: ...


class HostRoom(Protocol):
    """What the host rule reads of a node in the plan's ledger (``ledger.Node``)."""

    cpu_free: float
    mem_free: int | None

    def mem_need(self, demand: ReplicaDemand) -> int: ...


# ---------------------------------------------------------------------------------------- nodeSelector


def _tokens(text: str) -> frozenset[str]:
    return frozenset(t for t in re.split(r"[\s_\-/]+", text.lower()) if t and t != "nvidia")


def _product_matches(want: str, product: str) -> bool:
    """``A100-80gb`` matches ``NVIDIA A100-SXM4-80GB`` [agents report NVML names; specs use short ones]."""
    wanted = _tokens(want)
    return bool(wanted) and wanted <= _tokens(product)


def label_value(node: NodeState, key: str) -> str | None:
    """The node's value for a selector key (the GPU products for the product key when the label is missing)."""
    value = node.labels.get(key)
    if value is None and key == GPU_PRODUCT_LABEL and node.gpus:
        value = "+".join(sorted({g.product for g in node.gpus}))
    return value


def key_matches(node: NodeState, key: str, want: str) -> bool:
    """One nodeSelector pair: a present label is compared exactly; the GPU product key falls back to the GPUs."""
    have = node.labels.get(key)
    if have is not None:
        return have == want
    if key == GPU_PRODUCT_LABEL:
        return any(_product_matches(want, g.product) for g in node.gpus)
    return False


def selector_matches(selector: Iterable[tuple[str, str]], node: NodeState) -> bool:
    return all(key_matches(node, k, v) for k, v in selector)


# ------------------------------------------------------------------------------------------------ tiers


def tier_allows(demand: ReplicaDemand, node: NodeState) -> bool:
    """Tier-0 nodes host only P0 [tier-0 exists for the low-latency models]; ``scheduling.tier`` is hard."""
    if node.tier == TIER0 and demand.priority != "P0":
        return False
    return demand.tier is None or node.tier == demand.tier


def node_eligible(demand: ReplicaDemand, node: NodeState) -> bool:
    """Static eligibility (selector + tier rules); ignores liveness and free capacity."""
    return tier_allows(demand, node) and selector_matches(demand.node_selector, node)


def prefers(demand: ReplicaDemand, node: NodeState) -> int:
    """0 for the nodes a replica tries first: a P0 replica prefers tier-0 (spilling elsewhere when it is full)."""
    return 1 if demand.priority == "P0" and node.tier != TIER0 else 0


def asks_tier0(tier: str | None, selector: Mapping[str, str]) -> str | None:
    """How a request asks for tier-0 nodes by name (the verdict's reason), None when it does not."""
    if tier == TIER0:
        return "scheduling.tier=tier-0"
    if selector.get(TIER_LABEL) == TIER0:
        return f"nodeSelector {TIER_LABEL}={TIER0}"
    return None


def validate_tier_request(spec: Any, inventory: ClusterInventory) -> str | None:
    """Reason to refuse (HTTP 409 Conflict) a P1/P2 ModelService that asks for tier-0 nodes, else None.

    It asks for tier-0 by ``scheduling.tier: tier-0``, a ``sie.io/tier: tier-0`` selector, or a
    nodeSelector that only tier-0 nodes of the inventory match.
    """
    priority = spec.priority_level
    if priority == "P0":
        return None
    selector = dict(spec.scheduling.node_selector or {})
    via = asks_tier0(spec.scheduling.tier, selector)
    if via is None and selector:
        matching = [n for n in inventory.nodes if selector_matches(selector.items(), n)]
        if matching and all(n.tier == TIER0 for n in matching):
            via = "nodeSelector " + ",".join(f"{k}={v}" for k, v in sorted(selector.items())) + " matches only tier-0 nodes"
    if via is None:
        return None
    return f"{TIER0_ONLY_P0}: {spec.name} is {priority} and asks for tier-0 nodes ({via})"


# ------------------------------------------------------------------------------------------------- room


def fits_host(node: HostRoom, demand: ReplicaDemand) -> bool:
    """CPU is packed by what replicas declare (``resources.cpu``), host memory by declared + process overhead;
    ``mem_free`` None = the node reports no host memory: not a constraint there."""
    return node.cpu_free + CPU_EPSILON >= demand.cpu and (node.mem_free is None or node.mem_free >= node.mem_need(demand))


def per_gpu_mb(demand: ReplicaDemand) -> int:
    """What each of a whole-GPU replica's GPUs must have: ceil(gpu_memory_mb / gpus) MiB."""
    return math.ceil(demand.gpu_memory_mb / demand.gpus)


def whole_gpu_fits(gpu: GpuRoom, per: int) -> bool:
    """A whole GPU is one nobody holds [nobody else may use it], large enough, and not an empty one."""
    return not gpu.held and gpu.capacity >= per and gpu.capacity > 0


def keeps(demand: ReplicaDemand, gpus: Sequence[GpuRoom]) -> bool:
    """A current slot (its healthy GPUs, all still there) still holds ``demand``: the whole GPUs it asks for,
    one GPU with its memory free, or no GPU for a CPU-only replica."""
    if demand.gpus > 0:
        per = per_gpu_mb(demand)
        return len(gpus) == demand.gpus and all(whole_gpu_fits(g, per) for g in gpus)
    if demand.gpu_memory_mb > 0:
        return len(gpus) == 1 and gpus[0].free >= demand.gpu_memory_mb
    return not gpus
