"""The rollout's replica plan as a pure function: surge when there is room, replace one at a time otherwise,
never below demand, drain the stable replicas only at weight 0 and one at a time."""

from __future__ import annotations

import pytest

from sie.control.placement.rollout_capacity import CapacityInputs, plan_capacity

OLD, NEW = "1.0.0", "1.1.0"


def inputs(phase="Surging", count=3, demand=2, assigned=None, ready=None, fits=True):
    assigned = {i: OLD for i in range(count)} if assigned is None else assigned
    ready = frozenset(assigned) if ready is None else frozenset(ready)
    return CapacityInputs(phase, OLD, NEW, count, demand, assigned, ready, fits)


def test_room_on_the_gpus_surges_one_new_version_replica_and_keeps_every_stable_one():
    plan = plan_capacity(inputs(fits=True))
    assert plan.versions == (OLD, OLD, OLD, NEW) and plan.mode == "surge" and plan.new_ready == 0
    # once it is assigned and READY, the gate opens; the plan keeps it even if the room is gone now
    plan = plan_capacity(inputs(assigned={0: OLD, 1: OLD, 2: OLD, 3: NEW}, fits=False))
    assert plan.versions == (OLD, OLD, OLD, NEW) and plan.mode == "surge" and plan.new_ready == 1


def test_no_room_replaces_the_highest_replica_only_while_the_rest_cover_demand():
    plan = plan_capacity(inputs(count=3, demand=2, fits=False))
    assert plan.versions == (OLD, OLD, NEW) and plan.mode == "replace"
    # sticky: the replaced replica stays on the new version; READY opens the gate
    plan = plan_capacity(inputs(assigned={0: OLD, 1: OLD, 2: NEW}, fits=False))
    assert plan.versions == (OLD, OLD, NEW) and plan.new_ready == 1


@pytest.mark.parametrize("ready", [{0, 1, 2}, {0, 1}])
def test_no_room_and_every_replica_needed_waits_and_says_why(ready):
    plan = plan_capacity(inputs(count=3, demand=3 if len(ready) == 3 else 2, ready=ready, fits=False))
    assert plan.mode == "wait" and plan.versions == (OLD, OLD, OLD) and plan.new_ready == 0
    assert "< demand" in plan.reason


def test_a_new_version_replica_that_is_assigned_but_not_ready_does_not_open_the_gate():
    plan = plan_capacity(inputs(assigned={0: OLD, 1: OLD, 2: OLD, 3: NEW}, ready={0, 1, 2}))
    assert plan.new_ready == 0


def test_draining_replaces_one_stable_replica_at_a_time_and_the_surge_replica_goes_last():
    surge = {0: OLD, 1: OLD, 2: OLD, 3: NEW}
    plan = plan_capacity(inputs("Draining", assigned=surge, demand=3))
    assert plan.versions == (OLD, OLD, NEW, NEW) and plan.mode == "drain" and not plan.drained
    # replica 2 restarting on the new version: nothing else moves until it is READY
    step = {**surge, 2: NEW}
    plan = plan_capacity(inputs("Draining", assigned=step, ready={0, 1, 3}, demand=3))
    assert plan.versions == (OLD, OLD, NEW, NEW) and "waiting for replica 2" in plan.reason
    plan = plan_capacity(inputs("Draining", assigned=step, demand=3))
    assert plan.versions == (OLD, NEW, NEW, NEW)
    done = {0: NEW, 1: NEW, 2: NEW, 3: NEW}
    plan = plan_capacity(inputs("Draining", assigned=done, demand=3))
    assert plan.drained and plan.versions == (NEW, NEW, NEW), plan  # surge replica stops at the end


def test_draining_never_takes_ready_replicas_below_demand():
    plan = plan_capacity(inputs("Draining", count=2, demand=2, assigned={0: OLD, 1: OLD}))
    assert plan.mode == "wait" and not plan.drained and "demand 2" in plan.reason
    plan = plan_capacity(inputs("Draining", count=2, demand=1, assigned={0: OLD, 1: OLD}))
    assert plan.versions == (OLD, NEW)


