"""The autoscaler as a pure function of (inputs, backlog signal, previous decision, clock): no Kafka, no sleeping.

Each test walks a model through time with a fake clock and checks the count and the reason the autoscaler
gives, the way the controller calls it once per reconcile pass.
"""

from __future__ import annotations

import math

import pytest

from sie.control.reconcile.autoscaler import AutoscalePolicy, ModelInputs, ModelSignals, ScaleDecision, decide
from sie.control.reconcile.signals import Sample, window
from sie.kernel.errors import ConfigError

POLICY = AutoscalePolicy(cooldown_s=300, idle_to_zero_s=600, drain_budget_s=30, up_settle_s=15, blocked_retry_s=60)
T0 = 1_000_000.0


def inputs(ready: int = 1, lo: int = 1, hi: int = 4, priority: str = "P1", **kw) -> ModelInputs:
    return ModelInputs("m", priority, lo, hi, ready=ready, placed=kw.pop("placed", ready), **kw)


def sig(at: float, lag: int, arrivals: float = 0.0, drained: float = 0.0, busy: bool | None = None,
        partitions: int = 12) -> ModelSignals:
    return ModelSignals(at=at, lag=lag, partitions=partitions, arrival_rate=arrivals, drain_rate=drained,
                        busy=lag > 0 if busy is None else busy, window_s=2.0)


def run(steps, policy: AutoscalePolicy = POLICY, previous: ScaleDecision | None = None) -> list[ScaleDecision]:
    """steps: (now, inputs, signal); each decision feeds the next."""
    out = []
    for now, model, signal in steps:
        previous = decide(model, signal, previous, now, policy)
        out.append(previous)
    return out


def test_backlog_scales_up_to_what_drains_it_within_the_budget_in_one_decision():
    # one replica commits 100 records/s while busy; 12000 waiting, 50/s arriving -> needs ceil((62.5 + 400) / 100) = 5
    first, second = run([
        (T0, inputs(), sig(T0, 0)),
        (T0 + 2, inputs(), sig(T0 + 2, 12_000, arrivals=50, drained=100)),
    ])
    assert first.desired == 1 and first.action == "hold"
    assert second.desired == 4 and second.action == "up"  # capped at max_replicas 4
    assert second.capacity == pytest.approx(100.0)
    assert second.needed == 5
    assert "1 -> 4" in second.reason and "lag 12000" in second.reason and "budget 30s" in second.reason
    assert second.drain_time_s == pytest.approx(12_000 / (100 - 50))


def test_before_any_backlog_the_replicas_reported_inference_rate_sizes_the_first_decision():
    (d,) = run([(T0, inputs(inference_rps=500.0), sig(T0, 12_000, arrivals=0, drained=0, busy=False))])
    assert d.desired == 1  # 12000 / 30 s / 500 per replica = 0.8: one replica drains it in time
    (d,) = run([(T0, inputs(inference_rps=100.0), sig(T0, 12_000, busy=False))])
    assert d.desired == 4 and d.capacity is None and "(inference time, reported)" in d.reason


def test_budget_is_half_the_specs_max_queue_time():
    (d,) = run([(T0, inputs(max_queue_time_ms=10_000), sig(T0, 900, drained=100))])
    assert d.budget_s == pytest.approx(5.0)
    assert d.needed == math.ceil(900 / 5 / 100) == 2


def test_scale_up_is_capped_at_the_request_topic_partitions():
    (d,) = run([(T0, inputs(hi=8), sig(T0, 50_000, drained=100, partitions=3))])
    assert d.desired == 3 and "capped at the request topic's 3 partitions" in d.reason


def test_unknown_capacity_doubles_at_most_once_per_settle_time_and_only_with_every_replica_ready():
    decisions = run([
        (T0, inputs(ready=0, placed=1), sig(T0, 500, busy=True)),  # still starting: nothing to judge yet
        (T0 + 2, inputs(ready=1, placed=1), sig(T0 + 2, 600, drained=0)),
        (T0 + 4, inputs(ready=1, placed=2), sig(T0 + 4, 650, drained=0)),
        (T0 + 18, inputs(ready=1, placed=2), sig(T0 + 18, 700, drained=0)),  # settled, but one is starting
        (T0 + 20, inputs(ready=2, placed=2), sig(T0 + 20, 750, drained=0)),
    ], previous=ScaleDecision(1, "hold", "", T0 - 100, T0 - 100, T0 - 100))
    assert [d.desired for d in decisions] == [1, 2, 2, 2, 4]
    assert "capacity unknown" in decisions[1].reason


