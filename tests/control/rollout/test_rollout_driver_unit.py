"""The leader's rollout driver with a fake clock and fake windows: records, refusals, resume, actions."""

from __future__ import annotations

import json

import pytest

from sie.control.rollout.driver import Entry, RolloutDriver, RolloutRefused
from sie.control.rollout.machine import Answer, Phase, RolloutError, VersionWindow
from sie.schemas.spec import load
from tests.support.scorer_fixtures import echo_spec_doc


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


class Windows:
    def __init__(self) -> None:
        self.by_version = {"1.0.0": VersionWindow.of([Answer(10.0, 8.0, 10)] * 1000),
                           "1.1.0": VersionWindow.of([Answer(11.0, 8.5, 2)] * 500)}
        self.asked: list[tuple[str, int]] = []

    def window(self, model, version, since_ms):
        self.asked.append((version, since_ms))
        return self.by_version[version]


def specs(rollout=None, breaking=False):
    doc = echo_spec_doc("m")
    old = load(doc)
    doc["spec"]["model"]["version"] = "1.1.0"
    if rollout is not None:
        doc["spec"]["rollout"] = rollout
    if breaking:
        doc["spec"]["inputSchema"]["fields"].append({"name": "z", "type": "float"})  # new required input
        doc["spec"]["exampleInput"] = {"x": 1.0, "z": 1.0}
    return old, load(doc)


def drive(driver, clock, seconds, step=0.5):
    """Tick for ``seconds`` of fake time, committing every change (as the leader does after publishing)."""
    out = []
    for _ in range(int(seconds / step)):
        clock.t += step
        for entry, records in driver.tick():
            driver.commit(entry)
            out += records
    return out


def test_a_rollout_runs_to_complete_and_publishes_its_state_events_and_the_new_spec():
    clock, windows = Clock(), Windows()
    driver = RolloutDriver(windows, clock=clock)
    entry, records = driver.begin(*specs({"steps": [10, 50, 100], "intervalSeconds": 2}))
    assert [(r.topic, r.record) for r in records] == [("rollouts", "Rollout")]
    driver.commit(entry)
    records = drive(driver, clock, 10)
    r = driver.get("m").rollout
    assert r.phase is Phase.COMPLETE and r.weight_bp == 10_000
    rollout_records = [x.value for x in records if x.topic == "rollouts"]
    # Surging, Canary 10 / 50 / 100, Promoting, Draining, Complete
    assert [x["weight_bp"] for x in rollout_records] == [0, 1000, 5000, 10000, 10000, 10000, 10000]
    assert [x["epoch"] for x in rollout_records] == [0, 1, 2, 3, 3, 3, 3]
    (spec_record,) = [x.value for x in records if x.topic == "specs"]
    assert spec_record["version"] == "1.1.0" and json.loads(spec_record["spec_json"])["version"] == "1.1.0"
    details = [x.value["detail"] for x in records if x.topic == "events"]
    assert len(details) == len(r.events) and "Canary -> Promoting" in " ".join(details)


def test_a_failing_canary_rolls_back_and_the_spec_stays():
    clock, windows = Clock(), Windows()
    windows.by_version["1.1.0"] = VersionWindow.of([Answer(11.0, 8.5, 2)] * 475, errors=25)  # 5 % dead letters
    driver = RolloutDriver(windows, clock=clock)
    driver.commit(driver.begin(*specs({"intervalSeconds": 2}))[0])
    records = drive(driver, clock, 5)
    r = driver.get("m").rollout
    assert r.phase is Phase.ROLLED_BACK and r.weight_bp == 0
    assert not [x for x in records if x.topic == "specs"]
    assert "error rate 5.00%" in next(e.reason for e in r.events if e.target is Phase.ROLLING_BACK)


def test_refusals_name_the_kind():
    driver = RolloutDriver(Windows(), clock=Clock())
    with pytest.raises(RolloutRefused, match="schema_incompatible with 1.0.0: inputs.z") as exc:
        driver.begin(*specs(breaking=True))
    assert exc.value.kind == "schema_incompatible"
    driver.commit(driver.begin(*specs())[0])
    with pytest.raises(RolloutRefused, match="sie rollout abort m") as exc:
        driver.begin(*specs())
    assert exc.value.kind == "in_progress"


def test_a_new_leader_resumes_from_the_stored_records_mid_step():
    clock, windows = Clock(), Windows()
    first = RolloutDriver(windows, clock=clock)
    first.commit(first.begin(*specs({"steps": [10, 50, 100], "intervalSeconds": 4}))[0])
    drive(first, clock, 3)  # Canary, first step, not yet judged
    stored = first.get("m").to_record(int(clock.t * 1000))
    assert stored["phase"] == "Canary" and stored["step"] == 0
    second = RolloutDriver(windows, clock=clock)
    second.load([stored])
    assert second.get("m") == Entry.from_record(stored)
    drive(second, clock, 20)
    assert second.get("m").rollout.phase is Phase.COMPLETE