def test_every_plan_keeps_at_least_demand_ready_on_a_simulated_rollout():
    """A whole rollout with a fake agent that makes each assigned replica READY one pass later: at no pass
    do fewer than ``demand`` replicas stay READY, and the drain ends with every replica on the new version."""
    for fits in (True, False):
        count, demand = 3, 2
        assigned, ready = {i: OLD for i in range(count)}, set(range(count))
        phases = ["Surging"] * 3 + ["Draining"] * 12
        drained = False
        for phase in phases:
            plan = plan_capacity(CapacityInputs(phase, OLD, NEW, count, demand, dict(assigned), frozenset(ready),
                                                fits))
            if plan.drained:
                drained = True
                break
            changed = {i for i, v in enumerate(plan.versions) if assigned.get(i) != v}
            ready -= changed  # a replica whose version changes restarts: not READY until its readiness inference
            assert len(ready) >= demand, (phase, plan)
            assigned = dict(enumerate(plan.versions))
            ready |= set(assigned) - changed  # the agent reports it READY by the next pass
            ready |= changed if phase == "Draining" or plan.mode in ("surge", "replace") else set()
        assert drained, (fits, assigned)


def test_a_model_whose_replicas_run_outside_agents_has_no_plan():
    plan = plan_capacity(inputs(assigned={}, ready=set()))
    assert plan.mode == "unmanaged" and plan.versions == () and plan.drained


# --- wired: the controller places the plan, the driver's readiness gate reads it ----------------------------

def _controller_world(gpu_mb: int, replicas: int = 1):
    import json

    from sie.control.reconcile.config import ControlConfig
    from sie.control.reconcile.controller import Controller
    from sie.control.reconcile.ports import RolloutReplicas, StaticLeadership
    from sie.control.reconcile.records import ClusterState
    from sie.schemas.spec import ModelService
    from tests.control.reconcile.test_control_unit import (
        FakeClock,
        FakePublisher,
        gpu,
        heartbeat,
        register,
        spec_record,
    )

    clock, state, pub = FakeClock(), ClusterState(), FakePublisher()
    record = spec_record("m", 4096, replicas=replicas)
    state.apply_spec("m", record)
    stable = json.loads(record["spec_json"])
    canary = {**stable, "version": NEW}
    assert ModelService.from_document(canary).version == NEW

    class View:
        phase = "Surging"

        def in_progress(self, model):
            return "rollout"

        def replicas_of(self, model):
            return RolloutReplicas(self.phase, OLD, NEW, stable, canary) if model == "m" else None

    view = View()
    ctl = Controller(state, pub, StaticLeadership(True, 3), ControlConfig(node_timeout_s=6.0), rollouts=view)
    register(state, "node-a", [gpu(0, total=gpu_mb)])
    heartbeat(state, "node-a", clock(), [gpu(0, total=gpu_mb)])
    return clock, state, pub, ctl, view, heartbeat, gpu


def _published(pub):
    """Replica id -> its assignment, from each node's newest Assignment (what the agents run now)."""
    latest = {r.key: r.value for r in pub.all("assignments")}
    return {a["replica_id"]: a for value in latest.values() for a in value["replicas"]}


def test_the_controller_surges_a_new_version_replica_with_its_own_spec_and_the_gate_waits_for_ready():
    import json

    clock, state, pub, ctl, _view, heartbeat, gpu = _controller_world(gpu_mb=16384)
    ctl.reconcile(clock())  # nothing assigned yet: no plan (the model's first replica is placed as ever)
    assert ctl.capacity["m"].mode == "unmanaged" and set(_published(pub)) == {"m-0"}
    ctl.reconcile(clock())
    placed = _published(pub)
    assert {rid: a["version"] for rid, a in placed.items()} == {"m-0": OLD, "m-1": NEW}
    assert json.loads(placed["m-1"]["spec_json"])["version"] == NEW
    assert ctl.capacity["m"].mode == "surge" and ctl.capacity["m"].new_ready == 0
    events = [r.value["detail"] for r in pub.all("events") if r.value["kind"] == "rollout_capacity"]
    assert events[0].startswith("unmanaged") and "surge replica 1" in events[1] and len(events) == 2
    # the agent reports the new version's replica READY (after its readiness inference): the gate opens
    clock.advance(1)
    heartbeat(state, "node-a", clock(), [gpu(0, total=16384)],
              [{"replica_id": "m-0", "model": "m", "version": OLD, "state": "READY"},
               {"replica_id": "m-1", "model": "m", "version": NEW, "state": "READY"}])
    ctl.reconcile(clock())
    assert ctl.capacity["m"].new_ready == 1


