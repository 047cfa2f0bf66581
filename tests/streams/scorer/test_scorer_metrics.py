"""The scorer's metrics: labels every rule and panel relies on, the batch-filled per-request histogram,
lag series that disappear with their partitions, and the replica's recent p99."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sie.streams.scorer.metrics import BatchHistogram, ScorerMetrics, quantile_from_buckets

BUCKETS = (0.01, 0.1, 1.0)


def _samples(registry: CollectorRegistry, name: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name.startswith(name):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_batch_histogram_exposes_exactly_what_prometheus_client_would():
    values = [0.0, 0.01, 0.05, 0.1, 0.5, 1.0, 3.0, 0.009]
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    BatchHistogram("lat_seconds", "doc", ["m"], BUCKETS, ours).observe_many(values, "a")
    ref = Histogram("lat_seconds", "doc", ["m"], buckets=BUCKETS, registry=theirs).labels("a")
    for v in values:
        ref.observe(v)
    got = {k: v for k, v in _samples(ours, "lat_seconds").items() if not k[0].endswith("_created")}
    want = {k: v for k, v in _samples(theirs, "lat_seconds").items() if not k[0].endswith("_created")}
    assert got == pytest.approx(want)


def test_quantile_matches_prometheus_interpolation():
    # 100 observations: 90 in (0, 0.01], 10 in (0.1, 1]: p99 is 9/10 of the way through (0.1, 1]
    assert quantile_from_buckets(BUCKETS, [90, 0, 10, 0], 0.99) == pytest.approx(0.1 + 0.9 * 0.9)
    assert quantile_from_buckets(BUCKETS, [0, 0, 0, 5], 0.99) == 1.0  # +Inf bucket: the highest bound
    assert quantile_from_buckets(BUCKETS, [0, 0, 0, 0], 0.99) is None


def test_every_series_a_rule_names_exists_before_traffic_with_model_id():
    m = ScorerMetrics("fraud", "scoring", "P0", "1.0.0", p99_budget_ms=50)
    text = generate_latest(m.registry).decode()
    assert 'sie_dead_letters_total{model_id="fraud",reason="inference_error"} 0.0' in text
    assert 'sie_records_out_total{model_id="fraud",status="ok"} 0.0' in text
    assert ('sie_request_latency_seconds_count{model_id="fraud",priority_level="P0",service_type="scoring",'
            'version="1.0.0"} 0.0') in text
    assert 'sie_model_p99_budget_seconds{model_id="fraud",priority_level="P0",service_type="scoring"} 0.05' in text


def test_lag_series_of_a_partition_no_longer_assigned_disappear():
    m = ScorerMetrics("fraud", "scoring", "P0", "1.0.0")
    m.set_lag({0: 5, 1: 7})
    assert m.lag() == 12
    m.set_lag({1: 2})
    text = generate_latest(m.registry).decode()
    assert 'partition="0"' not in text and 'sie_consumer_lag{model_id="fraud",partition="1"} 2.0' in text
    assert m.lag() == 2
    m.clear_lag()
    assert m.lag() == 0 and "partition=" not in generate_latest(m.registry).decode()


def test_batch_committed_adds_time_since_prepare_to_each_queue_time():
    m = ScorerMetrics("fraud", "scoring", "P0", "1.0.0")
    stats = {"ok": 3, "expired": 0, "dead": {"invalid_json": 1}, "oldest_ms": 40.0,
             "queued": {"1.0.0": [1.0, 2.0, 3.0]}, "at_ms": 1_000.0}
    m.batch_committed(stats, 4, 0.002, now_ms=1_020.0)
    labels = {"model_id": "fraud", "service_type": "scoring", "priority_level": "P0", "version": "1.0.0"}
    assert m.value("sie_request_latency_seconds_count", labels) == 3
    assert m.value("sie_request_latency_seconds_sum", labels) == pytest.approx((21 + 22 + 23) / 1000)
    assert m.value("sie_dead_letters_total", {"model_id": "fraud", "reason": "invalid_json"}) == 1
    assert m.value("sie_records_in_total", {"model_id": "fraud"}) == 4


def test_recent_p99_looks_at_the_window_only():
    m = ScorerMetrics("fraud", "scoring", "P0", "1.0.0")
    labels = ("fraud", "scoring", "P0", "1.0.0")
    assert m.recent_p99(now=0.0) is None
    m.request_latency.observe_many(np.full(100, 20.0), *labels)  # a slow minute...
    assert m.recent_p99(now=30.0) == pytest.approx(10.0 + (30.0 - 10.0) * 0.99)  # in (10 s, 30 s]
    m.recent_p99(now=70.0)
    m.request_latency.observe_many(np.full(100, 0.004), *labels)  # ...then a fast one: the slow one ages out
    assert m.recent_p99(now=140.0) <= 0.005
