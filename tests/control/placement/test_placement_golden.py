"""Placement golden: seeded inventories and demands -> the plan, every reason text and every diff, as recorded.

The engine's behaviour is pinned byte for byte: full passes (``place`` with current placements, exclusions,
preferred nodes, preemption, host-memory overheads), ``Placer`` event sequences (their plans and diffs),
``node_eligible`` and ``validate_tier_request``.  A change of any outcome or reason fails here; an intended
change records the golden again and shows the difference in review:

    ./.venv/bin/python -m tests.control.placement.test_placement_golden --record
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sie.control.placement import (
    GPU_PRODUCT_LABEL,
    TIER0,
    TIER_LABEL,
    ClusterInventory,
    GpuState,
    NodeState,
    PlacementPlan,
    Placer,
    PlanDiff,
    ReplicaDemand,
    node_eligible,
    place,
    validate_tier_request,
)
from sie.control.placement.host_memory import HostOverheads

GOLDEN = Path(__file__).with_name("golden_plans.json")
FULL_PASSES = 160
EVENT_RUNS = 40
PRODUCTS = ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA L4")
SELECTORS: tuple[dict[str, str], ...] = (
    {"zone": "a"}, {"zone": "c"}, {GPU_PRODUCT_LABEL: "A100-80gb"}, {GPU_PRODUCT_LABEL: "L4"},
    {GPU_PRODUCT_LABEL: "NVIDIA L4"}, {TIER_LABEL: TIER0}, {"zone": "b", GPU_PRODUCT_LABEL: "h100"},
)
#: every family of reason the engine gives must occur in the golden (else the cases are too tame to pin it)
REASON_FAMILIES = (
    "no online nodes", "tier-0 nodes host only P0 models", "no online node matches nodeSelector",
    "no online node in", "is excluded from every eligible node", "MiB GPU memory; largest free is",
    "whole free GPU(s)", "declared CPU is used up", "MiB host memory", "no eligible node has all of them free",
    "preempted by",
)


# ------------------------------------------------------------------------------------------- inputs


def _node(rng: random.Random, i: int) -> NodeState:
    labels: dict[str, str] = {"zone": rng.choice("ab")}
    tier = rng.choices([None, TIER0, "tier-1"], [6, 2, 1])[0]
    if tier:
        labels[TIER_LABEL] = tier
    product = rng.choice(PRODUCTS)
    if rng.random() < 0.2:
        labels[GPU_PRODUCT_LABEL] = product.replace(" ", "-")
    n_gpus = rng.choice([0, 1, 2, 4, 4])
    gpus = tuple(
        GpuState(g, product if rng.random() < 0.9 else rng.choice(PRODUCTS), rng.choice([16000, 24000, 40000, 81920]),
                 healthy=rng.random() < 0.9, simulated=True, memory_reserved_mb=rng.choice([0, 0, 500]))
        for g in range(n_gpus)
    )
    return NodeState(
        name=f"n{i:02d}", labels=labels, online=rng.random() < 0.92, cpu_count=rng.choice([2, 4, 8, 16]),
        memory_mb=rng.choice([0, 3000, 8000, 32000]), gpus=gpus, process_slots=rng.choice([None, 0, 4]),
    )


def _model(rng: random.Random, m: int, version: str = "1") -> list[ReplicaDemand]:
    kind = rng.choices(["shared", "whole", "cpu"], [6, 2, 2])[0]
    fields: dict[str, Any] = {
        "version": version, "priority": rng.choice(["P0", "P1", "P1", "P2", "P2"]),
        "cpu": rng.choice([0.5, 1.0, 1.0, 2.0, 3.0]), "memory_mb": rng.choice([0, 100, 500, 1500]),
        "backend": rng.choice(["torch", "python", "sglang", ""]),
    }
    if kind == "shared":
        fields["gpu_memory_mb"] = rng.choice([512, 2000, 6000, 12000, 20000, 30000])
    elif kind == "whole":
        fields["gpus"] = rng.choice([1, 1, 2])
        fields["gpu_memory_mb"] = rng.choice([0, 10000, 30000])
    if rng.random() < 0.25:
        fields["node_selector"] = tuple(rng.choice(SELECTORS).items())
    if rng.random() < 0.1:
        fields["tier"] = rng.choice([TIER0, "tier-1", "tier-2"])
    return [ReplicaDemand(model=f"m{m:02d}", index=i, **fields) for i in range(rng.choice([1, 1, 2, 3]))]


def _inputs(rng: random.Random) -> tuple[ClusterInventory, list[ReplicaDemand]]:
    inventory = ClusterInventory.of(_node(rng, i) for i in range(rng.choice([0, 1, 2, 3, 4, 4, 5, 6, 6, 8])))
    demands = [d for m in range(rng.randint(1, 12)) for d in _model(rng, m)]
    return inventory, demands


def _overheads(rng: random.Random) -> HostOverheads | None:
    return rng.choice([None, HostOverheads(), HostOverheads(process_mb=579, model_mb=25)])


# ------------------------------------------------------------------------------------------- outputs


def _plan(plan: PlacementPlan, derived: bool = True) -> dict[str, Any]:
    out = {
        "placements": [[p.replica_id, p.model, p.version, p.node, list(p.gpu_indices), p.gpu_memory_mb, p.whole_gpus,
                        p.note] for _, p in sorted(plan.placements.items())],
        "unplaced": [[u.replica_id, u.model, u.version, u.reason] for _, u in sorted(plan.unplaced.items())],
        "preempted": [[*dataclasses.astuple(pre), pre.describe()] for _, pre in sorted(plan.preempted.items())],
    }
    if derived:
        out["stats"] = dataclasses.asdict(plan.stats)
        out["by_node"] = {n: [p.replica_id for p in ps] for n, ps in plan.by_node.items()}
    return out


def _digest(value: Any) -> str:
    """An event run's plan after each step, by its hash (its changes are recorded in full as the diff)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _diff(diff: PlanDiff) -> dict[str, Any]:
    return {
        "placed": [[p.replica_id, p.node, list(p.gpu_indices), p.note] for p in diff.placed],
        "moved": [[p.replica_id, p.node, list(p.gpu_indices), p.note] for p in diff.moved],
        "removed": [[p.replica_id, p.node, list(p.gpu_indices)] for p in diff.removed],
        "unplaced": [[u.replica_id, u.reason] for u in diff.unplaced],
    }


