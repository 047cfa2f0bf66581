"""The control plane's placement engine: which model replica runs on which node and GPU.

Pure and deterministic (no I/O, no clock): the controller feeds it specs, the node inventory
(from agent registrations/heartbeats) and the current placement, and publishes the plan.

- ``inventory``: frozen node/GPU state (``NodeState``, ``GpuState``, ``ClusterInventory``).
- ``demand``: ``ReplicaDemand`` and ``demands_from_spec(spec)``.
- ``placement``: ``place(...)`` (full pass), ``Placer`` (incremental events),
  ``PlacementPlan``/``Placement``/``Unplaced`` and ``validate_tier_request`` (409 helper).
"""

from sie.streams.control.demand import ReplicaDemand, demands_from_spec, make_demands
from sie.streams.control.inventory import (
    GPU_PRODUCT_LABEL,
    TIER0,
    TIER_LABEL,
    ClusterInventory,
    GpuState,
    NodeState,
)
from sie.streams.control.placement import (
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