def test_no_room_and_one_replica_needed_waits_and_the_surge_times_out_with_that_reason():
    from sie.control.rollout.driver import RolloutDriver
    from sie.control.rollout.machine import Phase
    from tests.control.rollout.test_rollout_driver_unit import Clock, Windows, specs

    clock, state, pub, ctl, _view, heartbeat, gpu = _controller_world(gpu_mb=4096)
    clock.advance(1)
    heartbeat(state, "node-a", clock(), [gpu(0, total=4096)],
              [{"replica_id": "m-0", "model": "m", "version": OLD, "state": "READY"}])
    ctl.reconcile(clock())
    ctl.reconcile(clock())
    plan = ctl.capacity["m"]
    assert plan.mode == "wait" and plan.versions == (OLD,) and "< demand 1" in plan.reason
    assert {a["version"] for a in _published(pub).values()} == {OLD}  # the stable replica is untouched

    dclock = Clock()
    driver = RolloutDriver(Windows(), clock=dclock, capacity=ctl.capacity.get)
    entry, _ = driver.begin(*specs({"surgeTimeoutSeconds": 5}))
    driver.commit(entry)
    for _ in range(14):
        dclock.t += 0.5
        for e, _records in driver.tick():
            driver.commit(e)
    rollout = driver.get("m").rollout
    assert rollout.phase is Phase.FAILED and rollout.weight_bp == 0
    assert "not ready within surgeTimeoutSeconds 5" in rollout.reason and "< demand 1" in rollout.reason


def test_every_replica_is_assigned_the_other_version_as_its_companion_and_none_restarts_for_it():
    """The rollout's other version travels in the assignment (``companions``), outside the replica's identity:
    the stable replica keeps its spec (its agent restarts nothing) and is asked to serve the canary too; the
    surge replica serves the stable version too; once the rollout ends the companions are gone."""
    import json

    from sie.workers.replica import DesiredReplica

    clock, state, pub, ctl, view, heartbeat, gpu = _controller_world(gpu_mb=16384)
    view.phase = "RollingBack"  # no plan yet: the stable replica is placed as ever
    ctl.reconcile(clock())
    before = _published(pub)["m-0"]
    assert before["companions"] == []
    view.phase = "Surging"
    ctl.reconcile(clock())
    placed = _published(pub)
    assert [json.loads(c)["version"] for c in placed["m-0"]["companions"]] == [NEW]
    assert [json.loads(c)["version"] for c in placed["m-1"]["companions"]] == [OLD]
    assert placed["m-0"]["spec_json"] == before["spec_json"]

    def identity(a):
        return DesiredReplica(a["replica_id"], a["model"], a["version"], a["spec_json"], tuple(a["gpu_indices"]),
                              a["gpu_memory_mb"], companions=tuple(a["companions"])).target_hash

    assert identity(placed["m-0"]) == identity(before)  # same worker: the agent only prepares the companion
    clock.advance(1)
    heartbeat(state, "node-a", clock(), [gpu(0, total=16384)],
              [{"replica_id": "m-0", "model": "m", "version": OLD, "state": "READY",
                "versions": [{"version": NEW, "state": "loading", "detail": None}]},
               {"replica_id": "m-1", "model": "m", "version": NEW, "state": "READY",
                "versions": [{"version": OLD, "state": "ready", "detail": None}]}])
    report = ctl.reconcile(clock())
    plan = ctl.capacity["m"]
    assert plan.new_ready == 1 and not plan.companions_ready and plan.companions_waiting == f"replica 0 loading {NEW}"
    # what `sie get replicas` / `describe model` show of it
    views = {r.replica_id: r.other_version for r in report.statuses["m"].replicas}
    assert views == {"m-0": f"{NEW} loading", "m-1": f"{OLD} ready"}
    view.phase = "RollingBack"
    ctl.reconcile(clock())
    assert _published(pub)["m-0"]["companions"] == [] and set(_published(pub)) == {"m-0"}


