"""Host memory in placement: the overhead rule, packing, reasons, preemption, and old agents left as they were."""

from __future__ import annotations

import pytest

from sie.control.placement import (
    ClusterInventory,
    NodeState,
    Placement,
    Placer,
    ReplicaDemand,
    Unplaced,
    make_demands,
    place,
)
from sie.control.placement.host_memory import HostOverheads, host_memory_mb, process_overhead_mb, shares_process

OVERHEADS = HostOverheads(process_mb=579, model_mb=25)


def node(name: str = "a", memory_mb: int = 2048, slots: int | None = 0, cpu: float = 64) -> NodeState:
    """A CPU node; ``slots``: None = an agent that reports no host memory, 0 = dedicated processes only."""
    return NodeState(name=name, cpu_count=cpu, memory_mb=memory_mb, process_slots=slots)


def demand(priority: str = "P1", backend: str = "torch", memory_mb: int = 0, gpus: int = 0, index: int = 0) -> ReplicaDemand:
    return ReplicaDemand(model="m", index=index, priority=priority, backend=backend, memory_mb=memory_mb, cpu=0.1,
                         gpus=gpus, gpu_memory_mb=1024 if gpus else 0)


@pytest.mark.parametrize(("d", "slots", "expected"), [
    (demand("P1"), 8, 25),                      # small P1 torch model on a node with shared processes
    (demand("P2", backend="python"), 8, 25),    # python backends share too
    (demand("P0"), 8, 579),                     # P0 always gets a process of its own
    (demand("P1", backend="sglang"), 8, 579),   # sglang is a server of its own
    (demand("P1", gpus=1), 8, 579),             # a whole-GPU model is not small
    (demand("P1", backend=""), 8, 579),         # not a model (a connector replica): its own process
    (demand("P1"), 0, 579),                     # the node runs no shared processes
    (demand("P0"), None, 0),                    # an old agent: overhead unknown, not a constraint
    (demand("P1"), None, 0),
], ids=["p1-torch", "p2-python", "p0", "sglang", "whole-gpu", "connector", "no-shared", "old-p0", "old-p1"])
def test_one_rule_decides_the_process_overhead(d, slots, expected):
    n = node(slots=slots)
    assert process_overhead_mb(d, n, OVERHEADS) == expected
    assert shares_process(d, n) == (expected == 25)
    assert host_memory_mb(ReplicaDemand(**{**d.__dict__, "memory_mb": 100}), n, OVERHEADS) == 100 + expected


def test_settings_carry_the_overheads_with_env_override(monkeypatch):
    from sie.kernel.settings import Settings

    assert HostOverheads.defaults() == HostOverheads(process_mb=579, model_mb=25)
    monkeypatch.setenv("SIE_PROCESS_OVERHEAD_MB", "700")
    monkeypatch.setenv("SIE_MODEL_OVERHEAD_MB", "30")
    assert HostOverheads.from_settings(Settings()) == HostOverheads(700, 30)
    with pytest.raises(ValueError, match="must be >= 0"):
        HostOverheads(-1, 0)


def test_dedicated_processes_are_packed_with_their_overhead_and_the_reason_names_it():
    # 3 x (100 declared + 579 process) = 2037 of 2048 MiB: the fourth does not fit
    plan = place(make_demands("m", 4, memory_mb=100, cpu=0.1, backend="torch"), ClusterInventory.of([node()]),
                 overheads=OVERHEADS)
    assert sorted(plan.placements) == ["m-0", "m-1", "m-2"]
    assert plan.unplaced["m-3"].reason == (
        "unschedulable: needs 679 MiB host memory (100 MiB declared + 579 MiB process overhead); "
        "most free is 11 MiB on a"
    )


def test_a_node_with_shared_processes_packs_small_models_by_their_share():
    # 75 MiB each (50 declared + 25 shared): 27 fit in 2048 MiB, where dedicated processes fit 3
    demands = make_demands("small", 30, memory_mb=50, cpu=0.01, backend="torch")
    shared = place(demands, ClusterInventory.of([node(slots=16)]), overheads=OVERHEADS)
    assert len(shared.placements) == 27
    assert shared.unplaced["small-29"].reason.endswith(
        "needs 75 MiB host memory (50 MiB declared + 25 MiB shared-process overhead); most free is 23 MiB on a")
    dedicated = place(demands, ClusterInventory.of([node(slots=0)]), overheads=OVERHEADS)
    assert len(dedicated.placements) == 3


