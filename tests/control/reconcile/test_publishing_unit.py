"""``publishing``: what this term published (overlaid on the topic until read back), the epoch stamp, and the
model statuses a pass publishes only when they changed; pure functions over plain values."""

from __future__ import annotations

from types import MappingProxyType

from sie.control.placement.results import Placement, PlacementPlan
from sie.control.reconcile import publishing
from sie.control.reconcile.ports import OutRecord
from sie.control.reconcile.records import AssignedReplica, AssignmentInfo, ClusterState
from tests.control.reconcile.test_control_unit import spec_record

NOW = 1_000_000.0


def info(node: str, *rids: str, epoch: int = 3) -> AssignmentInfo:
    return AssignmentInfo(node, epoch, tuple(AssignedReplica(r, "m", "1.0.0", (0,), 1024, "{}") for r in rids))


def test_what_this_term_published_overlays_the_topic_until_the_topic_agrees():
    topic = {"a": info("a", "m-0"), "b": info("b", "m-1")}
    mine = {"a": info("a", "m-0", "m-2"), "c": info("c", "m-3")}
    view, pending = publishing.published_view(topic, mine)
    assert view == {"a": mine["a"], "b": topic["b"], "c": mine["c"]} and pending == mine
    topic["a"] = info("a", "m-0", "m-2", epoch=4)  # read back (the epoch is not compared)
    view, pending = publishing.published_view(topic, mine)
    assert view["a"] == mine["a"] and pending == {"c": mine["c"]}


def test_records_are_stamped_with_the_leaders_epoch_and_remembered():
    records = [OutRecord("assignments", "a", "Assignment", {"node": "a", "epoch": 0, "issued_at_ms": 0, "replicas": []}),
               OutRecord("assignments", "b", "Assignment", None),
               OutRecord("model-status", "m", "ModelStatus", {"name": "m"}),
               OutRecord("model-status", "gone", "ModelStatus", None),
               OutRecord("events", "m", "ControlEvent", {"kind": "placed"})]
    stamped = publishing.stamp(records, 7, NOW)
    assert stamped[0].value == {"node": "a", "epoch": 7, "issued_at_ms": int(NOW * 1000), "replicas": []}
    assert stamped[2].value == {"name": "m", "epoch": 7}
    assert [stamped[i] for i in (1, 3, 4)] == [records[i] for i in (1, 3, 4)]
    assert records[0].value["epoch"] == 0  # the pass's own records are not changed
    status = object()
    mine, statuses = publishing.remembered(records, {"m": status}, 7, {"b": info("b")}, {"gone": object()})
    assert mine == {"b": info("b"), "a": AssignmentInfo("a", 7, ())} and statuses == {"m": status}


def test_a_status_is_published_only_when_it_changed_and_a_gone_model_gets_a_tombstone():
    state = ClusterState()
    state.apply_spec("m", spec_record("m"))
    snap = state.snapshot()
    plan = PlacementPlan(MappingProxyType({"m-0": Placement("m-0", "m", "1.0.0", "a", (0,), 4096)}),
                         MappingProxyType({}), snap.inventory(NOW, 6.0))
    statuses, records = publishing.model_statuses(snap, plan, NOW, 6.0, 3, {}, {}, {}, {})
    assert [(r.key, r.value["desired_replicas"]) for r in records] == [("m", 1)]
    again, records = publishing.model_statuses(snap, plan, NOW + 1, 6.0, 3, {}, {}, {}, {**statuses, "old": statuses["m"]})
    assert again["m"].same_as(statuses["m"]) and [(r.key, r.value) for r in records] == [("old", None)]
