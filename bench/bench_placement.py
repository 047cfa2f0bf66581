"""Placement benchmark: SIE's best-fit binpack vs a round-robin spread on the same workload.

Workload (seeded, realistic shape, not tuned to win): 300 ModelServices, 1,000 replicas, 100 simulated
nodes x 8 GPUs (10 tier-0 A100-80GB, 60 A100-80GB, 15 H100-80GB, 15 L4-24GB, in 4 zones).
Model sizes: 20% 7-9B LLMs (14-18 GiB), 35% 1.5-3B models (4-7 GiB), 43% small scorers (<= 1 GiB),
2% tensor-parallel LLMs on whole GPUs (gpus=2). 10% P0, 60% P1, 30% P2; some LLMs pin A100s,
some scorers pin L4s via ``nvidia.com/gpu.product``.

Measured: full placement pass (median of runs), incremental events (add model, remove model, node down,
node up, GPU failed; p50/p99 over 200), GPU memory utilisation of the GPUs in use, GPUs in use and
unplaced replicas, against the baseline. Writes bench/results/placement.txt and placement.json.

    python bench/bench_placement.py [--runs 5] [--events 200] [--seed 42]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from types import MappingProxyType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sie.control.placement import (  # noqa: E402
    ClusterInventory,
    GpuState,
    NodeState,
    Placement,
    PlacementPlan,
    Placer,
    ReplicaDemand,
    Unplaced,
    make_demands,
    node_eligible,
    place,
)

GPU_TYPES = {  # product -> MiB
    "NVIDIA A100-SXM4-80GB": 81920,
    "NVIDIA H100 80GB HBM3": 81920,
    "NVIDIA L4": 23034,
}
RESULTS = Path(__file__).resolve().parent / "results"


# ------------------------------------------------------------------------------------------ workload


def make_cluster(rng: random.Random, nodes: int = 100) -> ClusterInventory:
    kinds = (
        ["tier0"] * (nodes // 10)
        + ["NVIDIA A100-SXM4-80GB"] * (nodes * 6 // 10)
        + ["NVIDIA H100 80GB HBM3"] * (nodes * 15 // 100)
    )
    kinds += ["NVIDIA L4"] * (nodes - len(kinds))
    out = []
    for i, kind in enumerate(kinds):
        labels = {"topology.kubernetes.io/zone": f"z{i % 4}"}
        product = kind
        if kind == "tier0":
            labels["sie.io/tier"] = "tier-0"
            product = "NVIDIA A100-SXM4-80GB"
        out.append(
            NodeState(
                name=f"gpu-{i:03d}",
                labels=labels,
                cpu_count=96,
                memory_mb=1024 * 1024,
                gpus=tuple(GpuState(g, product, GPU_TYPES[product], simulated=True) for g in range(8)),
            )
        )
    return ClusterInventory.of(out)


def make_model(rng: random.Random, name: str, replicas: int) -> list[ReplicaDemand]:
    """One model's replicas; sizes follow the mix in the module docstring."""
    r = rng.random()
    priority = rng.choices(["P0", "P1", "P2"], weights=[10, 60, 30])[0]
    selector: dict[str, str] = {}
    gpus = 0
    if r < 0.02:  # tensor-parallel LLM, whole GPUs
        gpu_mb, gpus, cpu, mem = rng.randint(100, 140) * 1024, 2, 8, 65536
        priority = "P1"
    elif r < 0.22:  # 7-9B LLM
        gpu_mb, cpu, mem = rng.randint(14336, 18432), rng.choice([2, 4]), rng.randint(16, 32) * 1024
        if rng.random() < 0.15:
            selector = {"nvidia.com/gpu.product": "A100-80gb"}
        priority = "P0" if priority == "P0" and rng.random() < 0.3 else ("P1" if priority == "P0" else priority)
    elif r < 0.57:  # 1.5-3B
        gpu_mb, cpu, mem = rng.randint(4096, 7168), 2, rng.randint(8, 16) * 1024
    else:  # small scorer (LR/GBDT/BERT-tiny)
        gpu_mb, cpu, mem = rng.randint(128, 1024), 1, rng.randint(1, 4) * 1024
        if rng.random() < 0.1:
            selector = {"nvidia.com/gpu.product": "L4"}
    return make_demands(
        name, replicas, priority=priority, gpu_memory_mb=gpu_mb, gpus=gpus, cpu=cpu, memory_mb=mem,
        node_selector=selector, version="1.0.0",
    )


