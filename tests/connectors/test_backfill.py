"""Backfill by replay: bounds, throttling (unit) and the job against a real broker (range, idempotence,
SIGKILL + resume with exactly one result per record, live offsets untouched, yielding to live lag)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from sie.connectors.backfill import BackfillConfig, BackfillJob
from sie.connectors.backfill_plan import BackfillPlan, BoundKind, PartitionRange, parse_bound
from sie.connectors.backfill_throttle import LiveLagGate, RateLimiter
from sie.kernel.admin import ensure_model_topics
from sie.kernel.errors import ConfigError
from sie.kernel.names import Names
from tests.support.helpers import REPO_ROOT, consume_all, create_topic, wait_until
from tests.support.scorer_fixtures import (
    ALLOWED_MODULES,
    CommittedReader,
    echo_spec,
    load_echo_backend,
    write_echo_spec,
)

REPO = REPO_ROOT
BASE_MS = 1_700_000_000_000


# --- unit: bounds and throttling ---------------------------------------------------------------------------
@pytest.mark.parametrize("text, kind, value", [
    ("2024-03-01T00:00:00Z", BoundKind.TIME, 1709251200000),
    ("2024-03-01T01:00:00+01:00", BoundKind.TIME, 1709251200000),
    ("2024-03-01T00:00:00", BoundKind.TIME, 1709251200000),  # no zone = UTC
    ("1709251200000", BoundKind.TIME, 1709251200000),
    ("5000ms", BoundKind.TIME, 5000),
    ("1500", BoundKind.OFFSET, 1500),
])
def test_bounds_parse_times_and_offsets(text, kind, value):
    bound = parse_bound(text, "--from")
    assert (bound.kind, bound.value, bound.text) == (kind, value, text)


def test_per_partition_and_symbolic_bounds():
    assert parse_bound("0:10, 2:30", "--from").offsets == ((0, 10), (2, 30))
    assert parse_bound("earliest", "--from").kind is BoundKind.EARLIEST
    assert parse_bound("now", "--to").kind is BoundKind.NOW


@pytest.mark.parametrize("text, what, message", [
    ("yesterday", "--from", "cannot read 'yesterday'"),
    ("now", "--from", "only valid for --to"),
    ("earliest", "--to", "only valid for --from"),
    ("0:1,0:2", "--from", "names a partition twice"),
])
def test_bad_bounds_say_what_is_accepted(text, what, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_bound(text, what)


def test_plan_round_trips_and_names_conflicts():
    plan = BackfillPlan("j", "m", "1.0.0", "src", "out", "out.dlq", "earliest", "now",
                        (PartitionRange(0, 3, 9), PartitionRange(1, 5, 5)), 123)
    assert BackfillPlan.from_json(plan.to_json()) == plan
    assert plan.total == 6
    assert plan.conflicts(version="1.0.0", range_to=None) == []
    assert plan.conflicts(version="2.0.0") == ["version: stored '1.0.0', asked '2.0.0'"]


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_rate_limiter_grants_rate_per_second_with_a_small_burst():
    clock = FakeClock()
    limiter = RateLimiter(50, clock)
    assert limiter.take(500) == 10  # burst = 1/5 s of rate
    assert limiter.take(500) == 0 and limiter.wait_s() == pytest.approx(0.02)
    granted = 0
    for _ in range(100):  # one second in 10 ms steps
        clock.t += 0.01
        granted += limiter.take(500)
    assert 49 <= granted <= 51
    limiter.refund(5)
    assert limiter.take(500) == 5
    assert RateLimiter(None, clock).take(500) == 500


def test_live_lag_gate_pauses_above_the_limit_and_resumes_below_half():
    clock = FakeClock()
    lags = iter([50, 150, 120, 80, 40, None, 200])
    gate = LiveLagGate(lambda: next(lags), max_lag=100, interval_s=1.0, clock=clock)
    seen = []
    for _ in range(7):
        seen.append(gate.blocked())
        assert gate.blocked() == seen[-1]  # within the interval: no new query, same answer
        clock.t += 1.0
    assert seen == [False, True, True, True, False, False, True]
    assert gate.pauses == 2
    assert LiveLagGate(lambda: 10**9, max_lag=None).blocked() is False


# --- Kafka ------------------------------------------------------------------------------------------------
def produce_timed(settings, topic: str, n: int, partitions: int, start: int = 0, poison: dict[int, bytes] | None = None):
    """Request i at timestamp BASE_MS + i s on partition i % partitions (timestamps ascend per partition)."""
    producer = Producer(settings.kafka_client_config(**{"acks": "all", "enable.idempotence": True}))
    for i in range(start, start + n):
        value = (poison or {}).get(i) or orjson.dumps({"id": f"r{i}", "inputs": {"x": float(i)}})
        producer.produce(topic, value, f"k{i}".encode(), i % partitions, timestamp=BASE_MS + i * 1000)
    assert producer.flush(30) == 0


def keep_forever(settings, topic: str, partitions: int) -> None:
    """Create a request topic whose records are never deleted by time.

    The records carry business timestamps from 2023 (BASE_MS); under the default 7-day retention the
    broker's retention check (every 5 minutes) would delete them mid-test. It did, in CI.
    """
    create_topic(settings, topic, partitions=partitions, config={"retention.ms": "-1"})


def make_spec(settings, partitions: int = 3):
    spec = echo_spec()
    t = spec.topics
    keep_forever(settings, t.requests, partitions)
    ensure_model_topics(settings, [t.requests, t.results, t.dead_letters], partitions)
    return spec


def run_job(settings, spec, job_id: str, start: str | None, end: str | None, **kw):
    config = BackfillConfig(settings=settings, spec=spec, job_id=job_id,
                            start=parse_bound(start, "--from") if start else None,
                            end=parse_bound(end, "--to") if end else None, progress_interval_s=0.5, **kw)
    lines: list[str] = []
    job = BackfillJob(config, progress=lines.append)
    return job.run(threading.Event(), load_echo_backend(spec)), lines


def commit_live(settings, spec, offsets: dict[int, int]) -> None:
    consumer = Consumer(settings.kafka_client_config(**{"group.id": spec.group_id, "enable.auto.commit": False}))
    consumer.commit(offsets=[TopicPartition(spec.topics.requests, p, o) for p, o in offsets.items()],
                    asynchronous=False)
    consumer.close()


def live_offsets(settings, spec, partitions: int) -> dict[int, int]:
    consumer = Consumer(settings.kafka_client_config(**{"group.id": spec.group_id, "enable.auto.commit": False}))
    try:
        tps = consumer.committed([TopicPartition(spec.topics.requests, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        consumer.close()


def test_time_range_scores_exactly_the_records_in_range_once_and_reruns_are_idempotent(kafka_settings):
    spec = make_spec(kafka_settings)
    poison = {15: b"{broken", 16: orjson.dumps({"id": "bad-types", "inputs": {"x": "abc"}})}
    produce_timed(kafka_settings, spec.topics.requests, 60, 3, poison=poison)
    commit_live(kafka_settings, spec, {0: 4, 1: 7, 2: 20})  # a live scorer's progress, to be left alone
    start, end = str(BASE_MS + 10_000), "2023-11-14T22:14:00Z"  # [r10, r40): 40 s after BASE_MS
    assert parse_bound(end, "--to").value == BASE_MS + 40_000

    report, lines = run_job(kafka_settings, spec, f"t-{uuid.uuid4().hex[:6]}", start, end)
    assert report.complete and report.total == 30 and report.already_done == 0
    assert report.scored == 28 and report.dead_letters == {"invalid_json": 1, "schema_violation": 1}
    # the job has finished: the end of its sink is final, and consume_all reads to it (a 29th record comes too)
    results = consume_all(kafka_settings, spec.topics.backfill, expected=28, timeout=30)
    keys = Counter(r.key for r in results)
    expected_ids = {f"r{i}" for i in range(10, 40)} - {"r15", "r16"}
    assert set(keys) == {f"{i}:1.0.0".encode() for i in expected_ids} and max(keys.values()) == 1
    for r in results:
        doc = orjson.loads(r.value)
        assert doc["outputs"] == {"y": 2 * float(doc["id"][1:])} and doc["version"] == "1.0.0"
        assert doc["timings"]["queue_ms"] == 0.0 and r.headers["sie.backfill.job"]
    dead = consume_all(kafka_settings, Names.backfill_dead_letter_topic(spec.topics.backfill), expected=2, timeout=20)
    assert sorted(d.headers["sie.reason"] for d in dead) == [b"invalid_json", b"schema_violation"]
    assert sorted(d.value for d in dead) == sorted(poison.values())  # original bytes
    assert consume_all(kafka_settings, spec.topics.results) == []  # live results untouched (read to the end)
    assert "final: 30/30 (100.0%)" in lines[-1] and "partition 2: 10/10 (100.0%)" in lines[-1]

    # a second job over the same range writes the same keys (upsert, not duplicate, in a compacted sink)
    again, _ = run_job(kafka_settings, spec, f"t-{uuid.uuid4().hex[:6]}", start, end)
    assert again.scored == 28
    second = consume_all(kafka_settings, spec.topics.backfill, expected=56, timeout=30)
    assert Counter(r.key for r in second) == Counter({k: 2 for k in keys})
    # re-running a finished job does nothing
    same_job, _ = run_job(kafka_settings, spec, report.job_id, None, None)
    assert same_job.complete and same_job.scored == 0 and same_job.already_done == 30

    assert live_offsets(kafka_settings, spec, 3) == {0: 4, 1: 7, 2: 20}  # live group never touched


def test_offset_bounds_per_partition_and_now(kafka_settings):
    spec = make_spec(kafka_settings, partitions=2)
    produce_timed(kafka_settings, spec.topics.requests, 20, 2)  # 10 per partition
    report, _ = run_job(kafka_settings, spec, f"o-{uuid.uuid4().hex[:6]}", "0:2,1:8", "now")
    assert report.complete and report.total == (10 - 2) + (10 - 8)
    results = consume_all(kafka_settings, spec.topics.backfill, expected=10)
    ids = {orjson.loads(r.value)["id"] for r in results}
    assert len(results) == 10 and ids == {f"r{2 * j}" for j in range(2, 10)} | {f"r{2 * j + 1}" for j in range(8, 10)}
    with pytest.raises(ConfigError, match="no partition"):
        run_job(kafka_settings, spec, f"o-{uuid.uuid4().hex[:6]}", "5:1", "now")


def test_backfill_yields_while_the_live_group_lags(kafka_settings):
    spec = make_spec(kafka_settings, partitions=1)
    produce_timed(kafka_settings, spec.topics.requests, 40, 1)
    commit_live(kafka_settings, spec, {0: 0})  # live scorer 40 records behind
    config = BackfillConfig(settings=kafka_settings, spec=spec, job_id=f"y-{uuid.uuid4().hex[:6]}",
                            start=parse_bound("earliest", "--from"), end=parse_bound("now", "--to"),
                            max_live_lag=10, lag_interval_s=0.1)
    job = BackfillJob(config, progress=lambda _line: None)
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("r", job.run(threading.Event(), load_echo_backend(spec))),
                              daemon=True)
    thread.start()
    wait_until(lambda: job.live_gate is not None and job.live_gate.blocked_now, 20, message="the backfill to pause")
    assert job.progress()[0].done == 0
    commit_live(kafka_settings, spec, {0: 40})  # live caught up
    thread.join(30)
    report = box["r"]
    assert report.complete and report.scored == 40 and report.live_pauses == 1


def _backfill_cli(spec_path: Path, bootstrap: str, job_id: str, log: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sie", "--bootstrap-servers", bootstrap, "backfill", "--spec", str(spec_path),
         "--job-id", job_id, "--progress-interval", "0.2", "--max-batch", "50", *extra],
        cwd=REPO, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "SIE_ALLOWED_MODULES": ",".join(ALLOWED_MODULES)})


def _done(log: Path) -> int:
    found = re.findall(r"progress: (\d+)/\d+", log.read_text())
    return int(found[-1]) if found else 0


def test_sigkill_mid_range_then_resume_gives_exactly_one_result_per_record(kafka_settings, bootstrap_servers,
                                                                          tmp_path):
    spec_path = write_echo_spec(tmp_path)
    from sie.schemas.spec import load

    spec = load(spec_path)
    keep_forever(kafka_settings, spec.topics.requests, 2)
    n = 600
    produce_timed(kafka_settings, spec.topics.requests, n, 2)
    job_id = f"kill-{uuid.uuid4().hex[:6]}"
    log = tmp_path / "backfill.log"
    proc = _backfill_cli(spec_path, bootstrap_servers, job_id, log, "--from", "earliest", "--to", "now",
                         "--rate", "100")
    try:
        wait_until(lambda: _done(log) >= 120 or proc.poll() is not None, 60, message="backfill progress")
        assert proc.poll() is None, log.read_text()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert _done(log) < n, "killed too late to prove anything"
    produce_timed(kafka_settings, spec.topics.requests, 50, 2, start=n)  # after the plan: not part of the job
    proc = _backfill_cli(spec_path, bootstrap_servers, job_id, log)
    assert proc.wait(60) == 0, log.read_text()
    out = log.read_text()
    assert "complete" in out and f"range: {n} offsets; already done before this run: " in out
    assert int(re.search(r"already done before this run: (\d+)", out).group(1)) > 0

    reader = CommittedReader(kafka_settings, spec.topics.backfill)
    try:
        wait_until(lambda: reader.count() >= n, 90,
                   message=lambda: f"all {n} results (read_committed sees {len(reader.records)}); job log:\n{out}")
        reader.read_to_end()  # the job finished: its end is final, a duplicate past the n-th is counted
    finally:
        reader.close()
    ids = Counter(orjson.loads(m.value())["id"] for m in reader.records)
    assert set(ids) == {f"r{i}" for i in range(n)}  # exactly the planned range, not the 50 added later
    assert max(ids.values()) == 1  # zero duplicates for read_committed readers
