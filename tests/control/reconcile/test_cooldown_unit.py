"""Cool-downs operators control (issue 17): a re-apply, a new version, a deleted model or `sie replica reset`
ends a replica's cool-down at once; its reason and end show in ModelStatus; stale FAILED reports start none."""

from __future__ import annotations

import json

from sie.control.reconcile.records import COOLDOWN_RESET_KIND
from sie.control.reconcile.status import ModelStatus
from sie.schemas.avro_codec import decode, encode
from tests.control.reconcile.test_control_unit import assigned, gpu, heartbeat, report, spec_record
from tests.control.reconcile.test_control_unit import world as world  # noqa: F401 - the fixture


def fail_on_only_node(clock, state, pub, ctl):
    """alpha-0 FAILED on node-a, the only node: unschedulable, kept off node-a (cool-down 60 s)."""
    state.apply_node("node-b", None)
    rec = spec_record("alpha")
    rec["applied_at_ms"] = int((clock() - 100) * 1000)
    state.apply_spec("alpha", rec)
    ctl.reconcile(clock())
    clock.advance(1)
    heartbeat(state, "node-a", clock(), [gpu(0), gpu(1)], [report("alpha-0", "FAILED", "crashed 3 times: ImportError")])
    return ctl.reconcile(clock())


def test_the_cooldown_shows_its_node_end_and_reason_in_model_status(world):
    clock, state, pub, _, ctl = world
    rep = fail_on_only_node(clock, state, pub, ctl)
    (view,) = rep.statuses["alpha"].replicas
    assert view.state == "UNSCHEDULABLE" and assigned(pub)["node-a"] == set()
    assert view.cooldowns == ({"node": "node-a", "until_ms": int((clock() + 60) * 1000),
                               "reason": "crashed 3 times: ImportError"},)
    record = rep.statuses["alpha"].to_record()
    assert ModelStatus.from_record(decode(encode("ModelStatus", record))) == rep.statuses["alpha"]  # Avro round trip
    failed = [e.value for e in pub.all("events") if e.value["kind"] == "replica_failed"]
    assert "sie replica reset alpha-0" in failed[0]["detail"]


def test_reapplying_the_spec_ends_the_cooldown_and_places_the_replica_again(world):
    clock, state, pub, _, ctl = world
    fail_on_only_node(clock, state, pub, ctl)
    clock.advance(5)
    rec = spec_record("alpha")  # the same document, applied again (or delete + apply)
    rec["applied_at_ms"] = int(clock() * 1000)
    state.apply_spec("alpha", rec)
    heartbeat(state, "node-a", clock(), [gpu(0), gpu(1)], [report("alpha-0", "FAILED")])  # stale, read late
    rep = ctl.reconcile(clock())
    assert assigned(pub)["node-a"] == {"alpha-0"} and ctl.exclusions == {}
    assert rep.statuses["alpha"].replicas[0].cooldowns == ()
    cleared = [e.value for e in pub.all("events") if e.value["kind"] == "cooldown_cleared"]
    assert cleared and "spec alpha 1.0.0 applied after the failure" in cleared[0]["detail"]


def test_a_new_version_ends_it_too(world):
    clock, state, pub, _, ctl = world
    fail_on_only_node(clock, state, pub, ctl)
    clock.advance(5)
    rec = spec_record("alpha")
    doc = json.loads(rec["spec_json"])
    doc["version"] = "1.0.1"
    rec.update(version="1.0.1", spec_json=json.dumps(doc), applied_at_ms=int(clock() * 1000))
    state.apply_spec("alpha", rec)
    ctl.reconcile(clock())
    assert assigned(pub)["node-a"] == {"alpha-0"}


def test_a_deleted_model_forgets_its_cooldowns(world):
    clock, state, pub, _, ctl = world
    fail_on_only_node(clock, state, pub, ctl)
    state.apply_spec("alpha", None)
    clock.advance(1)
    ctl.reconcile(clock())
    assert ctl.exclusions == {}


def test_a_reset_event_ends_it_and_a_failure_after_the_reset_starts_a_new_one(world):
    clock, state, pub, _, ctl = world
    fail_on_only_node(clock, state, pub, ctl)
    clock.advance(3)
    state.apply_event({"ts_ms": int(clock() * 1000), "kind": COOLDOWN_RESET_KIND, "model": "alpha",
                       "replica_id": "alpha-0", "node": None, "detail": "by ops@host"})
    ctl.reconcile(clock())
    assert assigned(pub)["node-a"] == {"alpha-0"}
    cleared = [e.value for e in pub.all("events") if e.value["kind"] == "cooldown_cleared"]
    assert "reset by hand (sie replica reset alpha-0)" in cleared[-1]["detail"]
    clock.advance(10)  # the fix did not work: it fails again, after the reset
    heartbeat(state, "node-a", clock(), [gpu(0), gpu(1)], [report("alpha-0", "FAILED", "still broken")])
    ctl.reconcile(clock())
    assert assigned(pub)["node-a"] == set() and ctl.exclusions[("alpha-0", "node-a")].reason == "still broken"


def test_without_an_operator_it_still_runs_out(world):
    clock, state, pub, _, ctl = world
    fail_on_only_node(clock, state, pub, ctl)
    clock.advance(61)
    heartbeat(state, "node-a", clock(), [gpu(0), gpu(1)])
    ctl.reconcile(clock())
    assert assigned(pub)["node-a"] == {"alpha-0"}
    assert not [e for e in pub.all("events") if e.value["kind"] == "cooldown_cleared"]  # expiry is not news
