"""Preemption in the placement engine: a P0 (then P1) replica without room evicts the cheapest lower-priority set."""

from __future__ import annotations

from sie.control.placement import ReplicaDemand, make_demands, place
from tests.control.placement.test_placement import inv, node, reason, where


def test_p0_evicts_the_fewest_p2_replicas_on_one_gpu_and_the_victims_move_elsewhere():
    cluster = inv(node("a", gpus=(24576,)), node("b", gpus=(24576,)))
    bulk = make_demands("bulk", 2, priority="P2", gpu_memory_mb=8192) + make_demands("big", 1, priority="P2", gpu_memory_mb=16384)
    current = place(bulk, cluster).current()
    # a: big-0 (16 GiB) + bulk-0 (8 GiB) full, b: bulk-1 (8 GiB), 16 GiB free
    assert {rid: where(place(bulk, cluster), rid)[0] for rid in current} == {"big-0": "a", "bulk-0": "a", "bulk-1": "b"}
    rt = make_demands("rt", 2, priority="P0", gpu_memory_mb=20480)
    without = place(bulk + rt, cluster, current)
    assert "needs 20480 MiB GPU memory" in reason(without, "rt-0") and not without.preempted
    plan = place(bulk + rt, cluster, current, preempt=True)
    # the cheapest eviction: rt-0 takes b (one victim, bulk-1), then rt-1 takes a (big-0 + bulk-0)
    assert (where(plan, "rt-0")[0], where(plan, "rt-1")[0]) == ("b", "a")
    # every P2 replica was evicted (20 GiB of 24 on each GPU is taken by a P0 replica) and none fits back
    assert set(plan.preempted) == {"big-0", "bulk-0", "bulk-1"}
    for rid in plan.preempted:
        assert reason(plan, rid).startswith("unschedulable: preempted by rt-")
    pre = plan.preempted["bulk-1"]
    assert (pre.node, pre.by_priority, pre.victim_priority, pre.freed_mb) == ("b", "P0", "P2", 8192)


def test_cheapest_set_prefers_one_big_victim_over_two_small_and_p2_over_p1():
    cluster = inv(node("a", gpus=(24576,)), node("b", gpus=(24576,)), node("c", gpus=(81920,)))
    ds = (make_demands("small", 2, priority="P2", gpu_memory_mb=12288, cpu=1)
          + make_demands("large", 1, priority="P2", gpu_memory_mb=20480)
          + make_demands("mid", 1, priority="P1", gpu_memory_mb=20480))
    current = {"small-0": ("a", [0]), "small-1": ("a", [0]), "large-0": ("b", [0]), "mid-0": ("c", [0])}
    fill = make_demands("fill", 1, priority="P2", gpu_memory_mb=61440)
    current["fill-0"] = ("c", [0])
    plan = place(ds + fill + make_demands("rt", 1, priority="P0", gpu_memory_mb=16384), cluster, current, preempt=True)
    # b: one P2 victim (large-0) beats a: two P2 victims, and c: a P1 victim
    assert where(plan, "rt-0") == ("b", (0,))
    assert set(plan.preempted) == {"large-0"}
    assert where(plan, "mid-0") == ("c", (0,)) and where(plan, "small-0") == ("a", (0,))


def test_p1_may_evict_p2_but_nothing_evicts_p0():
    cluster = inv(node("a", gpus=(24576,)))
    current = {"core-0": ("a", [0])}
    core = make_demands("core", 1, priority="P0", gpu_memory_mb=20480)
    p1 = make_demands("p1", 1, priority="P1", gpu_memory_mb=8192)
    plan = place(core + p1, cluster, current, preempt=True)
    assert where(plan, "core-0") == ("a", (0,)) and not plan.preempted
    assert "needs 8192 MiB GPU memory" in reason(plan, "p1-0")
    bulk = make_demands("bulk", 1, priority="P2", gpu_memory_mb=20480)
    plan = place(bulk + p1, cluster, {"bulk-0": ("a", [0])}, preempt=True)
    assert where(plan, "p1-0") == ("a", (0,)) and set(plan.preempted) == {"bulk-0"}


def test_evicted_p1_may_in_turn_evict_p2_elsewhere():
    ds = (make_demands("mid", 1, priority="P1", gpu_memory_mb=16384)
          + make_demands("bulk", 1, priority="P2", gpu_memory_mb=16384)
          + make_demands("rt", 1, priority="P0", gpu_memory_mb=20480, node_selector={"zone": "x"}))
    cluster = inv(node("a", gpus=(24576,), labels={"zone": "x"}), node("b", gpus=(24576,)))
    plan = place(ds, cluster, {"mid-0": ("a", [0]), "bulk-0": ("b", [0])}, preempt=True)
    assert where(plan, "rt-0") == ("a", (0,))
    assert where(plan, "mid-0") == ("b", (0,))
    assert plan.preempted["mid-0"].by == "rt-0" and plan.preempted["bulk-0"].by == "mid-0"
    assert reason(plan, "bulk-0").startswith("unschedulable: preempted by mid-0 (P1")


def test_whole_gpu_p0_clears_gpus_of_p2_only_and_cpu_only_evicts_for_cpu():
    cluster = inv(node("a", gpus=(81920, 81920)))
    current = {"x-0": ("a", [0]), "y-0": ("a", [1])}
    ds = [ReplicaDemand("x", 0, priority="P2", gpu_memory_mb=40960), ReplicaDemand("y", 0, priority="P0", gpu_memory_mb=40960),
          ReplicaDemand("tp", 0, priority="P0", gpus=1, gpu_memory_mb=81920)]
    plan = place(ds, cluster, current, preempt=True)
    assert where(plan, "tp-0") == ("a", (0,)) and set(plan.preempted) == {"x-0"}
    cpu = inv(node("c", gpus=(), cpu=2))
    ds = [ReplicaDemand("w", 0, priority="P2", cpu=1.5), ReplicaDemand("r", 0, priority="P0", cpu=1.0)]
    plan = place(ds, cpu, {"w-0": ("c", [])}, preempt=True)
    assert where(plan, "r-0") == ("c", ()) and set(plan.preempted) == {"w-0"}


def test_preemption_is_stable_on_the_next_pass():
    cluster = inv(node("a", gpus=(24576,)))
    ds = make_demands("bulk", 1, priority="P2", gpu_memory_mb=16384) + make_demands("rt", 1, priority="P0", gpu_memory_mb=16384)
    first = place(ds, cluster, {"bulk-0": ("a", [0])}, preempt=True)
    second = place(ds, cluster, first.current(), preempt=True)
    assert where(second, "rt-0") == ("a", (0,)) and not second.preempted
    assert "needs 16384 MiB GPU memory" in reason(second, "bulk-0")
