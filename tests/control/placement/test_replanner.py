"""``Replanner``: a full pass, then passes that place only the models whose demands changed on the kept allocator.
Every other model keeps its placement, the changed ones are placed by the same rules, and a full ``place`` given
the result as ``current`` keeps all of it (what the periodic check of the reconcile pass compares)."""

from __future__ import annotations

from sie.control.placement import ClusterInventory, place
from sie.control.placement.demand import demands_from_spec
from sie.control.placement.engine import Replanner
from tests.control.placement.test_pack_or_spread import _node, _spec

CLUSTER = ClusterInventory.of([_node(f"n{i}", gpus=2, cpu=16) for i in range(4)])


def _demands(specs, counts):
    return {s.name: demands_from_spec(s, counts.get(s.name, 2)) for s in specs}


def _where(plan):
    return {rid: (p.node, p.gpu_indices) for rid, p in plan.placements.items()}


def test_replacing_some_models_keeps_the_others_and_a_full_pass_keeps_the_result():
    specs = [_spec(f"m{i}", gpu_memory_mb=8192 * (1 + i % 3)) for i in range(8)] + [_spec(f"c{i}") for i in range(6)]
    counts = {s.name: 2 for s in specs}
    wanted = _demands(specs, counts)
    replanner = Replanner()
    first = replanner.place_all([d for ds in wanted.values() for d in ds], CLUSTER, preempt=True)
    assert not first.unplaced
    # m1 grows to 3 replicas with more memory, c2 goes away, a new model arrives
    changed = {"m1": demands_from_spec(_spec("m1", gpu_memory_mb=30000), 3), "c2": [],
               "new": demands_from_spec(_spec("new", gpu_memory_mb=4096), 2)}
    after = replanner.replace(changed, CLUSTER)
    wanted.update(changed)
    full = place([d for ds in wanted.values() for d in ds], CLUSTER, after.current(), preempt=True)
    assert _where(after) == _where(full) and set(after.unplaced) == set(full.unplaced) == set()
    # where memory is short, the changed model moves (m1 grew), never a model nothing changed for
    untouched = {rid for rid, p in first.placements.items() if p.model not in changed}
    assert all(after.placements[rid].slot == first.placements[rid].slot for rid in untouched)
    assert {rid for rid in after.placements if rid.startswith("c2-")} == set()
    assert {rid for rid in after.placements if rid.startswith(("m1-", "new-"))} == {"m1-0", "m1-1", "m1-2", "new-0", "new-1"}


def test_a_model_replaced_with_the_same_demands_keeps_its_slots():
    specs = [_spec(f"m{i}", gpu_memory_mb=4096) for i in range(5)]
    wanted = _demands(specs, {})
    replanner = Replanner()
    first = replanner.place_all([d for ds in wanted.values() for d in ds], CLUSTER)
    after = replanner.replace({"m3": wanted["m3"]}, CLUSTER)
    assert _where(after) == _where(first)


def test_what_no_node_fits_stays_unplaced_with_its_reason_and_is_placed_when_room_frees():
    replanner = Replanner()
    first = replanner.place_all(demands_from_spec(_spec("big", gpu_memory_mb=80000), 8), CLUSTER)
    assert len(first.placements) == 8 and not first.unplaced
    more = replanner.replace({"more": demands_from_spec(_spec("more", gpu_memory_mb=40000), 1)}, CLUSTER)
    assert set(more.unplaced) == {"more-0"} and more.unplaced["more-0"].reason.startswith("unschedulable")
    freed = replanner.replace({"big": demands_from_spec(_spec("big", gpu_memory_mb=80000), 7)}, CLUSTER)
    assert "more-0" in freed.placements and not freed.unplaced