def test_operator_actions():
    clock = Clock()
    driver = RolloutDriver(Windows(), clock=clock)
    driver.commit(driver.begin(*specs({"intervalSeconds": 2}))[0])
    drive(driver, clock, 1)
    entry, records = driver.act("m", "pause", "alice")
    driver.commit(entry)
    assert entry.rollout.phase is Phase.PAUSED and "paused by alice" in records[1].value["detail"]
    drive(driver, clock, 30)
    assert driver.get("m").rollout.phase is Phase.PAUSED
    driver.commit(driver.act("m", "abort", "bob")[0])
    drive(driver, clock, 1)
    assert driver.get("m").rollout.phase is Phase.ROLLED_BACK
    with pytest.raises(RolloutError, match="no rollout"):
        driver.act("other", "pause", "x")
    with pytest.raises(RolloutError, match="must be pause, resume, promote or abort"):
        driver.act("m", "explode", "x")


def test_the_stable_p99_reference_reaches_back_at_least_a_minute():
    """The canary and the stable are judged over the step's window; the stable's p99 (the relative gate's
    limit) over at least the last REFERENCE_S, since one step holds too few stable calls for a p99."""
    clock, windows = Clock(), Windows()
    driver = RolloutDriver(windows, clock=clock)
    driver.commit(driver.begin(*specs({"intervalSeconds": 20}))[0])
    drive(driver, clock, 2)
    step_start = driver.get("m").rollout.phase_since_ms
    windows.asked.clear()
    drive(driver, clock, 0.5)
    now_ms = int(clock.t * 1000)
    assert sorted(windows.asked) == sorted([("1.1.0", step_start), ("1.0.0", step_start),
                                            ("1.0.0", now_ms - 60_000)])


# --- a canary that cannot be served everywhere: the capacity plan's companions ------------------------------

def planned(**companions_state):
    """A capacity plan whose surge replica is READY and whose companions are as given."""
    from sie.control.placement.rollout_capacity import CapacityInputs, plan_capacity

    assigned = {0: "1.0.0", 1: "1.1.0"}
    companions = {0: companions_state.get("stable_replica", ("ready", "")),
                  1: companions_state.get("surge_replica", ("ready", ""))}
    return plan_capacity(CapacityInputs(companions_state.get("phase", "Surging"), "1.0.0", "1.1.0", 1, 1, assigned,
                                        frozenset(assigned), True, companions=companions))


def test_surging_waits_for_the_canary_on_every_replica_and_fails_with_the_reason_it_cannot_load():
    clock, plans = Clock(), {}
    driver = RolloutDriver(Windows(), clock=clock, capacity=lambda model: plans.get(model))
    driver.commit(driver.begin(*specs({"intervalSeconds": 2, "surgeTimeoutSeconds": 60}))[0])
    plans["m"] = planned(stable_replica=("loading", ""))
    drive(driver, clock, 5)
    assert driver.get("m").rollout.phase is Phase.SURGING  # the surge replica is READY, replica 0 still loading
    plans["m"] = planned(stable_replica=("failed", "spec.backend.callable: no attribute 'no_such_scorer'"))
    drive(driver, clock, 1)
    r = driver.get("m").rollout
    assert r.phase is Phase.FAILED and r.weight_bp == 0
    assert "version 1.1.0 FAILED on replica 0: spec.backend.callable: no attribute 'no_such_scorer'" in r.reason


def test_a_canary_lost_on_a_replica_mid_step_rolls_back_at_once():
    clock, plans = Clock(), {}
    driver = RolloutDriver(Windows(), clock=clock, capacity=lambda model: plans.get(model))
    driver.commit(driver.begin(*specs({"steps": [10, 50, 100], "intervalSeconds": 30}))[0])
    plans["m"] = planned()
    drive(driver, clock, 2)
    assert driver.get("m").rollout.phase is Phase.CANARY
    plans["m"] = planned(stable_replica=("failed", "lost 3 times within 300s; last: no answer within 10s"))
    drive(driver, clock, 1)
    r = driver.get("m").rollout
    assert r.phase is Phase.ROLLED_BACK and r.weight_bp == 0
    assert "canary failed at 10%: version 1.1.0 FAILED on replica 0: lost 3 times" in \
        next(e.reason for e in r.events if e.target is Phase.ROLLING_BACK)