def test_p0_pays_for_a_process_of_its_own_even_where_processes_are_shared():
    demands = make_demands("fast", 4, priority="P0", cpu=0.01, backend="torch")
    plan = place(demands, ClusterInventory.of([node(memory_mb=2048, slots=16)]), overheads=OVERHEADS)
    assert len(plan.placements) == 3  # 3 x 579
    assert "579 MiB process overhead" in plan.unplaced["fast-3"].reason


def test_old_agents_stay_placeable_as_before():
    """No host memory in the heartbeat (process_slots None): no overhead, declared memory only, as before."""
    old = node(memory_mb=1024, slots=None)
    plan = place(make_demands("m", 100, cpu=0.1, backend="torch"), ClusterInventory.of([old]), overheads=OVERHEADS)
    assert len(plan.placements) == 100
    declared = place(make_demands("m", 3, memory_mb=400, cpu=0.1, backend="torch"), ClusterInventory.of([old]),
                     overheads=OVERHEADS)
    assert len(declared.placements) == 2  # declared memoryMb is still enforced against the registered total
    unknown = place(make_demands("m", 3, memory_mb=400, cpu=0.1), ClusterInventory.of([node(memory_mb=0, slots=0)]),
                    overheads=OVERHEADS)
    assert len(unknown.placements) == 3  # no host memory known at all: not a constraint


def test_memory_goes_to_the_node_with_room_and_anti_affinity_still_spreads():
    small, big = node("a", memory_mb=1000), node("b", memory_mb=8000)
    plan = place(make_demands("m", 3, cpu=1, backend="torch"), ClusterInventory.of([small, big]), overheads=OVERHEADS)
    nodes = sorted(p.node for p in plan.placements.values())
    assert nodes == ["a", "b", "b"]  # one per node first; a has room for one process only
    assert plan.placements["m-2"].note and "anti-affinity relaxed" in plan.placements["m-2"].note


def test_p0_preempts_p2_to_free_host_memory():
    n = node(memory_mb=1300, slots=0)
    low = make_demands("batch", 2, priority="P2", cpu=0.1, backend="torch")  # 2 x 579 = 1158
    plan = place(low, ClusterInventory.of([n]), overheads=OVERHEADS)
    assert len(plan.placements) == 2
    urgent = make_demands("fraud", 1, priority="P0", cpu=0.1, backend="torch")
    after = place(low + urgent, ClusterInventory.of([n]), current=plan.current(), overheads=OVERHEADS, preempt=True)
    assert isinstance(after.outcome("fraud-0"), Placement)
    assert len(after.preempted) == 1
    (victim,) = after.preempted
    assert "preempted by fraud-0 (P0, needs 0.1 CPU, 579 MiB host memory)" in after.unplaced[victim].reason


def test_placer_gives_host_memory_back_when_a_model_goes():
    placer = Placer(ClusterInventory.of([node(memory_mb=1200, slots=0)]), overheads=OVERHEADS)
    placer.add_model(make_demands("one", 2, cpu=0.1, backend="torch"))
    update = placer.add_model(make_demands("two", 1, cpu=0.1, backend="torch"))
    assert isinstance(update.plan.outcome("two-0"), Unplaced)
    update = placer.remove_model("one")
    assert isinstance(update.plan.outcome("two-0"), Placement)
    assert placer.place_all(placer.demands()) == update.plan  # a full pass with the same overheads agrees


def test_a_current_placement_that_no_longer_fits_host_memory_is_not_kept():
    n = node(memory_mb=1000, slots=0)  # room for one process of 579 MiB
    kept = place(make_demands("m", 2, cpu=0.1, backend="torch"), ClusterInventory.of([node(memory_mb=1000, slots=None)]))
    assert len(kept.placements) == 2  # before the agent reported how it runs processes
    plan = place(make_demands("m", 2, cpu=0.1, backend="torch"), ClusterInventory.of([n]), current=kept.current(),
                 overheads=OVERHEADS)
    assert sorted(plan.placements) == ["m-0"] and "m-1" in plan.unplaced