def make_workload(rng: random.Random, models: int = 300, replicas: int = 1000) -> list[ReplicaDemand]:
    counts = [1] * models
    for _ in range(replicas - models):
        counts[rng.randrange(models)] += 1
    return [d for m, n in enumerate(counts) for d in make_model(rng, f"model-{m:03d}", n)]


# ------------------------------------------------------------------------------------------ baseline


def round_robin(demands: list[ReplicaDemand], inventory: ClusterInventory) -> PlacementPlan:
    """Spread baseline: replicas in the same order, each to the next (node, GPU) slot in a round-robin
    walk (GPU 0 of every node, then GPU 1 of every node, ...) that fits the same constraints."""
    nodes = [n for n in inventory.nodes if n.online]
    free = {(n.name, g.index): g.capacity_mb for n in nodes for g in n.gpus if g.healthy}
    held = {k: 0 for k in free}  # replicas per GPU
    cpu = {n.name: float(n.cpu_count) for n in nodes}
    mem = {n.name: n.memory_mb or None for n in nodes}
    slots = [(n, g.index) for g_i in range(8) for n in nodes for g in n.gpus if g.index == g_i and g.healthy]
    placements, unplaced = {}, {}
    cursor = 0
    order = sorted(demands, key=lambda d: (d.priority_rank, d.model, d.index))
    for d in order:
        host = lambda n: cpu[n.name] >= d.cpu and (mem[n.name] is None or mem[n.name] >= d.memory_mb)  # noqa: E731
        chosen = None
        if d.gpus:
            for k in range(len(nodes)):
                n = nodes[(cursor + k) % len(nodes)]
                whole = [g.index for g in n.gpus if (n.name, g.index) in free and held[(n.name, g.index)] == 0]
                if node_eligible(d, n) and host(n) and len(whole) >= d.gpus:
                    chosen, cursor = (n, tuple(whole[: d.gpus])), (cursor + k + 1) % len(nodes)
                    break
        else:
            for k in range(len(slots)):
                n, gi = slots[(cursor + k) % len(slots)]
                if node_eligible(d, n) and host(n) and free[(n.name, gi)] >= d.gpu_memory_mb:
                    chosen, cursor = (n, (gi,)), (cursor + k + 1) % len(slots)
                    break
        if chosen is None:
            unplaced[d.replica_id] = Unplaced(d.replica_id, d.model, d.version, "unschedulable: round-robin found no slot")
            continue
        n, gis = chosen
        for gi in gis:
            take = free[(n.name, gi)] if d.gpus else d.gpu_memory_mb
            free[(n.name, gi)] -= take
            held[(n.name, gi)] += 1
        cpu[n.name] -= d.cpu
        if mem[n.name] is not None:
            mem[n.name] -= d.memory_mb
        placements[d.replica_id] = Placement(
            d.replica_id, d.model, d.version, n.name, gis,
            sum(n.gpu(gi).capacity_mb for gi in gis) if d.gpus else d.gpu_memory_mb, whole_gpus=bool(d.gpus),
        )
    return PlacementPlan(MappingProxyType(placements), MappingProxyType(unplaced), inventory)


# --------------------------------------------------------------------------------------------- runs