def test_a_canary_that_answers_nothing_for_a_whole_step_rolls_back():
    from sie.control.rollout.machine import VersionWindow

    clock, windows = Clock(), Windows()
    windows.by_version["1.1.0"] = VersionWindow()  # its share never reached it
    driver = RolloutDriver(windows, clock=clock)
    driver.commit(driver.begin(*specs({"intervalSeconds": 4}))[0])
    drive(driver, clock, 3)
    assert driver.get("m").rollout.phase is Phase.CANARY  # inconclusive until a whole interval passed
    drive(driver, clock, 3)
    r = driver.get("m").rollout
    assert r.phase is Phase.ROLLED_BACK
    assert "canary 1.1.0 answered no request in 4s at 10% while 1.0.0 answered 1000" in \
        next(e.reason for e in r.events if e.target is Phase.ROLLING_BACK)


def test_a_canary_no_replica_can_serve_for_a_whole_step_rolls_back_naming_why():
    """Every replica's companion is lost and restarting: none holds partitions, so stable answers nothing either
    (no fallback); after a whole interval without a canary answer the rollout rolls back, saying why."""
    from sie.control.rollout.machine import VersionWindow

    clock, windows, plans = Clock(), Windows(), {}
    windows.by_version = {"1.1.0": VersionWindow(), "1.0.0": VersionWindow()}  # nothing answered at all
    driver = RolloutDriver(windows, clock=clock, capacity=lambda model: plans.get(model))
    driver.commit(driver.begin(*specs({"steps": [10, 50, 100], "intervalSeconds": 4}))[0])
    plans["m"] = planned()
    drive(driver, clock, 2)
    assert driver.get("m").rollout.phase is Phase.CANARY
    lost = ("waiting", "lost (its process exited); restarting")
    plans["m"] = planned(phase="Canary", stable_replica=lost, surge_replica=lost)
    since = driver.get("m").rollout.phase_since_ms
    while clock.t * 1000 - since < 3500:
        drive(driver, clock, 0.5)
        assert driver.get("m").rollout.phase is Phase.CANARY  # not a whole interval yet
    drive(driver, clock, 1)
    r = driver.get("m").rollout
    assert r.phase is Phase.ROLLED_BACK and r.weight_bp == 0, r.events
    why = next(e.reason for e in r.events if e.target is Phase.ROLLING_BACK)
    assert why.startswith("no replica could serve canary 1.1.0 for ") and "replica 0 waiting 1.1.0 (lost" in why, why


def test_a_step_where_one_replica_still_serves_both_is_not_rolled_back_for_want_of_replicas():
    from sie.control.rollout.machine import VersionWindow

    clock, windows, plans = Clock(), Windows(), {}
    windows.by_version = {"1.1.0": VersionWindow(), "1.0.0": VersionWindow()}
    driver = RolloutDriver(windows, clock=clock, capacity=lambda model: plans.get(model))
    driver.commit(driver.begin(*specs({"steps": [10, 50, 100], "intervalSeconds": 4}))[0])
    plans["m"] = planned()
    drive(driver, clock, 2)
    plans["m"] = planned(phase="Canary", stable_replica=("waiting", "lost (its process exited); restarting"))
    drive(driver, clock, 6)
    assert driver.get("m").rollout.phase is Phase.CANARY  # the surge replica serves both: no verdict yet


def test_an_entry_decodes_its_two_specs_once_when_read_and_never_while_it_moves(monkeypatch):
    from sie.schemas.spec import ModelService

    decoded: list[str] = []
    real = ModelService.from_document.__func__

    def counting(cls, doc):
        decoded.append(doc["version"])
        return real(cls, doc)

    clock, windows = Clock(), Windows()
    first = RolloutDriver(windows, clock=clock)
    stable, canary = specs({"steps": [10, 50, 100], "intervalSeconds": 4})
    monkeypatch.setattr(ModelService, "from_document", classmethod(counting))
    entry, _ = first.begin(stable, canary)
    assert entry.stable is stable and entry.canary is canary  # begun from the API's specs: nothing to decode
    first.commit(entry)
    drive(first, clock, 3)
    first.commit(first.act("m", "pause", "op")[0])
    assert decoded == [] and first.get("m").rollout.phase is Phase.PAUSED
    second = RolloutDriver(windows, clock=clock)
    second.load([first.get("m").to_record(int(clock.t * 1000))])  # read from the rollouts topic: decoded once
    assert decoded == ["1.0.0", "1.1.0"]
    resumed = second.get("m")
    assert (resumed.stable.version, resumed.canary.version) == ("1.0.0", "1.1.0")
    second.commit(second.act("m", "resume", "op")[0])
    drive(second, clock, 20)
    assert second.get("m").rollout.phase is Phase.COMPLETE and decoded == ["1.0.0", "1.1.0"]
    assert second.get("m").stable is resumed.stable  # carried through every step
