"""Placement: pure, deterministic decisions of what runs where (no I/O, no clock, no Kafka).

The controller feeds it specs, the node inventory (from agent registrations/heartbeats) and the current
placement, and publishes the plan.  Imports only ``sie.schemas`` and ``sie.kernel``: never another room of
the control plane, never a Kafka client.

- ``inventory``: frozen node/GPU state (``NodeState``, ``GpuState``, ``ClusterInventory``).
- ``demand``: ``ReplicaDemand`` and ``demands_from_spec(spec)``.
- ``host_memory``: what a replica needs from its node's RAM besides the GPU (``HostOverheads``).
- ``engine``: the entry points ``place(...)`` (full pass) and ``Placer`` (incremental events); it re-exports
  what callers import from it (``PlacementPlan``, ``node_eligible``, ``validate_tier_request``, ...).
- ``eligibility``: which nodes and GPUs may hold a replica, a small pure function a rule (``node_eligible``,
  ``selector_matches``, ``fits_host``, ``validate_tier_request``: the 409 helper).
- ``plan``: choosing among the eligible nodes (the allocator: best fit, anti-affinity, keeping, evicting), on
  its ``ledger`` of what is free; ``preemption``: which lower-priority replicas to evict.
- ``explain``: the words of every reason and note (``unschedulable: ...``, ``preempted by ...``).
- ``results``: the plan as values (``PlacementPlan``/``Placement``/``Unplaced``/``Preemption``/``PlanDiff``).
- ``rollout_capacity``: which version each replica of a model in a rollout runs (``plan_capacity``).
"""

from sie.control.placement.demand import ReplicaDemand, demands_from_spec, make_demands
from sie.control.placement.engine import (
    Placement,
    PlacementPlan,
    Placer,
    PlanDiff,
    PlanStats,
    PlanUpdate,
    Unplaced,
    node_eligible,
    place,
    validate_tier_request,
)
from sie.control.placement.inventory import (
    GPU_PRODUCT_LABEL,
    TIER0,
    TIER_LABEL,
    ClusterInventory,
    GpuState,
    NodeState,
)

__all__ = [
    "GPU_PRODUCT_LABEL",
    "TIER0",
    "TIER_LABEL",
    "ClusterInventory",
    "GpuState",
    "NodeState",
    "Placement",
    "PlacementPlan",
    "PlanDiff",
    "PlanStats",
    "PlanUpdate",
    "Placer",
    "ReplicaDemand",
    "Unplaced",
    "demands_from_spec",
    "make_demands",
    "node_eligible",
    "place",
    "validate_tier_request",
]
