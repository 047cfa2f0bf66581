"""The rollout state machine, driven by a fake clock (milliseconds passed explicitly)."""

from __future__ import annotations

import pytest

from sie.control.rollout.machine import (
    TRANSITIONS,
    Answer,
    Gates,
    Phase,
    Policy,
    Rollout,
    RolloutError,
    RolloutTransitionError,
    Verdict,
    VersionWindow,
    judge,
    new_rollout,
    weights_of,
)
from sie.kernel.errors import ConfigError

#: ok answers of 20 ms (model call 15 ms): the canary in calls of 2 rows, the stable in calls of 18
HEALTHY = VersionWindow.of([Answer(20.0, 15.0, 2)] * 999, errors=1)
STABLE = VersionWindow.of([Answer(20.0, 15.0, 18)] * 8991, errors=9)


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def advance(self, seconds: float) -> int:
        self.ms += int(seconds * 1000)
        return self.ms


def _canary(policy: Policy | None = None) -> tuple[Rollout, Clock]:
    clock = Clock()
    r = new_rollout("m", "1.0.0", "1.1.0", policy or Policy(), clock.ms)
    r = r.start(clock.advance(1)).surge_ready(clock.advance(2))
    return r, clock


def test_default_policy_is_the_design_steps_and_interval():
    p = Policy()
    assert p.steps == (10, 20, 50, 100) and p.interval_s == 20.0


def test_healthy_rollout_walks_every_step_then_completes():
    r, clock = _canary()
    assert r.phase is Phase.CANARY and r.step == 0 and r.weight_bp == 1000 and r.epoch == 1
    seen = [r.weight_bp]
    while r.phase is Phase.CANARY:
        r = r.tick(clock.advance(10), HEALTHY, STABLE)  # half an interval: no move yet
        assert r.weight_bp == seen[-1]
        r = r.tick(clock.advance(10), HEALTHY, STABLE)
        seen.append(r.weight_bp)
    assert seen == [1000, 2000, 5000, 10000, 10000]
    assert r.phase is Phase.PROMOTING
    r = r.promoted(clock.advance(1)).drained(clock.advance(1))
    assert r.phase is Phase.COMPLETE and r.terminal
    assert [e.target for e in r.events] == [Phase.SURGING, Phase.CANARY, Phase.CANARY, Phase.CANARY, Phase.CANARY,
                                            Phase.PROMOTING, Phase.DRAINING, Phase.COMPLETE]
    assert all(e.reason for e in r.events)
    # ~90 s end to end at the defaults (4 intervals of 20 s plus the surge)
    assert (r.events[-1].at_ms - r.started_ms) / 1000 < 90
    assert r.epoch == 4  # one bump per weight change: 10, 20, 50, 100


def test_failing_gate_rolls_back_at_once_not_at_the_interval_end():
    r, clock = _canary()
    bad = VersionWindow.of([Answer(20.0, 15.0, 2)] * 376, errors=24)  # 6 % errors
    r = r.tick(clock.advance(1), bad, STABLE)
    assert r.phase is Phase.ROLLING_BACK and r.weight_bp == 0 and r.epoch == 2
    assert "error rate 6.00% > stable 0.10% + 1.00%" in r.reason
    r = r.rolled_back(clock.advance(1))
    assert r.phase is Phase.ROLLED_BACK and r.terminal


def test_too_few_samples_is_inconclusive_and_holds_the_step():
    r, clock = _canary(Policy(gates=Gates(min_samples=500)))
    few = VersionWindow(requests=10, errors=10, expired=0, p99_ms=999.0)  # terrible, but too few to judge
    r2 = r.tick(clock.advance(59), few, STABLE)
    assert r2 is r  # past the 20 s interval, within 1 + inconclusiveIntervals (2) of them
    assert r.tick(clock.advance(1), few, STABLE).phase is Phase.ROLLING_BACK  # not forever


@pytest.mark.parametrize("canary,why", [
    (VersionWindow.of([Answer(45.0, 40.0, 1)] * 1000), "inference p99 40.0 ms > stable 15.0 ms x 1.5 + 5 ms"),
    (VersionWindow.of([Answer(120.0, 15.0, 1)] * 1000), "p99 120.0 ms > p99MaxMs 100"),
    (VersionWindow.of([Answer(20.0, 15.0, 1)] * 950, expired=50), "expiry rate 5.00% > stable 0.00% + 1.00%"),
])
def test_each_gate_fails_on_its_own(canary, why):
    result = judge(Gates(p99_max_ms=100.0), canary, STABLE)
    assert result.verdict is Verdict.FAIL and why in result.line()