def utilisation_by_tier(plan: PlacementPlan) -> dict[str, float]:
    """Utilisation of GPUs in use, split into tier-0 nodes and the rest: tier-0 is a reserved pool that only
    P0 models (few, small, spread over nodes for HA) may use, so it is under-filled by design."""
    held: dict[tuple[str, int], int] = {}
    for p in plan.placements.values():
        for gi in p.gpu_indices:
            cap = plan.inventory.node(p.node).gpu(gi).capacity_mb
            held[(p.node, gi)] = held.get((p.node, gi), 0) + (cap if p.whole_gpus else p.gpu_memory_mb)
    out = {}
    for label, want in (("tier-0", True), ("other", False)):
        keys = [k for k in held if (plan.inventory.node(k[0]).tier == "tier-0") == want]
        cap = sum(plan.inventory.node(n).gpu(g).capacity_mb for n, g in keys)
        out[label] = sum(held[k] for k in keys) / cap if cap else 0.0
        out[f"{label}_gpus"] = len(keys)
    return out


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def run_events(placer: Placer, rng: random.Random, events: int) -> dict[str, list[float]]:
    kinds = ["add_model", "remove_model", "node_down", "node_up", "gpu_failed"]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    added = 0
    for i in range(events):
        kind = kinds[i % len(kinds)]
        inv = placer.inventory
        if kind == "add_model":
            added += 1
            arg = make_model(rng, f"new-{added:03d}", rng.randint(1, 4))
            call = lambda: placer.add_model(arg)  # noqa: E731
        elif kind == "remove_model":
            name = rng.choice(sorted({d.model for d in placer.demands()}))
            call = lambda: placer.remove_model(name)  # noqa: E731
        elif kind == "node_down":
            name = rng.choice([n.name for n in inv.nodes if n.online])
            call = lambda: placer.node_down(name)  # noqa: E731
        elif kind == "node_up":
            down = [n for n in inv.nodes if not n.online]
            n = rng.choice(down)
            back = NodeState(n.name, n.labels, True, n.cpu_count, n.memory_mb, n.gpus)
            call = lambda: placer.node_up(back)  # noqa: E731
        else:
            n = rng.choice([n for n in inv.nodes if n.online])
            gi = rng.choice([g.index for g in n.gpus if g.healthy])
            call = lambda: placer.gpu_failed(n.name, gi)  # noqa: E731
        t0 = time.perf_counter()
        call()
        times[kind].append((time.perf_counter() - t0) * 1000)
    return times


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--models", type=int, default=300)
    ap.add_argument("--replicas", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    rng = random.Random(args.seed)
    inventory = make_cluster(rng, args.nodes)
    demands = make_workload(rng, args.models, args.replicas)

    full_ms = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        plan = place(demands, inventory)
        full_ms.append((time.perf_counter() - t0) * 1000)
    stable_ms = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        again = place(demands, inventory, current=plan.current())
        stable_ms.append((time.perf_counter() - t0) * 1000)
    assert again == plan, "a stable full pass over an unchanged cluster must not move anything"
    base_ms = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        base = round_robin(demands, inventory)
        base_ms.append((time.perf_counter() - t0) * 1000)

    placer = Placer(inventory)
    placer.place_all(demands)
    ev = run_events(placer, random.Random(args.seed + 1), args.events)
    all_ev = [t for ts in ev.values() for t in ts]

    seeds = {}
    for seed in range(args.seed, args.seed + 5):  # same shape, other draws: is the utilisation a fluke?
        r = random.Random(seed)
        inv_s = make_cluster(r, args.nodes)
        seeds[seed] = place(make_workload(r, args.models, args.replicas), inv_s).stats.utilisation

    s, b = plan.stats, base.stats
    whole = sum(1 for d in demands if d.gpus)
    result = {
        "workload": {
            "models": len({d.model for d in demands}), "replicas": len(demands), "whole_gpu_replicas": whole,
            "nodes": len(inventory.nodes), "gpus": sum(len(n.gpus) for n in inventory.nodes),
            "tier0_nodes": sum(1 for n in inventory.nodes if n.tier == "tier-0"),
            "gpu_memory_requested_mb": sum(d.gpu_memory_mb for d in demands if not d.gpus), "seed": args.seed,
        },
        "sie": {
            "full_pass_ms_median": statistics.median(full_ms), "stable_pass_ms_median": statistics.median(stable_ms),
            "utilisation": s.utilisation, "gpus_in_use": s.gpus_in_use, "nodes_in_use": s.nodes_in_use,
            "unplaced": s.replicas_unplaced, "relaxed_anti_affinity": s.relaxed_anti_affinity,
            "utilisation_by_tier": utilisation_by_tier(plan),
        },
        "baseline_round_robin": {
            "full_pass_ms_median": statistics.median(base_ms), "utilisation": b.utilisation,
            "gpus_in_use": b.gpus_in_use, "nodes_in_use": b.nodes_in_use, "unplaced": b.replicas_unplaced,
            "utilisation_by_tier": utilisation_by_tier(base),
        },
        "events_ms": {
            k: {"n": len(v), "p50": _pct(v, 0.5), "p99": _pct(v, 0.99), "max": max(v)} for k, v in ev.items() if v
        }
        | {"all": {"n": len(all_ev), "p50": _pct(all_ev, 0.5), "p99": _pct(all_ev, 0.99), "max": max(all_ev)}},
        "utilisation_over_seeds": seeds,
        "events_end_state": {"unplaced": placer.plan.stats.replicas_unplaced, "utilisation": placer.plan.stats.utilisation},
        "targets": {"full_pass_ms": 1000, "event_ms": 10, "utilisation": 0.89},
    }
    text = render(result)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "placement.txt").write_text(text + "\n")
    (args.out / "placement.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def render(r: dict) -> str:
    w, s, b, e = r["workload"], r["sie"], r["baseline_round_robin"], r["events_ms"]

    def ratio(x: float, y: float) -> str:
        return f"{x / y:.2f}x" if y else "-"

    lines = [
        "SIE placement benchmark (python bench/bench_placement.py)",
        f"workload: {w['models']} models, {w['replicas']} replicas ({w['whole_gpu_replicas']} on whole GPUs), "
        f"{w['nodes']} nodes x 8 = {w['gpus']} GPUs ({w['tier0_nodes']} tier-0 nodes), "
        f"{w['gpu_memory_requested_mb'] / 1024:.0f} GiB shared-GPU memory requested, seed {w['seed']}",
        "",
        f"{'metric':<44}{'SIE binpack':>14}{'round-robin':>14}{'SIE/base':>10}",
        f"{'GPU memory utilisation (GPUs in use)':<44}{s['utilisation']:>14.1%}{b['utilisation']:>14.1%}"
        f"{ratio(s['utilisation'], b['utilisation']):>10}",
        f"{'  on tier-0 nodes (P0 only)':<44}{s['utilisation_by_tier']['tier-0']:>14.1%}"
        f"{b['utilisation_by_tier']['tier-0']:>14.1%}{'':>10}",
        f"{'  on other nodes':<44}{s['utilisation_by_tier']['other']:>14.1%}"
        f"{b['utilisation_by_tier']['other']:>14.1%}{ratio(s['utilisation_by_tier']['other'], b['utilisation_by_tier']['other']):>10}",
        f"{'GPUs in use':<44}{s['gpus_in_use']:>14}{b['gpus_in_use']:>14}{ratio(s['gpus_in_use'], b['gpus_in_use']):>10}",
        f"{'nodes in use':<44}{s['nodes_in_use']:>14}{b['nodes_in_use']:>14}{ratio(s['nodes_in_use'], b['nodes_in_use']):>10}",
        f"{'unplaced replicas':<44}{s['unplaced']:>14}{b['unplaced']:>14}{'':>10}",
        f"{'full pass, ms (median)':<44}{s['full_pass_ms_median']:>14.1f}{b['full_pass_ms_median']:>14.1f}"
        f"{ratio(s['full_pass_ms_median'], b['full_pass_ms_median']):>10}",
        f"{'stable full pass with current, ms (median)':<44}{s['stable_pass_ms_median']:>14.1f}{'':>14}{'':>10}",
        f"{'replicas sharing a node (anti-affinity relaxed)':<44}{s['relaxed_anti_affinity']:>14}{'':>14}{'':>10}",
        "",
        f"{'incremental event (SIE Placer)':<30}{'n':>6}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}",
    ]
    for k, v in e.items():
        lines.append(f"{k:<30}{v['n']:>6}{v['p50']:>10.3f}{v['p99']:>10.3f}{v['max']:>10.3f}")
    u = sorted(r["utilisation_over_seeds"].values())
    lines += [
        "",
        f"SIE utilisation over seeds {min(r['utilisation_over_seeds'])}..{max(r['utilisation_over_seeds'])}: "
        f"min {u[0]:.1%}, median {statistics.median(u):.1%}, max {u[-1]:.1%}",
    ]
    t = r["targets"]
    ok = lambda c: "met" if c else "MISSED"  # noqa: E731
    lines += [
        "",
        f"targets: full pass <= {t['full_pass_ms']} ms: {ok(s['full_pass_ms_median'] <= t['full_pass_ms'])}; "
        f"event p99 <= {t['event_ms']} ms: {ok(e['all']['p99'] <= t['event_ms'])}; "
        f"utilisation >= {t['utilisation']:.0%}: {ok(s['utilisation'] >= t['utilisation'])} "
        "(article: 58.3% -> 89.1% on 8xA100)",
    ]
    if s["utilisation"] < t["utilisation"]:
        lines.append(
            "why: tier-0 nodes are a reserved pool only P0 models may use; the workload's P0 replicas are few and "
            f"spread over tier-0 nodes for HA, so those GPUs run at {s['utilisation_by_tier']['tier-0']:.1%}; "
            f"GPUs on other nodes reach {s['utilisation_by_tier']['other']:.1%}. The rest is the tail of each "
            "priority pass (P0, then P1, then P2) and anti-affinity opening GPUs on nodes without the model."
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
