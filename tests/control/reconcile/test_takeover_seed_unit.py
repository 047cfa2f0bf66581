"""``takeover``: when a pass may act on its view, and what a new term seeds from the model statuses last
published, as pure functions over records and times (a fake clock: values, no sleeps)."""

from __future__ import annotations

import logging

from sie.control.reconcile import takeover
from sie.control.reconcile.cooldowns import Cooldown
from sie.control.reconcile.director import Extra
from sie.control.reconcile.ports import FreshView
from sie.control.reconcile.records import ClusterState
from tests.control.reconcile.test_control_unit import FakeClock, gpu, heartbeat, register, spec_record

NOW = 1_000_000.0


class View:
    def __init__(self, caught_up_at: float | None, stale: str | None = None) -> None:
        self.caught_up_at, self._stale = caught_up_at, stale

    def stale_reason(self) -> str | None:
        return self._stale

    def lag_reason(self) -> str | None:
        return None


def test_a_pass_waits_for_the_reader_and_for_every_replayed_node_to_speak_live():
    clock, state = FakeClock(NOW), ClusterState()
    snap = state.snapshot()
    assert takeover.stale_reason(FreshView(), snap, NOW, 6.0) is None
    assert takeover.stale_reason(View(None), snap, NOW, 6.0) == "state reader not caught up"
    assert takeover.stale_reason(View(NOW, "state reader died"), snap, NOW, 6.0) == "state reader died"
    register(state, "node-a", [gpu(0)])
    state.apply_heartbeat({"node": "node-a", "ts_ms": int((NOW - 1) * 1000), "seq": 1, "gpus": [gpu(0)],
                           "replicas": []}, seen_at=None)  # replayed: history, not a live voice
    snap = state.snapshot()
    assert takeover.stale_reason(View(NOW - 2), snap, NOW, 6.0) == (
        "caught up 2.0s ago; waiting up to 4.0s for a live heartbeat of node-a before judging liveness")
    assert takeover.stale_reason(View(NOW - 6), snap, NOW, 6.0) is None  # one node timeout: judged as it is
    heartbeat(state, "node-a", clock(), [gpu(0)])  # heard live
    assert takeover.stale_reason(View(NOW - 2), state.snapshot(), NOW, 6.0) is None


def status_record(name: str, replicas: list[dict], **extra) -> dict:
    return {"name": name, "phase": "Degraded", "desired_replicas": len(replicas), "ready_replicas": 0,
            "replicas": replicas, "epoch": 2, **extra}


def replica(rid: str, state: str, reason: str | None = None, cooldowns: list | None = None) -> dict:
    return {"replica_id": rid, "model": rid.rsplit("-", 1)[0], "version": "1.0.0", "node": None, "state": state,
            "reason": reason, "cooldowns": cooldowns or []}


def test_a_new_term_seeds_statuses_reasons_and_running_cooldowns(caplog):
    ended = {"node": "node-b", "until_ms": int((NOW - 1) * 1000), "reason": "old"}
    running = {"node": "node-a", "until_ms": int((NOW + 30) * 1000), "reason": "ImportError"}
    records = {
        "alpha": status_record("alpha", [replica("alpha-0", "UNSCHEDULABLE", "unschedulable: no room", [running, ended])]),
        "broken": {"name": "broken", "replicas": [{"replica_id": "broken-0"}]},  # unreadable: re-published
    }
    mine = {("alpha-0", "node-a"): Cooldown(NOW + 50, "seen here", "alpha", NOW - 10)}
    with caplog.at_level(logging.WARNING):
        parsed = takeover.parse_statuses(records)
        statuses, reported, exclusions = takeover.seed_term(parsed, mine, NOW, 60.0)
    assert set(statuses) == {"alpha"} and statuses["alpha"].replicas[0].replica_id == "alpha-0"
    assert reported == {"alpha-0": "unschedulable: no room"}
    assert exclusions == mine  # a cool-down this process already holds is kept as it is
    _, _, exclusions = takeover.seed_term(parsed, {}, NOW, 60.0)
    assert exclusions == {("alpha-0", "node-a"): Cooldown(NOW + 30, "ImportError", "alpha", NOW - 30)}
    assert "model status of broken unreadable" in caplog.text


def test_decisions_and_director_floors_come_from_the_statuses_and_unreadable_ones_start_afresh(caplog):
    floor = Extra(3, "node-b", "m-0", NOW - 20, None).to_record()
    records = {"m": {"director": floor, "autoscale": {"desired": "many"}},
               "gone": {"director": floor}, "n": {"director": {"floor": 2}}}
    state = ClusterState()
    for name in ("m", "n"):
        state.apply_spec(name, spec_record(name))
    with caplog.at_level(logging.WARNING):
        floors = takeover.seed_director_floors(records, state.snapshot())
        decisions = takeover.seed_decisions(records, NOW)
    assert floors == {"m": Extra(3, "node-b", "m-0", NOW - 20, None)}  # "gone" is no longer applied
    assert decisions == {}
    assert "traffic director floor of n unreadable" in caplog.text and "autoscale state of m unreadable" in caplog.text


def test_a_term_begins_when_leadership_is_won_or_its_epoch_changes():
    term = takeover.Term()
    assert term.begin(False, 1) is False and term.epoch is None  # a standby has no term
    assert term.begin(True, 2) is True and term.epoch == 2
    term.seeded = term.decisions_seeded = term.director_seeded = term.adopt_move = True
    assert term.begin(True, 2) is False and term.seeded and term.decisions_seeded  # the same term goes on
    assert term.begin(True, 3) is True  # won again between two passes: a new term seeds again
    assert (term.seeded, term.decisions_seeded, term.director_seeded) == (False, False, False)
    assert term.adopt_move  # consumed by the pass that adopts the move, not by a new term
    term.begin(False, 3)
    assert term.begin(True, 3) is True  # lost and won back with the same epoch: a new term all the same
