"""A standby that leads continues from what its passes kept (``incremental``, "A standby that leads"): its
first pass as leader plans only what changed and what the old leader had not published, and leaves the topics
exactly as a first pass planned from scratch would.

Each scenario is a sequence of what happens to a cluster (specs applied, re-versioned or deleted, a rollout,
heartbeats, passes of the leader and of the standby, or of the standby alone while the leader is frozen), then
the leader is SIGKILLed and the standby elected.  It runs twice from the start, deterministically (a fake clock,
the in-memory topics of ``test_takeover_unit``): once as ``sie control`` runs, once with the new leader's first
pass forced to plan everything.  The assignments and model statuses the topics hold afterwards must be equal.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sie.control.reconcile.feeder import decode_value
from sie.control.reconcile.ports import OutRecord
from tests.control.reconcile.test_control_unit import spec_record
from tests.control.test_takeover_unit import World

MODELS = ("x0", "x1", "x2", "x3")

Op = tuple[Any, ...]

ops = st.lists(st.one_of(
    st.tuples(st.just("apply"), st.sampled_from(MODELS), st.integers(0, 2), st.integers(1, 2)),
    st.tuples(st.just("delete"), st.sampled_from(MODELS)),
    st.tuples(st.just("turn")),
    st.tuples(st.just("standby")),
    st.tuples(st.just("beat")),
    st.tuples(st.just("rollout")),
), min_size=1, max_size=12)


def topics(world: World) -> dict[str, Any]:
    """What the topics hold for agents and operators: each node's replicas, each model's status (without when and
    by whom they were published)."""
    assignments = {node: [{k: v for k, v in a.items()} for a in value["replicas"]]
                   for node, value in world.bus.assignments().items()}
    statuses = {}
    for key, raw in world.bus.latest("model-status").items():
        if raw is not None:
            value = decode_value(raw)
            statuses[key] = {k: v for k, v in value.items() if k not in ("epoch", "updated_at_ms")}
    return {"assignments": assignments, "statuses": statuses}


def run(scenario: list[Op], continues: bool) -> tuple[dict[str, Any], Any, int]:
    """The scenario, the failover and the new leader's first pass: (the topics after it, its report, how many
    records it published)."""
    world = World()
    world.turn(3)
    world.converge()
    rolled = False
    for op in scenario:
        if op[0] == "apply":
            _, name, version, replicas = op
            record = spec_record(name, 2048, replicas=replicas)
            doc = json.loads(record["spec_json"])
            doc["version"] = f"1.0.{version}"
            world.bus.publish([OutRecord("specs", name, "ModelSpecRecord", {
                **record, "version": f"1.0.{version}", "spec_json": json.dumps(doc), "deleted": False})])
        elif op[0] == "delete":
            world.bus.publish([OutRecord("specs", op[1], "ModelSpecRecord", {
                **spec_record(op[1], 2048), "deleted": True})])
        elif op[0] == "turn":
            world.turn()
        elif op[0] == "standby":  # the leader is frozen: only the standby's loop runs
            world.clock.advance(1.0)
            world.standby.step()
        elif op[0] == "beat":
            world.clock.advance(1.0)
            world.agents.beat()
        elif op[0] == "rollout" and not rolled:
            rolled = True
            world.begin()
    new, mark = world.fail_over()
    world.clock.advance(1.0)
    world.agents.beat()
    if not continues:
        new.ctl._redo = True  # noqa: SLF001 - the reference: a first pass that plans everything
    report = new.step()
    assert report.skipped is None and report.leader and not report.errors, (report.skipped, report.errors)
    return topics(world), report, len(world.bus.log) - mark


def check(scenario: list[Op]) -> int:
    continued, report, _ = run(scenario, continues=True)
    reference, full, published = run(scenario, continues=False)
    assert full.planned is None, "the reference pass planned everything"
    assert report.planned is not None, "the new leader continued from the standby's state"
    assert continued == reference
    return published


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_a_standby_that_leads_leaves_the_topics_as_a_pass_from_scratch_would(scenario):
    check(scenario)


def test_what_the_old_leader_never_published_the_new_one_does():
    """The leader is frozen after a spec is applied; the standby planned it (its replicas placed, nowhere
    published).  The new leader's first pass publishes that plan, as a pass from scratch does."""
    scenario: list[Op] = [("apply", "x0", 0, 2), ("standby",), ("delete", "x0"), ("turn",), ("apply", "x1", 1, 1),
                          ("standby",), ("standby",)]
    continued, report, _ = run(scenario, continues=True)
    assert check(scenario) > 2  # LeaderEpoch and its event, and what the new leader published
    assert {"x1-0"} <= {a["replica_id"] for reps in continued["assignments"].values() for a in reps}
    assert "x0" not in continued["statuses"] and continued["statuses"]["x1"]["phase"] != "Ready"
    published = {(r.topic, r.key) for r in report.published}
    assert ("model-status", "x1") in published and any(
        a["replica_id"] == "x1-0" for r in report.published if r.topic == "assignments" for a in r.value["replicas"])
