"""Pack or spread through the reconcile pass (docs/control-plane.md, "Pack or spread"): the leader places CPU-only
models over the nodes, packs them for a tier in ``control.rebalance.pack_tiers`` or a model labelled ``pack``."""

from __future__ import annotations

from collections import Counter

from sie.control.reconcile.config import ControlConfig
from sie.control.reconcile.controller import Controller
from sie.control.reconcile.ports import StaticLeadership
from sie.control.reconcile.rebalance import RebalancePolicy
from sie.control.reconcile.records import ClusterState
from tests.control.reconcile.test_control_unit import (
    TIMEOUT,
    FakeClock,
    FakePublisher,
    assigned,
    heartbeat,
    register,
    spec_record,
)


def _replicas_per_node(config: ControlConfig, tier: str | None = None, **spec_extra: object) -> Counter[str]:
    clock, state, pub = FakeClock(), ClusterState(), FakePublisher()
    ctl = Controller(state, pub, StaticLeadership(True, 3), config)
    for node in ("node-a", "node-b", "node-c"):
        register(state, node, [], tier=tier)
        heartbeat(state, node, clock(), [])
    for i in range(6):
        state.apply_spec(f"m{i}", spec_record(f"m{i}", gpu_mb=0, **spec_extra))
    ctl.reconcile(clock())
    placed = {node: len(rids) for node, rids in assigned(pub).items()}
    assert sum(placed.values()) == 6, placed
    return Counter(placed)


def test_cpu_only_models_spread_over_the_nodes() -> None:
    per_node = _replicas_per_node(ControlConfig(node_timeout_s=TIMEOUT))
    assert sorted(per_node.values()) == [2, 2, 2], per_node


def test_a_model_labelled_pack_fills_a_node_first() -> None:
    per_node = _replicas_per_node(ControlConfig(node_timeout_s=TIMEOUT),
                                  labels={"sie.lmsys.org/placement": "pack"})
    assert sorted(per_node.values()) == [6], per_node


def test_a_packing_tier_packs_its_models() -> None:
    config = ControlConfig(node_timeout_s=TIMEOUT, rebalance=RebalancePolicy(pack_tiers=("batch",)))
    per_node = _replicas_per_node(config, tier="batch", scheduling={"tier": "batch"})
    assert sorted(per_node.values()) == [6], per_node
    spread = _replicas_per_node(ControlConfig(node_timeout_s=TIMEOUT), tier="batch", scheduling={"tier": "batch"})
    assert sorted(spread.values()) == [2, 2, 2], spread
