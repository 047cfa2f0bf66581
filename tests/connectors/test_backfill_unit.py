"""``BackfillJob`` end to end against fake Kafka clients (no broker): plan, resume, range ends, result keys,
dead letters and an aborted batch, through the real exactly-once cycle.

Every client the job makes (plan reader and writer, range probe, admin, consumer, transactional producer)
comes from the ``KafkaClients`` it is given; a client the test did not expect fails the test.  The same
job on a real broker (time ranges, SIGKILL + resume, live lag): test_backfill.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
from confluent_kafka import KafkaError

from sie.connectors.backfill import BackfillConfig, BackfillJob, BackfillReport
from sie.connectors.backfill_plan import BackfillPlan, PartitionRange, parse_bound
from sie.kernel.settings import Settings
from sie.streams.eos import EosLimits
from tests.fakes.kafka_clients import (
    FakeAdmin,
    FakeClients,
    FakeConsumer,
    FakeMessage,
    FakeProducer,
    fake_clients,
    kafka_error,
)
from tests.support.scorer_fixtures import POISON_X, echo_spec, load_echo_backend

SETTINGS = Settings()
NAMES = SETTINGS.names
JOB = "j1"
SPEC = echo_spec("echo-backfill")
SRC = SPEC.topics.requests
OUT = SPEC.topics.backfill
DLQ = NAMES.backfill_dead_letter_topic(OUT)
PLANS = NAMES.system_topic("backfill-plans")
RUN_LIMIT_S = 20.0


def request(p: int, o: int) -> bytes:
    return orjson.dumps({"id": f"p{p}-o{o}", "inputs": {"x": float(10 * p + o)}})


def source(per_partition: dict[int, int], poison: dict[tuple[int, int], bytes] | None = None) -> list[FakeMessage]:
    """``count`` requests on each partition; ``poison`` replaces some of them."""
    return [FakeMessage(SRC, p, o, f"k{p}-{o}".encode(), (poison or {}).get((p, o)) or request(p, o))
            for p, count in per_partition.items() for o in range(count)]


class Job:
    """The job's clients, routed by the role each config names in its client id."""

    def __init__(self, records: list[FakeMessage], *, stored: BackfillPlan | None = None,
                 committed: dict[tuple[str, int], int] | None = None, faults: dict[str, Any] | None = None,
                 refetch_gap: int = 0, **config: Any) -> None:
        partitions = {SRC: 1 + max(m.partition() for m in records)}
        self.plans = FakeConsumer([FakeMessage(PLANS, 0, 0, JOB.encode(), stored.to_json())] if stored else [],
                                  partitions={PLANS: 1})
        self.probe = FakeConsumer(records, partitions=partitions)
        self.consumer = FakeConsumer(records, partitions=partitions, committed=committed, refetch_gap=refetch_gap)
        self.producer = FakeProducer(faults, consumer=self.consumer)
        self.plan_writer = FakeProducer()
        self.admin = FakeAdmin({SRC: partitions[SRC]})
        roles = {"plan-reader": self.plans, "probe": self.probe, "consumer": self.consumer,
                 "plan-writer": self.plan_writer}
        self.fakes: FakeClients = fake_clients(
            consumer=lambda cfg: roles[cfg["client.id"].rsplit(".", 1)[1]],
            producer=lambda cfg: self.producer if "transactional.id" in cfg else roles[cfg["client.id"].rsplit(".", 1)[1]],
            admin=self.admin)
        self.lines: list[str] = []
        self.job = BackfillJob(BackfillConfig(settings=SETTINGS, spec=SPEC, job_id=JOB, max_batch=50, poll_timeout_ms=20,
                                              limits=EosLimits(attempts=2, backoff_s=0.001), **config),
                               progress=self.lines.append, clients=self.fakes.clients)

    def run(self) -> BackfillReport:
        with stop_after(RUN_LIMIT_S) as stop:
            report = self.job.run(stop, load_echo_backend(SPEC))
        assert not stop.is_set(), f"the job did not finish within {RUN_LIMIT_S}s: {self.lines[-1:]}"
        return report

    def results(self) -> dict[bytes, dict[str, Any]]:
        return {r.key: orjson.loads(r.value) for r in self.producer.visible if r.topic == OUT}

    def dead_letters(self) -> list[Any]:
        return [r for r in self.producer.visible if r.topic == DLQ]


@contextmanager
def stop_after(seconds: float) -> Iterator[threading.Event]:
    """A stop event that a timer sets: a job that would never finish ends, and the test says so."""
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    try:
        yield stop
    finally:
        timer.cancel()