def test_rolling_back_places_the_stable_spec_again_so_the_new_version_replica_stops():
    clock, state, pub, ctl, view, heartbeat, gpu = _controller_world(gpu_mb=16384)
    ctl.reconcile(clock())
    ctl.reconcile(clock())
    assert set(_published(pub)) == {"m-0", "m-1"}
    view.phase = "RollingBack"
    ctl.reconcile(clock())
    assert {rid: a["version"] for rid, a in _published(pub).items()} == {"m-0": OLD} and "m" not in ctl.capacity


def test_the_driver_leaves_surging_only_once_a_new_version_replica_is_ready():
    from sie.control.placement.rollout_capacity import CapacityPlan
    from sie.control.rollout.driver import RolloutDriver
    from sie.control.rollout.machine import Phase
    from tests.control.rollout.test_rollout_driver_unit import Clock, Windows, specs

    plans: dict[str, CapacityPlan] = {}
    clock = Clock()
    driver = RolloutDriver(Windows(), clock=clock, capacity=plans.get)
    entry, _ = driver.begin(*specs({"surgeTimeoutSeconds": 60}))
    driver.commit(entry)

    def step():
        clock.t += 1
        for e, _records in driver.tick():
            driver.commit(e)
        return driver.get("m").rollout

    assert step().phase is Phase.SURGING
    assert step().phase is Phase.SURGING  # not planned yet: holds
    plans["m"] = CapacityPlan((OLD, NEW), "surge", "surge replica 1 started", new_ready=0)
    assert step().phase is Phase.SURGING
    plans["m"] = CapacityPlan((OLD, NEW), "surge", "surge replica 1 kept", new_ready=1)
    r = step()
    assert r.phase is Phase.CANARY and "READY after their readiness inference" in r.events[-1].reason


def test_the_rollout_service_gives_the_controller_phase_and_both_specs_only_while_leading_and_unfinished():
    from sie.control.rollout.service import Rollouts
    from sie.kernel.settings import Settings
    from tests.control.rollout.test_rollout_driver_unit import specs

    class Lead:
        is_leader = True
        epoch = 1

    class Pub:
        def publish(self, records):
            pass

    lead = Lead()
    rollouts = Rollouts(Settings(), lead, Pub(), reader=lambda _s: [], windows=object())
    rollouts.tick()
    assert rollouts.replicas_of("m") is None
    old, new = specs()
    rollouts.begin(old, new)
    ro = rollouts.replicas_of("m")
    assert (ro.phase, ro.stable_version, ro.canary_version) == ("Pending", OLD, NEW)
    assert ro.canary_spec["version"] == NEW and ro.stable_spec["version"] == OLD
    rollouts.act("m", "abort", "test")
    assert rollouts.replicas_of("m").phase == "RollingBack"  # still unfinished: the controller places no plan
    lead.is_leader = False
    assert rollouts.replicas_of("m") is None  # a standby plans nothing