def test_scale_down_one_step_per_cooldown_and_never_below_min():
    up = run([(T0, inputs(ready=1), sig(T0, 12_000, drained=100))])[-1]
    assert up.desired == 4
    later = run([
        (T0 + 100, inputs(ready=4), sig(T0 + 100, 0)),
        (T0 + 301, inputs(ready=4), sig(T0 + 301, 0)),
        (T0 + 302, inputs(ready=3), sig(T0 + 302, 0)),
        (T0 + 602, inputs(ready=3), sig(T0 + 602, 0)),
        (T0 + 903, inputs(ready=2), sig(T0 + 903, 0)),
        (T0 + 1300, inputs(ready=1), sig(T0 + 1300, 0)),
    ], previous=up)
    assert [d.desired for d in later] == [4, 3, 3, 2, 1, 1]
    assert "next step down in 200s" in later[0].reason
    assert later[1].action == "down" and "one step per 300s cool-down" in later[1].reason


def test_scale_down_waits_while_the_backlog_still_needs_the_replicas():
    up = run([(T0, inputs(ready=1), sig(T0, 12_000, drained=100))])[-1]
    (held,) = run([(T0 + 400, inputs(ready=4), sig(T0 + 400, 3_000, arrivals=200, drained=400))], previous=up)
    assert held.desired == 4 and held.action == "hold"


def test_latency_over_sla_with_a_growing_backlog_adds_one_replica_per_settle():
    model = inputs(ready=2, p99_latency_ms=100, p99_ms=180.0)
    start = ScaleDecision(2, "hold", "", T0 - 100, T0 - 100, T0, capacity=1000.0, lag=10)
    steps = run([
        (T0, model, sig(T0, 40, arrivals=900, drained=900)),
        (T0 + 2, model, sig(T0 + 2, 80, arrivals=900, drained=900)),
        (T0 + 20, model, sig(T0 + 20, 120, arrivals=900, drained=900)),
    ], previous=start)
    assert [d.desired for d in steps] == [3, 3, 4]
    assert "p99 180 ms > SLA 100 ms" in steps[0].reason


def test_scale_to_zero_after_idle_and_wake_on_backlog_records_the_first_result_time():
    model = inputs(lo=0, hi=2, ready=1)
    steps = run([
        (T0, model, sig(T0, 0)),
        (T0 + 400, model, sig(T0 + 400, 0)),
        (T0 + 601, model, sig(T0 + 601, 0)),
        (T0 + 700, inputs(lo=0, hi=2, ready=0, placed=0), sig(T0 + 700, 100)),
        (T0 + 703, inputs(lo=0, hi=2, ready=0, placed=1), sig(T0 + 703, 100)),
        (T0 + 705, inputs(lo=0, hi=2, ready=1, placed=1), sig(T0 + 705, 0, drained=50, busy=False)),
    ], previous=ScaleDecision(1, "hold", "", T0, T0, T0))
    assert [d.desired for d in steps] == [1, 1, 0, 1, 1, 1]
    assert "idle for 400s; scales to zero after 600s" in steps[1].reason
    assert steps[2].action == "to_zero"
    assert steps[3].action == "wake" and steps[3].woke_at == T0 + 700
    assert steps[4].first_result_ms is None
    assert steps[5].first_result_ms == pytest.approx(5000.0)


def test_p0_never_scales_to_zero_whatever_its_spec_says():
    steps = run([(T0 + i * 1000, inputs(lo=0, hi=3, priority="P0"), sig(T0 + i * 1000, 0)) for i in range(3)],
                previous=ScaleDecision(1, "hold", "", T0, T0 - 5000, T0 - 5000))
    assert [d.desired for d in steps] == [1, 1, 1]


def test_stale_missing_or_unreadable_signals_hold_the_count():
    start = ScaleDecision(2, "up", "", T0, T0, T0, capacity=10.0)
    stale, missing, broken = run([
        (T0 + 30, inputs(ready=2), sig(T0, 50_000, drained=10)),
        (T0 + 31, inputs(ready=2), None),
        (T0 + 32, inputs(ready=2), ModelSignals(at=T0 + 32, lag=None, error="GROUP_AUTHORIZATION_FAILED")),
    ], previous=start)
    assert [d.desired for d in (stale, missing, broken)] == [2, 2, 2]
    assert "30s old" in stale.reason and "not acting on a stale view" in stale.reason
    assert "no backlog signal" in missing.reason
    assert "GROUP_AUTHORIZATION_FAILED" in broken.reason


def test_a_rollout_in_progress_holds_scaling():
    (d,) = run([(T0, inputs(rollout="rollout v2: 20%"), sig(T0, 50_000, drained=10))])
    assert d.desired == 1 and "rollout in progress (rollout v2: 20%)" in d.reason