def test_relative_gates_skip_a_stable_without_samples():
    """At 100 % stable has no traffic: the canary is judged on its own numbers and the absolute SLA."""
    slower = VersionWindow.of([Answer(80.0, 75.0, 1)] * 1000)
    assert judge(Gates(), slower, VersionWindow()).verdict is Verdict.PASS
    assert judge(Gates(p99_max_ms=50), slower, VersionWindow()).verdict is Verdict.FAIL


def test_pause_holds_weight_and_resume_restarts_the_interval():
    r, clock = _canary()
    r = r.tick(clock.advance(20), HEALTHY, STABLE)  # step 2 (20 %)
    r = r.pause(clock.advance(5), who="alice")
    assert r.phase is Phase.PAUSED and r.weight_bp == 2000 and r.label == "Paused[Canary(step 2/4, 20%)]"
    assert r.tick(clock.advance(600), HEALTHY, STABLE) is r  # paused: time does not advance steps
    r = r.resume(clock.advance(1))
    assert r.phase is Phase.CANARY and r.step == 1
    assert r.tick(clock.advance(19), HEALTHY, STABLE).step == 1
    assert r.tick(clock.advance(1), HEALTHY, STABLE).step == 2


def test_manual_promote_and_abort():
    r, clock = _canary()
    p = r.promote(clock.advance(1))
    assert p.phase is Phase.PROMOTING and p.weight_bp == 10_000
    a = r.pause(clock.advance(1)).abort(clock.advance(1), who="bob")
    assert a.phase is Phase.ROLLING_BACK and a.weight_bp == 0 and a.reason == "aborted by bob"
    with pytest.raises(RolloutError, match="cannot abort in RollingBack"):
        a.abort(clock.advance(1))
    with pytest.raises(RolloutError, match="not paused"):
        r.resume(clock.advance(1))


def test_surge_timeout_fails_with_stable_untouched():
    clock = Clock()
    r = new_rollout("m", "1", "2", Policy(surge_timeout_s=30), clock.ms).start(clock.advance(0))
    assert r.tick(clock.advance(29)).phase is Phase.SURGING
    f = r.tick(clock.advance(1))
    assert f.phase is Phase.FAILED and f.weight_bp == 0 and "surgeTimeoutSeconds 30" in f.reason


def test_transitions_outside_the_table_are_refused():
    r, clock = _canary()
    with pytest.raises(RolloutTransitionError, match="start needs Pending"):
        r.start(clock.advance(1))
    with pytest.raises(RolloutTransitionError, match="Canary -> Complete is not a transition"):
        r._move(Phase.COMPLETE, clock.advance(1), "skip")
    for phase in (Phase.COMPLETE, Phase.ROLLED_BACK, Phase.FAILED):
        assert TRANSITIONS[phase] == frozenset()


def test_round_trip_through_the_wire_document():
    r, clock = _canary(Policy(steps=(25, 100), interval_s=1.5, gates=Gates(p99_max_ms=80, min_samples=7)))
    r = r.pause(clock.advance(1))
    assert Rollout.from_document(r.to_document()) == r


@pytest.mark.parametrize("doc,msg", [
    ({"steps": [10, 5, 100]}, "strictly rising"),
    ({"steps": [10, 50]}, "last step must be 100"),
    ({"intervalSeconds": 0}, "intervalSeconds: must be > 0"),
    ({"gates": {"minSamples": 0}}, "minSamples: must be >= 1"),
])
def test_policy_errors_name_the_field(doc, msg):
    with pytest.raises(ConfigError, match=msg):
        Policy.from_document(doc)


def test_weights_stable_first_and_sum_to_full():
    r, _ = _canary()
    assert list(weights_of(r)) == [("1.0.0", 9000), ("1.1.0", 1000)]


def test_same_version_is_no_rollout():
    with pytest.raises(RolloutError, match="already the stable version"):
        new_rollout("m", "1", "1", Policy(), 0)