def test_a_new_job_stores_its_plan_then_scores_the_range_once_with_keys_id_version_and_dead_letters_poison():
    poison = {(0, 2): b"{broken", (1, 3): orjson.dumps({"id": "poison", "inputs": {"x": POISON_X}})}
    j = Job(source({0: 6, 1: 6}, poison), start=parse_bound("earliest", "--from"), end=parse_bound("now", "--to"))
    report = j.run()

    (stored,) = j.plan_writer.visible  # stored before anything was scored
    assert stored.topic == PLANS and stored.key == JOB.encode()
    assert BackfillPlan.from_json(stored.value).ranges == (PartitionRange(0, 0, 6), PartitionRange(1, 0, 6))
    assert j.plan_writer.calls[-1].name == "flush" and j.plan_writer.calls[-1].seq < j.producer.calls[0].seq

    assert report.complete and report.total == 12 and report.already_done == 0 and report.aborts == 0
    assert report.scored == 10 and report.dead_letters == {"invalid_json": 1, "inference_error": 1}
    results = j.results()
    ids = {f"p{p}-o{o}" for p in (0, 1) for o in range(6)} - {"p0-o2", "p1-o3"}
    assert set(results) == {f"{i}:{SPEC.version}".encode() for i in ids}  # a re-run upserts, never adds
    assert results[b"p1-o4:1.0.0"]["outputs"] == {"y": 28.0} and results[b"p1-o4:1.0.0"]["timings"]["queue_ms"] == 0.0
    assert all(dict(r.headers)["sie.backfill.job"] == JOB.encode() for r in j.producer.visible if r.topic == OUT)
    dead = {dict(r.headers)["sie.reason"]: r for r in j.dead_letters()}
    assert set(dead) == {b"invalid_json", b"inference_error"}
    assert dead[b"invalid_json"].value == b"{broken"  # the original bytes, to replay after a fix
    assert dict(dead[b"inference_error"].headers)["sie.source.offset"] == b"3"
    assert j.consumer.committed_offsets == {(SRC, 0): 6, (SRC, 1): 6}

    (consumer_cfg,) = [c for c in j.fakes.of("consumer") if c["client.id"] == NAMES.backfill_client_id(JOB, "consumer")]
    assert consumer_cfg["group.id"] == NAMES.backfill_group(JOB) != SPEC.group_id  # never the live group
    assert consumer_cfg["isolation.level"] == "read_committed" and consumer_cfg["enable.auto.commit"] is False
    (txn_cfg,) = [c for c in j.fakes.of("producer") if "transactional.id" in c]
    assert txn_cfg["transactional.id"] == NAMES.backfill_transactional_id(JOB)
    assert {t for c in j.admin.called("create_topics") for t in c.args[0]} == {PLANS, OUT, DLQ}
    asked = [c.args[0] for c in j.admin.called("list_consumer_group_offsets")]
    assert asked and all(groups == [SPEC.group_id] for groups in asked)  # the live group is only read


def test_a_resumed_job_starts_at_the_committed_offsets_and_stops_at_the_stored_end_per_partition():
    plan = BackfillPlan(JOB, SPEC.name, SPEC.version, SRC, OUT, DLQ, "2", "5",
                        (PartitionRange(0, 0, 6), PartitionRange(1, 2, 5), PartitionRange(2, 0, 3)), 0)
    # the topic grew since the plan was made: records past each end are not part of the job
    j = Job(source({0: 10, 1: 10, 2: 10}), stored=plan, committed={(SRC, 0): 4, (SRC, 2): 3})
    report = j.run()

    assert j.probe.calls == [] and j.plan_writer.calls == []  # the stored range is used as it is
    (assigned,) = [c.args[0] for c in j.consumer.called("assign")]
    assert assigned == [(SRC, 0, 4), (SRC, 1, 2)]  # partition 2 was finished by the earlier run
    assert report.complete and report.total == 6 + 3 + 3 and report.already_done == 4 + 0 + 3
    assert report.scored == 5
    assert {r["id"] for r in j.results().values()} == {"p0-o4", "p0-o5", "p1-o2", "p1-o3", "p1-o4"}
    assert j.consumer.committed_offsets == {(SRC, 0): 6, (SRC, 1): 5, (SRC, 2): 3}
    paused = {(t, p) for c in j.consumer.called("pause") for t, p in c.args[0]}
    assert {(SRC, 0), (SRC, 1)} <= paused  # fetching stops at each end
    assert "final: 12/12 (100.0%)" in j.lines[-1]


def test_an_aborted_batch_is_read_again_not_taken_for_the_end_of_the_range():
    """After the abort the consumer is sought back but position() still reports the offset after the batch,
    and the first fetch after the seek brings nothing: the job must not declare the partition done."""
    j = Job(source({0: 3}), start=parse_bound("earliest", "--from"), end=parse_bound("now", "--to"),
            faults={"commit_transaction": [kafka_error(KafkaError._STATE, "abortable", txn_requires_abort=True)]},
            refetch_gap=1)
    report = j.run()
    assert [c.args[1:] for c in j.consumer.called("seek")] == [(0, 0)]  # back to the start: nothing committed
    assert report.complete and report.aborts == 1 and report.scored == 3
    assert sorted(r["id"] for r in j.results().values()) == ["p0-o0", "p0-o1", "p0-o2"]
    assert len(j.producer.visible) == 3  # the aborted batch's outputs never became visible
    assert j.consumer.committed_offsets == {(SRC, 0): 3}