def test_added_replicas_that_cannot_be_placed_are_taken_back_and_not_retried_until_later():
    up = run([(T0, inputs(ready=1), sig(T0, 12_000, drained=100))])[-1]
    assert up.desired == 4
    steps = run([
        (T0 + 2, inputs(ready=1, placed=2, unplaced=2, unplaced_reason="unschedulable: needs 8192 MiB"),
         sig(T0 + 2, 12_000, drained=100)),
        (T0 + 4, inputs(ready=2, placed=2), sig(T0 + 4, 12_000, drained=200)),
        (T0 + 63, inputs(ready=2, placed=2), sig(T0 + 63, 12_000, drained=200)),
    ], previous=up)
    assert [d.desired for d in steps] == [2, 2, 4]
    assert steps[0].action == "blocked" and "needs 8192 MiB" in steps[0].reason
    assert "retrying scale-up in" in steps[1].reason


def test_fixed_size_and_changed_bounds():
    (fixed,) = run([(T0, inputs(lo=2, hi=2), sig(T0, 99_999, drained=1))])
    assert fixed.desired == 2 and fixed.action == "fixed"
    (shrunk,) = run([(T0, inputs(lo=1, hi=2), sig(T0, 0))], previous=ScaleDecision(4, "up", "", T0, T0, T0))
    assert shrunk.desired == 2 and shrunk.action == "bounds"


def test_decision_record_round_trip_restarts_the_idle_timer():
    (d,) = run([(T0, inputs(), sig(T0, 12_000, arrivals=50, drained=100))])
    back = ScaleDecision.from_record(d.to_record(), now=T0 + 50)
    assert (back.desired, back.action, back.last_scale_at, back.capacity) == (d.desired, d.action, T0, d.capacity)
    assert back.last_active_at == T0 + 50
    never = run([(T0, inputs(ready=1), sig(T0, 100, arrivals=500, drained=100))])[-1]
    assert never.drain_time_s == math.inf and never.to_record()["drain_time_s"] is None


def test_policy_refuses_nonsense():
    with pytest.raises(ConfigError, match="control.autoscale.target_utilisation: must be > 0 and <= 1"):
        AutoscalePolicy(target_utilisation=1.5)
    with pytest.raises(ConfigError, match="cooldown_s: must be >= 0"):
        AutoscalePolicy(cooldown_s=-1)


def test_signal_window_rates_and_busy():
    a = Sample(at=10.0, committed=100, end=150, lag=50, partitions=3)
    b = Sample(at=12.0, committed=300, end=250, lag=0, partitions=3)
    s = window([a, b])
    assert (s.arrival_rate, s.drain_rate, s.busy, s.lag) == (50.0, 100.0, False, 0)
    # commits come in batch-sized steps: the rate over the whole window, busy only if work queued throughout
    steps = [Sample(at=14.0 + i, committed=300 + 1024 * (i // 2), end=5000, lag=4700 - 1024 * (i // 2), partitions=3)
             for i in range(6)]
    w = window(steps)
    assert w.busy and w.drain_rate == pytest.approx(2048 / 5) and w.window_s == 5.0
    # a replica that keeps up has its in-flight batch uncommitted: lag above zero, but not busy
    e = Sample(at=18.0, committed=480, end=483, lag=3, partitions=3)
    f = Sample(at=20.0, committed=490, end=495, lag=5, partitions=3)
    assert not window([e, f]).busy
    first = window([a])
    assert first.arrival_rate is None and first.lag == 50
    assert window([a, Sample(at=12.0, committed=0, end=0, lag=0, partitions=4)]).drain_rate is None  # repartitioned


def test_backlog_sampler_keeps_a_window_and_reports_unreadable_models():
    from types import SimpleNamespace

    from sie.control.reconcile.signals import BacklogSampler

    now = [100.0]
    progress = {"m": (0, 0)}

    def read(admin, group, topic):
        if group == "broken":
            raise RuntimeError("GROUP_AUTHORIZATION_FAILED")
        committed, end = progress["m"]
        return SimpleNamespace(committed_total=committed, end_total=end, lag=end - committed, partitions=2)

    sampler = BacklogSampler(None, lambda: {"m": ("g", "t"), "x": ("broken", "t")}, clock=lambda: now[0],
                             read=read, rate_window_s=4.0)
    for i in range(8):
        progress["m"] = (100 * i, 1000 + 100 * i)
        sampler.sample_once(admin=None)
        now[0] += 1.0
    signals = sampler.signals()
    assert signals["m"].window_s == 4.0 and signals["m"].drain_rate == pytest.approx(100.0) and signals["m"].busy
    assert signals["x"].lag is None and "GROUP_AUTHORIZATION_FAILED" in signals["x"].error
    assert sampler.errors == 8 and sampler.last_error == "x: GROUP_AUTHORIZATION_FAILED"
