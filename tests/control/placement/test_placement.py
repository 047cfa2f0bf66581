"""Placement engine: packing, constraints, reasons, stability and incremental events."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from sie.control.placement import (
    ClusterInventory,
    GpuState,
    NodeState,
    Placement,
    Placer,
    ReplicaDemand,
    Unplaced,
    demands_from_spec,
    make_demands,
    place,
    validate_tier_request,
)

A100 = "NVIDIA A100-SXM4-80GB"
L4 = "NVIDIA L4"


def node(name, gpus=(81920,), product=A100, tier=None, labels=None, cpu=64, online=True, memory_mb=0):
    labels = dict(labels or {})
    if tier:
        labels["sie.io/tier"] = tier
    return NodeState(
        name=name,
        labels=labels,
        online=online,
        cpu_count=cpu,
        memory_mb=memory_mb,
        gpus=tuple(GpuState(i, product, mb, simulated=True) for i, mb in enumerate(gpus)),
    )


def inv(*nodes):
    return ClusterInventory.of(nodes)


def where(plan, rid):
    p = plan.outcome(rid)
    assert isinstance(p, Placement), p
    return p.node, p.gpu_indices


def reason(plan, rid):
    u = plan.outcome(rid)
    assert isinstance(u, Unplaced), u
    return u.reason


def assert_no_overcommit(plan):
    held = Counter()
    for p in plan.placements.values():
        for gi in p.gpu_indices:
            cap = plan.inventory.node(p.node).gpu(gi).capacity_mb
            held[(p.node, gi)] += cap if p.whole_gpus else p.gpu_memory_mb
    for (n, gi), mb in held.items():
        g = plan.inventory.node(n).gpu(gi)
        assert g.healthy and plan.inventory.node(n).online
        assert mb <= g.capacity_mb, (n, gi, mb)


def random_workload(seed=7, nodes=12, models=40):
    rng = random.Random(seed)
    ns = [node(f"n{i:02d}", gpus=(81920,) * 4, tier="tier-0" if i < 2 else None) for i in range(nodes)]
    ds = []
    for m in range(models):
        ds += make_demands(
            f"m{m:02d}",
            rng.randint(1, 3),
            priority=rng.choice(["P0", "P1", "P1", "P2"]),
            gpu_memory_mb=rng.choice([512, 4096, 6144, 14336, 18432]),
            cpu=1,
        )
    return ns, ds


# ----------------------------------------------------------------------------------------- determinism


def test_same_input_in_any_order_gives_the_same_plan():
    ns, ds = random_workload()
    first = place(ds, inv(*ns))
    for seed in range(3):
        rng = random.Random(seed)
        shuffled_d, shuffled_n = ds[:], ns[:]
        rng.shuffle(shuffled_d)
        rng.shuffle(shuffled_n)
        assert place(shuffled_d, inv(*shuffled_n)) == first
    assert first.stats.replicas_placed == len(ds)
    assert_no_overcommit(first)


# -------------------------------------------------------------------------------------------- packing


def test_best_fit_picks_the_used_gpu_left_with_least_free_memory():
    cluster = inv(node("a"), node("b"))
    ds = [
        ReplicaDemand(model="x", index=0, gpu_memory_mb=61440),
        ReplicaDemand(model="y", index=0, gpu_memory_mb=40960),
        ReplicaDemand(model="z", index=0, gpu_memory_mb=16384),
        ReplicaDemand(model="w", index=0, gpu_memory_mb=15360),
    ]
    plan = place(ds, cluster)
    assert where(plan, "x-0") == ("a", (0,))  # 20 GiB left
    assert where(plan, "y-0") == ("b", (0,))  # does not fit a: opens b, 40 GiB left
    assert where(plan, "z-0") == ("a", (0,))  # 4 GiB left on a beats 24 GiB on b
    assert where(plan, "w-0") == ("b", (0,))  # a has 4 GiB left
    assert plan.stats.gpus_in_use == 2


def test_new_gpus_open_in_the_most_abundant_pool_so_pinned_models_keep_room():
    l4 = {"nvidia.com/gpu.product": "L4"}
    cluster = inv(node("l4", gpus=(23034,), product=L4, labels=l4), node("a1"), node("a2"))
    ds = make_demands("any", 2, priority="P0", gpu_memory_mb=20480) + make_demands(
        "pinned", 1, priority="P2", gpu_memory_mb=16384, node_selector=l4
    )
    plan = place(ds, cluster)
    # a global best fit would put an "any" replica on the L4 (2.5 GiB left) and strand "pinned"
    assert [where(plan, r)[0] for r in ("any-0", "any-1")] == ["a1", "a2"]
    assert where(plan, "pinned-0") == ("l4", (0,))


def test_binpack_fills_one_gpu_and_one_node_before_the_next():
    cluster = inv(node("a", gpus=(81920, 81920)), node("b", gpus=(81920, 81920)))
    ds = [ReplicaDemand(model=f"m{i}", index=0, gpu_memory_mb=20480) for i in range(6)]
    plan = place(ds, cluster)
    slots = Counter(where(plan, d.replica_id) for d in ds)
    assert slots == {("a", (0,)): 4, ("a", (1,)): 2}
    assert plan.stats.gpus_in_use == 2
    assert plan.stats.utilisation == pytest.approx(6 * 20480 / (2 * 81920))


def test_whole_gpu_request_takes_entirely_free_gpus_on_one_node():
    cluster = inv(node("a", gpus=(81920,) * 4), node("b", gpus=(81920,) * 4))
    ds = make_demands("shared", 1, gpu_memory_mb=1024) + make_demands("tp2", 1, gpus=2, gpu_memory_mb=100000)
    plan = place(ds, cluster)
    # tp2 is larger and goes first: a/0,1; shared then best-fits... any free GPU: a/2 (node fill)
    assert where(plan, "tp2-0") == ("a", (0, 1))
    p = plan.placements["tp2-0"]
    assert p.whole_gpus and p.gpu_memory_mb == 2 * 81920
    assert where(plan, "shared-0") == ("a", (2,))
    big = place(make_demands("tp8", 1, gpus=8), cluster)
    assert reason(big, "tp8-0") == "unschedulable: needs 8 whole free GPU(s) on one node; most on one node is 4 on a"


def test_whole_gpu_skips_gpus_that_host_shared_replicas():
    cluster = inv(node("a", gpus=(81920,) * 2))
    placer = Placer(cluster)
    placer.add_model(make_demands("shared", 1, gpu_memory_mb=1024))
    update = placer.add_model(make_demands("tp", 1, gpus=2))
    assert reason(update.plan, "tp-0") == "unschedulable: needs 2 whole free GPU(s) on one node; most on one node is 1 on a"
    assert update.diff.unplaced[0].replica_id == "tp-0"


def test_unschedulable_message_names_largest_free_gpu():
    cluster = inv(node("gpu-01", gpus=(4096,)), node("gpu-02", gpus=(4096, 8192)))
    plan = place(make_demands("qwen", 1, gpu_memory_mb=12288), cluster)
    assert reason(plan, "qwen-0") == "unschedulable: needs 12288 MiB GPU memory; largest free is 8192 MiB on gpu-02/1"


def test_cpu_only_models_need_cpu_room():
    cluster = inv(node("a", gpus=(), cpu=8), node("b", gpus=(), cpu=6))
    plan = place(make_demands("lr", 3, cpu=4), cluster)
    assert [where(plan, r)[0] for r in ("lr-0", "lr-1")] == ["b", "a"]  # best fit: b (2 CPUs left), then spread
    assert where(plan, "lr-0")[1] == ()
    # third replica: a has 4 left (shares node a with a note), b has 2
    assert where(plan, "lr-2") == ("a", ())
    assert "anti-affinity relaxed" in plan.placements["lr-2"].note
    full = place(make_demands("lr", 4, cpu=4), cluster)
    assert reason(full, "lr-3") == ("unschedulable: needs 4 CPU; declared CPU is used up on every eligible node; most "
                                    "free on b: 2 of 6 CPU free (its replicas declare 4; CPU is packed by "
                                    "resources.cpu, not by load)")


def test_a_node_full_of_declared_cpu_says_so_not_memory():
    """Issue 28.8: four models at cpu 0.5 filled a 2-core node (idle, memory to spare) and the fifth stayed
    unschedulable: the reason names declared CPU as what ran out, with the numbers."""
    demands = [d for m in "abcde" for d in make_demands(m, 1, cpu=0.5, memory_mb=25)]
    plan = place(demands, inv(node("nu1-a", gpus=(), cpu=2, memory_mb=24000)))
    assert len(plan.placements) == 4
    (unplaced,) = plan.unplaced.values()
    assert unplaced.reason == ("unschedulable: needs 0.5 CPU; declared CPU is used up on nu1-a: 0 of 2 CPU free "
                               "(its replicas declare 2; CPU is packed by resources.cpu, not by load)")
    assert "memory" not in unplaced.reason


def test_when_cpu_is_short_on_one_node_and_memory_on_the_other_the_reason_names_each():
    demands = make_demands("a", 1, cpu=2, memory_mb=25) + make_demands("c", 1, cpu=0.5, memory_mb=1000) + \
        make_demands("b", 1, cpu=0.1, memory_mb=2500)
    plan = place(demands, inv(node("n1", gpus=(), cpu=2, memory_mb=4000), node("n2", gpus=(), cpu=2, memory_mb=3000)))
    assert reason(plan, "b-0") == ("unschedulable: needs 0.1 CPU, 2500 MiB host memory on one node; no eligible node "
                                   "has all of them free (n1: 0 of 2 CPU free (declared); n2: 2000 MiB host memory "
                                   "free)")


def test_host_memory_is_enforced_when_reported():
    cluster = inv(node("a", memory_mb=16384), node("b", memory_mb=0))
    plan = place(make_demands("m", 1, gpu_memory_mb=1024, memory_mb=32768), cluster)
    assert where(plan, "m-0")[0] == "b"
    only_a = place(make_demands("m", 1, gpu_memory_mb=1024, memory_mb=32768), inv(node("a", memory_mb=16384)))
    assert reason(only_a, "m-0") == "unschedulable: needs 32768 MiB host memory; most free is 16384 MiB on a"


# ---------------------------------------------------------------------------------------- constraints


def test_selector_mismatch_reason_lists_what_nodes_have():
    labels = {"nvidia.com/gpu.product": "L4"}
    cluster = inv(node("a", labels=labels, product=L4), node("b", labels=labels, product=L4))
    ds = make_demands("qwen", 1, gpu_memory_mb=12288, node_selector={"nvidia.com/gpu.product": "A100-80gb"})
    assert reason(place(ds, cluster), "qwen-0") == (
        "unschedulable: no online node matches nodeSelector nvidia.com/gpu.product=A100-80gb (nodes: a, b have L4)"
    )


def test_gpu_product_selector_falls_back_to_gpu_names_when_label_missing():
    cluster = inv(node("l4", gpus=(24576,), product=L4), node("a100", product=A100))
    ds = make_demands("qwen", 1, gpu_memory_mb=12288, node_selector={"nvidia.com/gpu.product": "A100-80gb"})
    assert where(place(ds, cluster), "qwen-0")[0] == "a100"  # the L4 would be the better fit
    other = make_demands("x", 1, gpu_memory_mb=1, node_selector={"nvidia.com/gpu.product": "H100"})
    assert reason(place(other, cluster), "x-0") == (
        f"unschedulable: no online node matches nodeSelector nvidia.com/gpu.product=H100 (nodes: a100 has {A100}; l4 has {L4})"
    )


def test_tier0_nodes_host_only_p0_models():
    cluster = inv(node("t0", tier="tier-0"), node("g", gpus=(24576,), product=L4))
    plan = place(
        make_demands("lr", 1, priority="P0", gpu_memory_mb=1024)
        + make_demands("llm", 1, priority="P1", gpu_memory_mb=16384)
        + make_demands("big", 1, priority="P2", gpu_memory_mb=40960),
        cluster,
    )
    assert where(plan, "lr-0")[0] == "t0"  # P0 prefers tier-0 although the L4 is the better fit
    assert where(plan, "llm-0")[0] == "g"
    assert reason(plan, "big-0") == "unschedulable: needs 40960 MiB GPU memory; largest free is 8192 MiB on g/0"
    only_t0 = place(make_demands("llm", 1, priority="P1", gpu_memory_mb=16384), inv(node("t0", tier="tier-0")))
    assert reason(only_t0, "llm-0") == "unschedulable: tier-0 nodes host only P0 models"
    asked = place(make_demands("llm", 1, priority="P2", gpu_memory_mb=1, tier="tier-0"), cluster)
    assert reason(asked, "llm-0") == "unschedulable: tier-0 nodes host only P0 models"


def test_p0_spills_to_general_nodes_when_tier0_is_full():
    cluster = inv(node("t0", gpus=(8192,), tier="tier-0"), node("g"))
    plan = place(make_demands("lr", 2, priority="P0", gpu_memory_mb=6144), cluster)
    assert [where(plan, r)[0] for r in ("lr-0", "lr-1")] == ["t0", "g"]  # lr-0 fills tier-0, lr-1 spills


@dataclass
class _Sched:
    node_selector: dict = field(default_factory=dict)
    tier: str | None = None


@dataclass
class _Res:
    gpu_memory_mb: int = 0
    gpus: int = 0
    cpu: float = 1.0
    memory_mb: int = 0


@dataclass
class _Backend:
    type: str = "torch"


@dataclass
class _Sla:
    min_replicas: int = 1
    max_replicas: int = 1


@dataclass
class _Spec:
    """Stand-in with the agreed ModelService attribute names (sie.schemas.spec is another engineer's module)."""

    name: str = "fraud-scorer"
    version: str = "1.0.0"
    priority_level: str = "P1"
    resources: _Res = field(default_factory=_Res)
    scheduling: _Sched = field(default_factory=_Sched)
    sla: _Sla = field(default_factory=_Sla)
    backend: _Backend = field(default_factory=_Backend)


def test_validate_tier_request_for_409():
    cluster = inv(node("t0", tier="tier-0", labels={"pool": "fast"}), node("g"))
    assert validate_tier_request(_Spec(scheduling=_Sched(tier="tier-0")), cluster) == (
        "tier-0 nodes host only P0 models: fraud-scorer is P1 and asks for tier-0 nodes (scheduling.tier=tier-0)"
    )
    by_label = _Spec(priority_level="P2", scheduling=_Sched(node_selector={"sie.io/tier": "tier-0"}))
    assert "nodeSelector sie.io/tier=tier-0" in validate_tier_request(by_label, cluster)
    only_t0 = _Spec(scheduling=_Sched(node_selector={"pool": "fast"}))
    assert "matches only tier-0 nodes" in validate_tier_request(only_t0, cluster)
    assert validate_tier_request(_Spec(priority_level="P0", scheduling=_Sched(tier="tier-0")), cluster) is None
    assert validate_tier_request(_Spec(), cluster) is None


def test_demands_from_spec_places_min_replicas_with_stable_ids():
    spec = _Spec(
        priority_level="P0",
        resources=_Res(gpu_memory_mb=12288, cpu=2, memory_mb=4096),
        scheduling=_Sched(node_selector={"nvidia.com/gpu.product": "A100-80gb"}),
        sla=_Sla(min_replicas=2, max_replicas=4),
    )
    ds = demands_from_spec(spec)
    assert [d.replica_id for d in ds] == ["fraud-scorer-0", "fraud-scorer-1"]
    assert ds[0] == ReplicaDemand(
        model="fraud-scorer", index=0, version="1.0.0", priority="P0", gpu_memory_mb=12288, cpu=2.0,
        memory_mb=4096, node_selector=(("nvidia.com/gpu.product", "A100-80gb"),), backend="torch",
    )


def test_bad_demand_is_a_clear_error():
    with pytest.raises(ValueError, match=r"ReplicaDemand.gpu_memory_mb: must be >= 0 \(got -5\)"):
        ReplicaDemand(model="m", index=0, gpu_memory_mb=-5)


# -------------------------------------------------------------------------------------- anti-affinity


def test_replicas_spread_over_nodes_when_possible():
    cluster = inv(node("a", gpus=(81920,) * 2), node("b", gpus=(81920,) * 2))
    plan = place(make_demands("m", 2, gpu_memory_mb=8192), cluster)
    assert [where(plan, r)[0] for r in ("m-0", "m-1")] == ["a", "b"]
    assert all(p.note is None for p in plan.placements.values())


def test_replicas_share_a_node_on_other_gpus_only_when_no_other_node_fits():
    cluster = inv(node("a", gpus=(81920,) * 2), node("b", gpus=(4096,)))
    plan = place(make_demands("m", 2, gpu_memory_mb=8192), cluster)
    assert [where(plan, r) for r in ("m-0", "m-1")] == [("a", (0,)), ("a", (1,))]
    assert plan.placements["m-1"].note == (
        "anti-affinity relaxed: shares node a with another replica of m (no other node fits)"
    )
    one_gpu = place(make_demands("m", 2, gpu_memory_mb=8192), inv(node("a")))
    assert one_gpu.placements["m-1"].note.startswith("anti-affinity relaxed: shares GPU a/0")
    assert one_gpu.stats.relaxed_anti_affinity == 1


# ------------------------------------------------------------------------------------------ stability


def test_adding_a_model_does_not_move_existing_replicas():
    cluster = inv(node("a", gpus=(81920,) * 2), node("b", gpus=(81920,) * 2))
    placer = Placer(cluster)
    before = placer.add_model(make_demands("old", 2, priority="P2", gpu_memory_mb=40960)).plan
    update = placer.add_model(make_demands("new", 2, priority="P0", gpu_memory_mb=61440))
    for rid in ("old-0", "old-1"):
        assert update.plan.placements[rid] == before.placements[rid]
    assert [p.replica_id for p in update.diff.placed] == ["new-0", "new-1"]
    assert not update.diff.moved and not update.diff.removed
    # a fresh pass would have put the P0 model first; the stable full pass keeps old where it is
    again = place(placer.demands(), cluster, current=update.plan.current())
    assert again == update.plan


def test_full_pass_keeps_valid_current_placements():
    cluster = inv(node("a"), node("b"))
    ds = make_demands("m", 1, gpu_memory_mb=1024)
    assert where(place(ds, cluster), "m-0") == ("a", (0,))
    assert where(place(ds, cluster, current={"m-0": ("b", [0])}), "m-0") == ("b", (0,))
    # an invalid current slot (no GPU 5) is re-placed
    assert where(place(ds, cluster, current={"m-0": ("b", [5])}), "m-0") == ("a", (0,))


def test_changing_a_models_version_keeps_its_replicas_in_place():
    placer = Placer(inv(node("a"), node("b")))
    placer.add_model(make_demands("m", 2, gpu_memory_mb=1024, version="1"))
    update = placer.add_model(make_demands("m", 2, gpu_memory_mb=1024, version="2"))
    assert [p.version for p in update.diff.moved] == ["2", "2"]  # same slot, new version
    assert {p.slot for p in update.diff.moved} == {("a", (0,)), ("b", (0,))}


# ----------------------------------------------------------------------------------------- failures


def test_node_down_moves_its_replicas_and_reports_those_that_cannot_move():
    cluster = inv(node("a"), node("b"), node("c", gpus=(8192,)))
    placer = Placer(cluster)
    placer.add_model(make_demands("big", 2, gpu_memory_mb=40960))
    placer.add_model(make_demands("small", 1, gpu_memory_mb=4096))
    assert placer.plan.placements["big-0"].slot == ("a", (0,))
    assert placer.plan.placements["big-1"].slot == ("b", (0,))
    assert placer.plan.placements["small-0"].slot == ("a", (0,))  # best fit among used GPUs (tie: a)
    update = placer.node_down("a")
    plan = update.plan
    assert where(plan, "big-0") == ("b", (0,))  # shares b with big-1 (note): no other node fits
    assert "anti-affinity relaxed" in plan.placements["big-0"].note
    assert [p.replica_id for p in update.diff.moved] == ["big-0", "small-0"]
    assert where(plan, "small-0") == ("c", (0,))  # b/0 is full now
    assert plan.assignments("a") == ()
    update = placer.node_down("b")
    assert reason(update.plan, "big-0") == "unschedulable: needs 40960 MiB GPU memory; largest free is 4096 MiB on c/0"
    assert {p.replica_id for p in update.diff.removed} == {"big-0", "big-1"}
    assert_no_overcommit(update.plan)
    # the node comes back: the waiting replicas are placed again
    back = placer.node_up(cluster.node("a"))
    assert {p.replica_id for p in back.diff.placed} == {"big-0", "big-1"}
    assert not back.plan.unplaced


def test_gpu_failure_moves_the_replicas_on_that_gpu():
    placer = Placer(inv(node("a", gpus=(81920,) * 4)))
    placer.add_model(make_demands("tp", 1, gpus=2))
    placer.add_model(make_demands("m", 1, gpu_memory_mb=8192))
    assert placer.plan.placements["tp-0"].gpu_indices == (0, 1)
    assert placer.plan.placements["m-0"].gpu_indices == (2,)
    update = placer.gpu_failed("a", 1)
    assert update.plan.placements["tp-0"].gpu_indices == (0, 3)  # whole-GPU replica moves as a whole
    assert update.plan.placements["m-0"].gpu_indices == (2,)
    update = placer.gpu_failed("a", 2)
    # the two healthy GPUs left are held whole by tp-0
    assert reason(update.plan, "m-0") == "unschedulable: needs 8192 MiB GPU memory; largest free is 0 MiB on a/0"
    assert [u.replica_id for u in update.diff.unplaced] == ["m-0"]
    assert not update.plan.inventory.node("a").gpu(2).healthy
    assert_no_overcommit(update.plan)


def test_incremental_events_equal_a_stable_full_pass():
    ns, ds = random_workload(seed=3, nodes=8, models=50)
    cluster = inv(*ns)
    placer = Placer(cluster)
    placer.place_all(ds)
    rng = random.Random(11)
    for step in range(30):
        previous = placer.plan
        kind = step % 5
        if kind == 0:
            update = placer.add_model(make_demands(f"x{step}", rng.randint(1, 3), gpu_memory_mb=rng.choice([2048, 16384])))
        elif kind == 1:
            update = placer.remove_model(rng.choice(sorted({d.model for d in placer.demands()})))
        elif kind == 2:
            update = placer.node_down(rng.choice([n.name for n in placer.inventory.nodes if n.online]))
        elif kind == 3:
            n = rng.choice(placer.inventory.nodes)
            update = placer.gpu_failed(n.name, rng.choice(n.gpus).index)
        else:
            offline = [n for n in placer.inventory.nodes if not n.online]
            target = offline[0] if offline else placer.inventory.nodes[0]
            update = placer.node_up(NodeState(target.name, target.labels, True, target.cpu_count, target.memory_mb, target.gpus))
        expected = place(placer.demands(), placer.inventory, current=previous.current())
        assert update.plan == expected, f"step {step}"
        assert_no_overcommit(update.plan)


def test_benchmark_runs_at_small_scale(tmp_path):
    from bench.bench_placement import main

    result = main(["--runs", "1", "--events", "20", "--models", "30", "--replicas", "100", "--nodes", "10",
                   "--out", str(tmp_path)])
    assert result["workload"]["replicas"] == 100
    assert result["sie"]["gpus_in_use"] < result["baseline_round_robin"]["gpus_in_use"]
    assert result["sie"]["utilisation"] > result["baseline_round_robin"]["utilisation"]
    assert (tmp_path / "placement.txt").read_text().startswith("SIE placement benchmark")


# ------------------------------------------------------------------------------------ preferred node


def test_a_preferred_node_is_honoured_when_it_fits_and_ignored_otherwise():
    ns = inv(node("a", gpus=(81920, 81920)), node("b", gpus=(81920, 81920)), node("c", gpus=(81920,)))
    ds = make_demands("m", 3, gpu_memory_mb=40000, cpu=1)
    first = place(ds[:2], ns)
    home, other = where(first, "m-0")[0], where(first, "m-1")[0]
    spread = place(ds, ns, first.current())
    assert where(spread, "m-2")[0] not in {home, other}  # without a hint anti-affinity picks the third node
    hinted = place(ds, ns, first.current(), preferred={"m-2": home})
    assert where(hinted, "m-2")[0] == home  # the hint beats anti-affinity when the node fits
    assert where(hinted, "m-0") == where(first, "m-0") and where(hinted, "m-1") == where(first, "m-1")
    assert_no_overcommit(hinted)
    # ignored when the node does not fit: unknown, excluded for that replica, offline
    offline = inv(*(n if n.name != home else node(home, gpus=(81920, 81920), online=False) for n in ns.nodes))
    for preferred, excluded, inventory in (({"m-2": "nowhere"}, None, ns), ({"m-2": home}, {"m-2": {home}}, ns),
                                           ({"m-2": home}, None, offline)):
        plan = place(ds, inventory, first.current(), excluded=excluded, preferred=preferred)
        assert where(plan, "m-2")[0] != home and not plan.unplaced
    # ... or full: placed elsewhere, nothing evicted for a hint
    two = inv(node("x", gpus=(81920,)), node("y", gpus=(81920,)))
    whole = make_demands("w", 2, gpu_memory_mb=81920, cpu=1)
    one = place(whole[:1], two)
    taken = where(one, "w-0")[0]
    plan = place(whole, two, one.current(), preempt=True, preferred={"w-1": taken})
    assert where(plan, "w-0")[0] == taken and where(plan, "w-1")[0] != taken and not plan.preempted
    # a replica kept where it is does not move for a hint
    kept = place(ds, ns, hinted.current(), preferred={"m-2": other})
    assert where(kept, "m-2") == where(hinted, "m-2")


# ----------------------------------------------------------------------------------------- exclusions


def test_excluded_node_is_never_used_and_a_current_placement_there_moves():
    ns = inv(node("a", gpus=(81920,)), node("b", gpus=(81920,)))
    ds = make_demands("m", 1, gpu_memory_mb=4096, cpu=1)
    first = place(ds, ns)
    here = where(first, "m-0")[0]
    other = "b" if here == "a" else "a"
    plan = place(ds, ns, first.current(), excluded={"m-0": {here}})
    assert where(plan, "m-0") == (other, (0,))
    # the exclusion is per replica: a second replica of the same model may still use that node
    ds2 = make_demands("m", 2, gpu_memory_mb=4096, cpu=1)
    plan2 = place(ds2, ns, excluded={"m-0": {here}})
    assert where(plan2, "m-0")[0] == other and where(plan2, "m-1")[0] == here


def test_excluded_everywhere_says_so_and_capacity_reasons_skip_excluded_nodes():
    ns = inv(node("a", gpus=(81920,)), node("b", gpus=(8192,)))
    plan = place(make_demands("m", 1, gpu_memory_mb=4096, cpu=1), ns, excluded={"m-0": {"a", "b"}})
    assert reason(plan, "m-0") == "unschedulable: m-0 is excluded from every eligible node (a, b)"
    # a too small node left: the reason quotes it, not the big excluded one
    plan = place(make_demands("m", 1, gpu_memory_mb=16384, cpu=1), ns, excluded={"m-0": {"a"}})
    assert reason(plan, "m-0") == "unschedulable: needs 16384 MiB GPU memory; largest free is 8192 MiB on b/0"
    whole = place(make_demands("w", 1, gpus=1, gpu_memory_mb=1, cpu=1), ns, excluded={"w-0": {"a", "b"}})
    assert "excluded from every eligible node" in reason(whole, "w-0")
    cpu_only = place(make_demands("c", 1, cpu=1), ns, excluded={"c-0": {"a"}})
    assert where(cpu_only, "c-0") == ("b", ())


def test_placer_exclude_moves_and_lifting_it_keeps_the_new_place():
    ns = inv(node("a", gpus=(81920,)), node("b", gpus=(81920,)))
    placer = Placer(ns)
    placer.place_all(make_demands("m", 1, gpu_memory_mb=4096, cpu=1))
    here = where(placer.plan, "m-0")[0]
    update = placer.exclude("m-0", {here})
    assert [p.replica_id for p in update.diff.moved] == ["m-0"] and where(update.plan, "m-0")[0] != here
    assert update.plan == place(placer.demands(), ns, excluded={"m-0": {here}})
    lifted = placer.exclude("m-0", ())
    assert lifted.diff.empty  # stable: nothing moves back just because it may
    assert placer.place_all(placer.demands()) == lifted.plan
