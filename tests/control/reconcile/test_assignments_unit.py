"""``assignments``: placement reused when its inputs are equal, and an Assignment record only for a node whose
replica set changed; pure functions over plain plans."""

from __future__ import annotations

import json
from types import MappingProxyType

from sie.control.placement.demand import demands_from_spec
from sie.control.placement.host_memory import HostOverheads
from sie.control.placement.results import Placement, PlacementPlan
from sie.control.reconcile import assignments
from sie.control.reconcile.demands import SpecCache
from sie.control.reconcile.director import Extra
from sie.control.reconcile.records import AssignedReplica, AssignmentInfo, ClusterState
from sie.schemas.replica_template import template_of
from tests.control.reconcile.test_control_unit import gpu, heartbeat, register, spec_record

NOW = 1_000_000.0


def test_current_is_each_replicas_first_node_by_name():
    published = {"b": AssignmentInfo("b", 1, (AssignedReplica("m-0", "m", "1", (1,), 0, "{}"),)),
                 "a": AssignmentInfo("a", 1, (AssignedReplica("m-0", "m", "1", (0,), 0, "{}"),))}
    assert assignments.current_of(published) == {"m-0": ("a", (0,))}


def test_the_directors_node_comes_before_a_rebalance_target():
    state = ClusterState()
    state.apply_spec("m", spec_record("m", replicas=3))
    wanted = demands_from_spec(state.snapshot().specs["m"], 3)
    floors = {"m": Extra(3, "node-c", "m-0", NOW)}  # the added replica is the third: m-2
    assert assignments.preferred(wanted, floors, {"m-2": "node-a", "m-1": "node-b"}) == {"m-2": "node-c",
                                                                                         "m-1": "node-b"}


def test_a_placement_with_equal_inputs_is_reused_over_this_passs_inventory():
    state = ClusterState()
    state.apply_spec("m", spec_record("m"))
    register(state, "a", [gpu(0)])
    heartbeat(state, "a", NOW, [gpu(0)])
    snap = state.snapshot()
    wanted = SpecCache().model_demands("m", snap.specs["m"], None)
    memo = assignments.PlacementMemo()
    inv = snap.inventory(NOW, 6.0)
    first = memo.place(wanted, inv, {}, {}, {}, False, HostOverheads.defaults())
    assert "m-0" in first.placements
    later = snap.inventory(NOW + 1, 6.0)
    again = memo.place(wanted, later, {}, {}, {}, False, HostOverheads.defaults())
    assert again.placements is first.placements and again.inventory is later
    other = memo.place(wanted, later, {}, {"m-0": frozenset({"a"})}, {}, False, HostOverheads.defaults())
    assert other.placements is not first.placements and "m-0" in other.unplaced


def test_an_assignment_only_for_a_node_whose_replicas_changed():
    state = ClusterState()
    state.apply_spec("m", spec_record("m", replicas=2))
    snap = state.snapshot()
    templates = assignments.Templates(snap, SpecCache())
    t = templates["m"]
    assert t == template_of(snap.specs["m"].to_document())
    plan = PlacementPlan(MappingProxyType({"m-0": Placement("m-0", "m", "1.0.0", "a", (0,), 4096),
                                           "m-1": Placement("m-1", "m", "1.0.0", "b", (0,), 4096)}),
                         MappingProxyType({}), snap.inventory(NOW, 6.0))
    same = AssignmentInfo("a", 2, (AssignedReplica("m-0", "m", "1.0.0", (0,), 4096, t.json, (), t.hash),))
    emptied = AssignmentInfo("c", 2, (AssignedReplica("x-0", "x", "1.0.0", (0,), 4096, "{}"),))
    idle = AssignmentInfo("d", 2, ())
    records = assignments.assignment_records(plan, {"a": same, "c": emptied, "d": idle}, templates, {})
    assert [(r.key, [a["replica_id"] for a in r.value["replicas"]]) for r in records] == [("b", ["m-1"]), ("c", [])]
    assert records[0].value["epoch"] == 0 and records[0].value["issued_at_ms"] == 0  # stamped at publish time
    # a rollout version's template wins, and the other version rides along as the companion
    canary = template_of({**json.loads(t.json), "version": "1.1.0"})
    versions = {("m", "1.0.0"): t, ("m", "1.1.0"): canary}
    records = assignments.assignment_records(plan, {}, {}, versions)
    assert records[0].value["replicas"][0]["companions"] == [canary.json]
    # a model without a spec any more: an empty template
    records = assignments.assignment_records(plan, {}, {}, {})
    assert records[0].value["replicas"][0]["spec_json"] == assignments.NO_TEMPLATE.json
