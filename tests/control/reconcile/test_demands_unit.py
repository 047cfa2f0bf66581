"""``demands``: the replicas wanted, from the specs, the counts and a rollout's replica plan; what is derived
from one spec object is made once per object (its demands, its template, a rollout document decoded)."""

from __future__ import annotations

import json

from sie.control.placement.engine import place
from sie.control.placement.host_memory import HostOverheads
from sie.control.reconcile.demands import SpecCache, companions, demands, rollout_demands
from sie.control.reconcile.ports import NoRollouts, RolloutReplicas
from sie.control.reconcile.records import AssignedReplica, AssignmentInfo, ClusterState
from sie.schemas.replica_template import template_of
from sie.schemas.spec import ModelService
from tests.control.reconcile.test_control_unit import FakeClock, gpu, heartbeat, register, spec_record

OLD, NEW = "1.0.0", "1.1.0"


def test_demands_are_made_once_per_spec_object_and_count():
    state = ClusterState()
    state.apply_spec("a", spec_record("a", replicas=2))
    state.apply_spec("b", spec_record("b"))
    cache = SpecCache()
    snap = state.snapshot()
    first = demands(snap, {"a": 3}, cache)
    assert [d.replica_id for d in first] == ["a-0", "a-1", "a-2", "b-0"]  # b: None -> its sla.min_replicas
    assert demands(snap, {"a": 3}, cache)[0] is first[0]  # the same spec object and count: reused
    assert [d.replica_id for d in demands(snap, {"a": 1}, cache)] == ["a-0", "b-0"]  # a new count: made again
    state.apply_spec("b", spec_record("b", replicas=2))  # a new record: a new object
    assert [d.replica_id for d in demands(state.snapshot(), None, cache)] == ["a-0", "a-1", "b-0", "b-1"]


def test_a_template_is_made_once_per_spec_object_and_forgotten_with_its_model():
    state = ClusterState()
    state.apply_spec("a", spec_record("a"))
    spec = state.snapshot().specs["a"]
    cache = SpecCache()
    t = cache.template("a", spec)
    assert t == template_of(spec.to_document()) and cache.template("a", spec) is t
    cache.model_demands("a", spec, None)
    cache.keep({"b"})
    assert cache.templates == {} and cache.demands == {}


def test_companions_are_the_other_versions_templates():
    docs = {("m", OLD): template_of({"version": OLD}), ("m", NEW): template_of({"version": NEW}),
            ("n", OLD): template_of({"version": "x"})}
    assert companions(docs, "m", OLD) == (docs[("m", NEW)].json,)
    assert companions(docs, "m", NEW) == (docs[("m", OLD)].json,)
    assert companions({}, "m", OLD) == ()


class Rolling:
    """A RolloutView with one rollout of ``m`` (its two documents are the rollout entry's objects)."""

    def __init__(self, phase: str, stable: dict, canary: dict) -> None:
        self.phase, self.stable, self.canary = phase, stable, canary

    def in_progress(self, model: str) -> str | None:
        return "rollout" if model == "m" else None

    def replicas_of(self, model: str) -> RolloutReplicas | None:
        return RolloutReplicas(self.phase, OLD, NEW, self.stable, self.canary) if model == "m" else None


def rolling_world():
    clock, state = FakeClock(), ClusterState()
    record = spec_record("m", 4096, replicas=1)
    state.apply_spec("m", record)
    register(state, "node-a", [gpu(0)])
    heartbeat(state, "node-a", clock(), [gpu(0)])
    stable = json.loads(record["spec_json"])
    return clock, state, stable, {**stable, "version": NEW}


def plan_of(state, clock, rollouts, cache, published=None):
    """``rollout_demands`` over the state, with ``published`` (node -> AssignmentInfo) as the last assignments."""
    snap = state.snapshot()
    inventory = snap.inventory(clock(), 6.0)
    published = published or {}
    current = {a.replica_id: (node, a.gpu_indices) for node, info in published.items() for a in info.replicas}
    return rollout_demands(snap, demands(snap, None, cache), inventory, current, {}, rollouts, cache, {}, {},
                           published, {}, HostOverheads.defaults())


def test_without_a_rollout_or_rolling_back_the_demands_are_unchanged():
    clock, state, stable, canary = rolling_world()
    cache = SpecCache()
    for rollouts in (NoRollouts(), Rolling("RollingBack", stable, canary)):
        got = plan_of(state, clock, rollouts, cache)
        assert [d.replica_id for d in got.demands] == ["m-0"] and got.plans == {} and got.templates == {}


def test_a_surge_with_room_places_the_canary_replica_from_its_own_spec():
    clock, state, stable, canary = rolling_world()
    cache = SpecCache()
    snap = state.snapshot()
    published = {"node-a": AssignmentInfo("node-a", 3, (AssignedReplica("m-0", "m", OLD, (0,), 4096, "{}"),))}
    rollouts = Rolling("Surging", stable, canary)
    got = plan_of(state, clock, rollouts, cache, published)
    assert got.plans["m"].mode == "surge" and got.plans["m"].versions == (OLD, NEW)
    assert [(d.replica_id, d.version) for d in got.demands] == [("m-0", OLD), ("m-1", NEW)]
    assert got.templates == {("m", OLD): template_of(stable), ("m", NEW): template_of(canary)}
    # what the trial placement saw: it fits next to the stable replica
    trial = place(got.demands, snap.inventory(clock(), 6.0), {"m-0": ("node-a", (0,))})
    assert "m-1" in trial.placements
    # no room for the trial replica (x takes 12 GiB of the one 16 GiB GPU): the stable replica stays, and why
    state.apply_spec("x", spec_record("x", 12288))
    got = plan_of(state, clock, rollouts, cache, published)
    assert got.plans["m"].mode == "wait" and [(d.replica_id, d.version) for d in got.demands] == [
        ("x-0", OLD), ("m-0", OLD)]
    assert got.plans["m"].reason.startswith("no room for a surge replica (unschedulable: needs 4096 MiB GPU memory")


def test_a_rollout_document_is_decoded_once_per_document_object(monkeypatch):
    """The rollout entry keeps its two documents for the rollout's life: each is decoded into a ModelService
    (and its template made) once, not on every pass; a new rollout's documents are decoded afresh."""
    clock, state, stable, canary = rolling_world()
    real = ModelService.from_document
    decoded: list[str] = []

    def counting(cls, doc, *args, **kwargs):
        decoded.append(doc["version"] if "version" in doc else doc["spec"]["model"]["version"])
        return real(doc, *args, **kwargs)

    monkeypatch.setattr(ModelService, "from_document", classmethod(counting))
    cache = SpecCache()
    rollouts = Rolling("Surging", stable, canary)
    first = plan_of(state, clock, rollouts, cache)
    for _ in range(3):
        again = plan_of(state, clock, rollouts, cache)
        assert again.demands == first.demands and again.templates == first.templates
    assert len(decoded) == 2  # stable and canary, once each
    rollouts.canary = {**canary}  # a new rollout entry: new document objects
    plan_of(state, clock, rollouts, cache)
    assert len(decoded) == 3
    assert set(cache.rollout) == {("m", OLD), ("m", NEW)}
    plan_of(state, clock, NoRollouts(), cache)  # the rollout ended: its documents are let go
    assert cache.rollout == {}