def _spec(d: ReplicaDemand) -> SimpleNamespace:
    return SimpleNamespace(name=d.model, priority_level=d.priority,
                           scheduling=SimpleNamespace(tier=d.tier, node_selector=d.selector or None))


def full_pass_case(seed: int) -> dict[str, Any]:
    """One ``place`` call: current placements from an earlier pass over part of the demands (plus stale ones),
    random exclusions and preferred nodes, preemption and host-memory overheads on or off."""
    rng = random.Random(seed)
    inventory, demands = _inputs(rng)
    names = [n.name for n in inventory.nodes] + ["gone"]
    current: dict[str, Any] = {}
    if rng.random() < 0.6:
        earlier = place(rng.sample(demands, k=len(demands) // 2), inventory, preempt=rng.random() < 0.5)
        current.update(earlier.current())
        for d in rng.sample(demands, k=min(2, len(demands))):
            current[d.replica_id] = (rng.choice(names), tuple(range(rng.choice([0, 1, 2]))))
    excluded = {d.replica_id: set(rng.sample(names, k=rng.randint(0, len(names))))
                for d in demands if rng.random() < 0.15}
    preferred = {d.replica_id: rng.choice(names) for d in demands if rng.random() < 0.15}
    preempt = rng.random() < 0.7
    plan = place(demands, inventory, current, excluded, preempt, _overheads(rng), preferred)
    return {
        "seed": seed, "plan": _plan(plan),
        "eligible": ["".join("1" if node_eligible(d, n) else "0" for n in inventory.nodes) for d in demands],
        "tier_409": sorted({d.model: validate_tier_request(_spec(d), inventory) for d in demands}.items()),
    }


def event_run_case(seed: int) -> dict[str, Any]:
    """A ``Placer``: a full pass, then a random sequence of events, each event's diff and plan (its hash) recorded."""
    rng = random.Random(10_000 + seed)
    inventory, demands = _inputs(rng)
    placer = Placer(inventory, overheads=_overheads(rng))
    steps: list[Any] = [["place_all", _plan(placer.place_all(demands), derived=False)]]
    models = sorted({d.model for d in demands})
    for _ in range(rng.randint(4, 10)):
        nodes = placer.inventory.nodes
        kind = rng.choice(["add", "add", "remove", "down", "up", "new", "gpu_failed", "gpu_recovered", "exclude"])
        if kind == "add":
            m = rng.randint(0, len(models) + 1)
            update = placer.add_model(_model(rng, m, version=rng.choice(["1", "2"])))
            models = sorted(set(models) | {f"m{m:02d}"})
            label = f"add m{m:02d}"
        elif kind == "remove" and models:
            name = rng.choice(models)
            update, label = placer.remove_model(name), f"remove {name}"
        elif kind == "down" and nodes:
            name = rng.choice(nodes).name
            update, label = placer.node_down(name), f"down {name}"
        elif kind == "up" and nodes:
            state = dataclasses.replace(rng.choice(nodes), online=True)
            if rng.random() < 0.3:
                state = dataclasses.replace(state, labels={**state.labels, "zone": rng.choice("abc")})
            update, label = placer.node_up(state), f"up {state.name}"
        elif kind == "new":
            state = _node(rng, 50 + rng.randint(0, 5))
            update, label = placer.node_up(state), f"new {state.name}"
        elif kind in ("gpu_failed", "gpu_recovered") and any(n.gpus for n in nodes):
            n = rng.choice([n for n in nodes if n.gpus])
            g = rng.choice(n.gpus).index
            if kind == "gpu_failed":
                update = placer.gpu_failed(n.name, g)
            else:
                update = placer.gpu_recovered(n.name, g)
            label = f"{kind} {n.name}/{g}"
        elif kind == "exclude" and placer.demands():
            d = rng.choice(placer.demands())
            banned = set(rng.sample([n.name for n in nodes], k=rng.randint(0, len(nodes))))
            update, label = placer.exclude(d.replica_id, banned), f"exclude {d.replica_id} {sorted(banned)}"
        else:
            continue
        steps.append([label, _digest(_plan(update.plan, derived=False)), _diff(update.diff)])
    return {"seed": seed, "steps": steps}


def record() -> dict[str, Any]:
    return {
        "full_passes": [full_pass_case(s) for s in range(FULL_PASSES)],
        "event_runs": [event_run_case(s) for s in range(EVENT_RUNS)],
    }


# ------------------------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(GOLDEN.read_text())
    return data


@pytest.mark.parametrize("seed", range(FULL_PASSES))
def test_a_full_pass_gives_the_recorded_plan_and_reasons(golden: dict[str, Any], seed: int) -> None:
    assert json.loads(json.dumps(full_pass_case(seed))) == golden["full_passes"][seed]


@pytest.mark.parametrize("seed", range(EVENT_RUNS))
def test_placer_events_give_the_recorded_plans_and_diffs(golden: dict[str, Any], seed: int) -> None:
    assert json.loads(json.dumps(event_run_case(seed))) == golden["event_runs"][seed]


def test_the_golden_covers_every_family_of_reason(golden: dict[str, Any]) -> None:
    text = json.dumps(golden)
    missing = [family for family in REASON_FAMILIES if family not in text]
    assert not missing, f"no recorded case gives these reasons; widen the generator: {missing}"
    assert '"anti-affinity relaxed' in text


if __name__ == "__main__" and "--record" in sys.argv:
    cases = record()  # one case a line, so a changed case reads as a changed line in review
    lines = [f'"{part}":[\n' + ",\n".join(json.dumps(c, separators=(",", ":"), sort_keys=True) for c in cases[part])
             + "\n]" for part in sorted(cases)]
    GOLDEN.write_text("{" + ",\n".join(lines) + "}\n")
    print(f"recorded {FULL_PASSES} full passes and {EVENT_RUNS} event runs in {GOLDEN}")
