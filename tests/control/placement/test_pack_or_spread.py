"""Pack or spread (docs/control-plane.md, "Pack or spread"): CPU-only replicas spread over the nodes, GPU replicas
pack (binpack), a model's label or a packing tier decides otherwise."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from sie.control.placement import ClusterInventory, GpuState, NodeState, Placement, demands_from_spec, place
from sie.control.placement.demand import PLACEMENT_LABEL, spreads_on_place
from sie.schemas.spec import load
from sie.schemas.spec_models import ModelService

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "fraud-rules.yaml"  # a CPU-only python model


def _node(name: str, gpus: int = 0, cpu: int = 16) -> NodeState:
    return NodeState(name=name, labels={}, online=True, cpu_count=cpu, memory_mb=0,
                     gpus=tuple(GpuState(i, "NVIDIA A100-SXM4-80GB", 81920, simulated=True) for i in range(gpus)))


def _spec(name: str, *, gpu_memory_mb: int = 0, gpus: int = 0, labels: dict[str, str] | None = None,
          tier: str | None = None) -> ModelService:
    base = load(EXAMPLE)
    return base.model_copy(update={
        "name": name, "labels": dict(labels or {}),
        "resources": base.resources.model_copy(update={"gpu_memory_mb": gpu_memory_mb, "gpus": gpus}),
        "scheduling": base.scheduling.model_copy(update={"tier": tier})})


def _nodes_used(specs: list[ModelService], cluster: ClusterInventory) -> Counter[str]:
    demands = [d for s in specs for d in demands_from_spec(s, 1)]
    plan = place(demands, cluster)
    placed = [p for p in (plan.outcome(d.replica_id) for d in demands) if isinstance(p, Placement)]
    assert len(placed) == len(demands), plan
    return Counter(p.node for p in placed)


def test_the_choice_by_kind_label_and_tier() -> None:
    assert spreads_on_place(_spec("cpu")) is True
    assert spreads_on_place(_spec("gpu-mem", gpu_memory_mb=8192)) is False
    assert spreads_on_place(_spec("gpu-whole", gpus=1)) is False
    assert spreads_on_place(_spec("cpu", labels={PLACEMENT_LABEL: "pack"})) is False
    assert spreads_on_place(_spec("gpu", gpu_memory_mb=8192, labels={PLACEMENT_LABEL: "spread"})) is True
    assert spreads_on_place(_spec("cpu", tier="batch"), pack_tiers=("batch",)) is False
    assert spreads_on_place(_spec("cpu", tier="batch", labels={PLACEMENT_LABEL: "spread"}), ("batch",)) is True
    assert spreads_on_place(_spec("cpu", labels={PLACEMENT_LABEL: "sideways"})) is True  # not a choice: the default


def test_cpu_only_models_spread_over_the_nodes_by_default() -> None:
    cluster = ClusterInventory.of([_node(f"n{i}") for i in range(4)])
    used = _nodes_used([_spec(f"m{i}") for i in range(8)], cluster)
    assert sorted(used.values()) == [2, 2, 2, 2], used


def test_cpu_only_models_labelled_pack_fill_one_node_first() -> None:
    cluster = ClusterInventory.of([_node(f"n{i}") for i in range(4)])
    used = _nodes_used([_spec(f"m{i}", labels={PLACEMENT_LABEL: "pack"}) for i in range(8)], cluster)
    assert list(used.values()) == [8], used


def test_gpu_models_pack_by_default_and_spread_when_labelled() -> None:
    cluster = ClusterInventory.of([_node(f"g{i}", gpus=2) for i in range(3)])
    packed = _nodes_used([_spec(f"m{i}", gpu_memory_mb=8192) for i in range(6)], cluster)
    assert list(packed.values()) == [6], packed  # best fit: one GPU in use takes them all
    spread = _nodes_used([_spec(f"m{i}", gpu_memory_mb=8192, labels={PLACEMENT_LABEL: "spread"})
                          for i in range(6)], cluster)
    assert sorted(spread.values()) == [2, 2, 2], spread


def test_whole_gpu_models_spread_when_labelled() -> None:
    cluster = ClusterInventory.of([_node(f"g{i}", gpus=4) for i in range(2)])
    packed = _nodes_used([_spec(f"m{i}", gpus=1, gpu_memory_mb=1) for i in range(4)], cluster)
    assert list(packed.values()) == [4], packed
    spread = _nodes_used([_spec(f"m{i}", gpus=1, gpu_memory_mb=1, labels={PLACEMENT_LABEL: "spread"})
                          for i in range(4)], cluster)
    assert sorted(spread.values()) == [2, 2], spread


def test_spreading_keeps_what_is_placed() -> None:
    """Spreading chooses among nodes for new replicas only: a valid current placement stays (no churn)."""
    cluster = ClusterInventory.of([_node(f"n{i}") for i in range(3)])
    demands = [d for s in [_spec(f"m{i}") for i in range(3)] for d in demands_from_spec(s, 1)]
    current = {d.replica_id: Placement(d.replica_id, d.model, d.version, "n0", (), 0, False) for d in demands}
    plan = place(demands, cluster, current)
    assert {plan.outcome(d.replica_id).node for d in demands} == {"n0"}