def test_draining_through_the_controller_replaces_one_replica_per_ready_report_then_stops_the_surge():
    import json

    clock, state, pub, ctl, view, heartbeat, gpu = _controller_world(gpu_mb=16384, replicas=2)

    def beat():
        clock.advance(1)
        reps = [{"replica_id": rid, "model": "m", "version": a["version"], "state": "READY"}
                for rid, a in _published(pub).items()]
        heartbeat(state, "node-a", clock(), [gpu(0, total=16384)], reps)
        ctl.reconcile(clock())
        return {rid: a["version"] for rid, a in _published(pub).items()}

    ctl.reconcile(clock())
    assert beat() == {"m-0": OLD, "m-1": OLD, "m-2": NEW}  # the surge replica
    # promoted: the specs topic now names the new version; the stable replicas go one at a time
    stable = state.snapshot().specs["m"].to_document()
    state.apply_spec("m", {"name": "m", "version": NEW, "spec_json": json.dumps({**stable, "version": NEW}),
                           "applied_at_ms": 5})
    view.phase = "Draining"
    steps = [beat()]
    assert steps[0] == {"m-0": OLD, "m-1": NEW, "m-2": NEW}
    assert json.loads(_published(pub)["m-0"]["spec_json"])["version"] == OLD  # the old replica keeps its own spec
    steps += [beat() for _ in range(3)]
    assert steps[1] == {"m-0": NEW, "m-1": NEW, "m-2": NEW}
    assert steps[2] == {"m-0": NEW, "m-1": NEW} and ctl.capacity["m"].drained


def test_what_a_new_version_replica_reports_while_not_ready_is_named_but_is_not_part_of_the_reason():
    base = inputs(assigned={0: OLD, 1: OLD, 2: OLD, 3: NEW}, ready={0, 1, 2})
    quiet = plan_capacity(base)
    noisy = plan_capacity(CapacityInputs(*[getattr(base, f) for f in (
        "phase", "stable_version", "canary_version", "count", "demand", "assigned", "ready", "surge_fits")],
        problems={3: "CRASHED: ImportError: models.fraud.rules has no score_v2 (restart 2)"}))
    assert noisy.reason == quiet.reason and quiet.detail == ""  # the event text does not change per restart
    assert noisy.detail == "replica 3 (1.1.0): CRASHED: ImportError: models.fraud.rules has no score_v2 (restart 2)"
    assert noisy.waiting.endswith(noisy.detail)


# --- both versions on every replica: the companions each READY replica reports -----------------------------

def with_companions(companions, assigned=None, ready=None):
    assigned = {0: OLD, 1: OLD, 2: OLD, 3: NEW} if assigned is None else assigned
    ready = frozenset(assigned) if ready is None else frozenset(ready)
    return CapacityInputs("Surging", OLD, NEW, 3, 2, assigned, ready, True, companions=companions)


def test_surging_ends_only_when_every_ready_replica_serves_the_other_version_too():
    loading = {0: ("ready", ""), 1: ("loading", ""), 2: ("ready", ""), 3: ("ready", "")}
    plan = plan_capacity(with_companions(loading))
    assert plan.new_ready == 1 and not plan.companions_ready and not plan.serving_both
    assert plan.companions_waiting == f"replica 1 loading {NEW}"
    plan = plan_capacity(with_companions({i: ("ready", "") for i in range(4)}))
    assert plan.companions_ready and plan.serving_both and not plan.companion_failed


def test_an_unreported_companion_is_waited_for_and_a_failed_one_is_named():
    plan = plan_capacity(with_companions({0: ("ready", ""), 1: ("ready", ""), 2: ("ready", "")}))
    assert not plan.companions_ready and f"replica 3 waiting {OLD}" in plan.companions_waiting
    failed = {0: ("ready", ""), 1: ("failed", "spec.backend.callable: no attribute 'no_such_scorer'"),
              2: ("ready", ""), 3: ("ready", "")}
    plan = plan_capacity(with_companions(failed))
    assert plan.companion_failed == f"version {NEW} FAILED on replica 1: spec.backend.callable: no attribute " \
                                    "'no_such_scorer'"


def test_replicas_that_are_not_ready_are_not_asked_for_their_companion():
    plan = plan_capacity(with_companions({i: ("ready", "") for i in range(3)}, ready={0, 1, 2}))
    assert plan.companions_ready and plan.new_ready == 0 and not plan.serving_both
