"""The one rule for every transaction outcome SIE cannot know (issue 35), against fake clients.

A ``send_offsets_to_transaction``, ``commit_transaction`` or ``abort_transaction`` that timed out, was refused,
hung past the watchdog or ended with an unclassified error is never aborted and re-sent: the producer is
re-created (``init_transactions`` settles the transaction at the coordinator) and the consumer's positions are
set from the committed offsets read back from the broker.  Each test is a row of the table in
docs/reliability.md; each checks every record committed exactly once (``FakeProducer.visible``).

The fakes model what librdkafka and the coordinator do where the rule depends on it: a commit whose answer was
lost is committed at the coordinator (its records visible, its offsets committed) while every further call of
that producer fails; an abort after it is refused.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

import pytest
from confluent_kafka import OFFSET_INVALID, KafkaError, TopicPartition

from sie.streams.eos import BatchStatus, EosLimits, ExactlyOnce, Fenced, Output, Prepared
from sie.streams.eos.errors import OutcomeUnknown, ProducerHung
from sie.streams.eos.transaction import TransactionalProducer, rewind
from tests.fakes.kafka_clients import FakeConsumer, FakeMessage, FakeProducer, kafka_error

TOPIC, OUT = "in", "out"
TIMED_OUT = KafkaError._TIMED_OUT


def records(n: int) -> list[FakeMessage]:
    return [FakeMessage(TOPIC, 0, i, f"k{i}".encode(), f"v{i}".encode()) for i in range(n)]


def echo(batch: list[Any]) -> Prepared[int]:
    return Prepared([Output(OUT, m.value(), m.key(), source=m, kind="result") for m in batch], len(batch))


class AnswerLost(FakeProducer):
    """``commit_transaction`` reaches the coordinator, which commits, but its answer never comes back: the
    call times out (retriable), and so does every retry; librdkafka refuses an abort in that state."""

    def commit_transaction(self, timeout: float | None = None) -> None:
        if self.in_transaction:  # the coordinator committed it (records visible, offsets committed)
            super().commit_transaction(timeout)
        else:
            self._call("commit_transaction")
        raise kafka_error(TIMED_OUT, "Failed to commit transaction: Local: Timed out", retriable=True)

    def abort_transaction(self, timeout: float | None = None) -> None:
        self._call("abort_transaction")
        raise kafka_error(KafkaError._STATE, "Operation not valid in state CommitNotAcked")


def cycle(consumer: FakeConsumer, first: type[FakeProducer] = FakeProducer, faults: dict[str, Any] | None = None,
          limits: EosLimits = EosLimits(backoff_s=0.0), hang_limit_s: float = 25.0,
          ) -> tuple[ExactlyOnce, list[FakeProducer]]:
    """A cycle whose first producer is ``first(faults)``; re-created producers are healthy fakes."""
    producers: list[FakeProducer] = []

    def make(_config: dict[str, Any]) -> FakeProducer:
        kind = first if not producers else FakeProducer
        producers.append(kind(faults if not producers else None, consumer=consumer))
        return producers[-1]

    stop = threading.Event()
    producer = TransactionalProducer({"transactional.id": "t"}, make, 3, 0.0, stop, hang_limit_s)
    assert producer.start()
    return ExactlyOnce(producer, consumer, stop, limits), producers


def run_all(eos: ExactlyOnce, consumer: FakeConsumer, n: int, rounds: int = 10) -> list[BatchStatus]:
    """Batches of up to 5 until every one of ``n`` records is committed (or ``rounds`` batches ran)."""
    statuses = []
    for _ in range(rounds):
        if consumer.committed_offsets.get((TOPIC, 0), 0) >= n:
            break
        batch = consumer.consume(5, 0.2)
        if batch:
            statuses.append(eos.run_batch(batch, echo)[0])
    return statuses


def visible_values(producers: list[FakeProducer]) -> list[bytes | None]:
    return [r.value for p in producers for r in p.visible]


def assert_exactly_once(producers: list[FakeProducer], n: int) -> None:
    assert sorted(visible_values(producers), key=lambda v: int((v or b"v-1")[1:])) == [
        f"v{i}".encode() for i in range(n)], "every record committed exactly once"


def started(n: int = 10) -> FakeConsumer:
    consumer = FakeConsumer(records(n))
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    return consumer


def test_a_commit_whose_answer_was_lost_is_never_aborted_the_producer_is_recreated_and_nothing_is_scored_twice():
    """EndTxn reached the coordinator, the answer was lost: the batch committed although every call timed out.
    The old code aborted it (refused: the coordinator was committing) before re-creating the producer."""
    consumer = started()
    eos, producers = cycle(consumer, AnswerLost)
    statuses = run_all(eos, consumer, 10)
    assert statuses[0] is BatchStatus.PRODUCER_RESTARTED and statuses[1:] == [BatchStatus.COMMITTED]
    assert producers[0].aborts == 0, "what may have committed is never aborted"
    assert len(producers) == 2 and producers[1].called("init_transactions")
    assert consumer.called("committed") and consumer.called("seek")[-1].args == (TOPIC, 0, 5)  # from the broker
    assert_exactly_once(producers, 10)
    assert eos.producer_restarts == 1 and eos.aborts == 0


@pytest.mark.parametrize(("call", "error"), [
    ("send_offsets_to_transaction", kafka_error(TIMED_OUT, "Local: Timed out", retriable=True)),
    ("send_offsets_to_transaction", kafka_error(KafkaError.INVALID_TXN_STATE, "refused")),
    ("commit_transaction", kafka_error(TIMED_OUT, "Local: Timed out", retriable=True)),
    ("commit_transaction", kafka_error(KafkaError.INVALID_TXN_STATE, "refused")),
    ("commit_transaction", kafka_error(KafkaError._FAIL, "unclassified")),
], ids=["send_offsets-timed-out", "send_offsets-refused", "commit-timed-out", "commit-refused", "commit-unclassified"])
def test_every_unknown_outcome_of_a_commit_step_recreates_the_producer_and_resumes_from_the_committed_offsets(
        call, error):
    consumer = started()
    eos, producers = cycle(consumer, faults={call: [error] * 3})  # more than the retries of a retriable error
    statuses = run_all(eos, consumer, 10)
    assert statuses == [BatchStatus.PRODUCER_RESTARTED, BatchStatus.COMMITTED, BatchStatus.COMMITTED]
    assert producers[0].aborts == 0 and len(producers) == 2
    assert consumer.called("seek")[-1].args == (TOPIC, 0, 0)  # nothing committed: the broker says 0
    assert_exactly_once(producers, 10)


def test_a_retriable_error_is_retried_in_place_and_is_not_an_unknown_outcome():
    consumer = started()
    eos, producers = cycle(consumer, faults={"commit_transaction": [kafka_error(TIMED_OUT, retriable=True)]})
    assert run_all(eos, consumer, 10) == [BatchStatus.COMMITTED, BatchStatus.COMMITTED]
    assert len(producers) == 1 and producers[0].aborts == 0
    assert_exactly_once(producers, 10)


def test_an_abortable_error_is_aborted_and_read_again_from_the_committed_offsets():
    consumer = started()
    abortable = kafka_error(KafkaError._STATE, "message timed out", txn_requires_abort=True)
    eos, producers = cycle(consumer, faults={"commit_transaction": [abortable]})
    assert run_all(eos, consumer, 10) == [BatchStatus.ABORTED, BatchStatus.COMMITTED, BatchStatus.COMMITTED]
    assert producers[0].aborts == 1 and len(producers) == 1
    assert_exactly_once(producers, 10)


@pytest.mark.parametrize("abort_error", [
    kafka_error(KafkaError.INVALID_TXN_STATE, "Producer attempted a transactional operation in an invalid state"),
    kafka_error(TIMED_OUT, "Local: Timed out", retriable=True),
    kafka_error(KafkaError._FENCED, "fenced", fatal=True),
], ids=["refused", "timed-out", "fatal"])
def test_an_abort_that_fails_in_any_way_is_an_unknown_outcome(abort_error):
    """The campaign's sequence (issue 35): a message timed out (abortable), the abort was refused."""
    consumer = started()
    abortable = kafka_error(KafkaError._MSG_TIMED_OUT, "1 message(s) timed out", txn_requires_abort=True)
    eos, producers = cycle(consumer, faults={"commit_transaction": [abortable],
                                             "abort_transaction": [abort_error] * 3})
    assert run_all(eos, consumer, 10) == [BatchStatus.PRODUCER_RESTARTED, BatchStatus.COMMITTED,
                                          BatchStatus.COMMITTED]
    assert len(producers) == 2 and consumer.called("seek")[-1].args == (TOPIC, 0, 0)
    assert_exactly_once(producers, 10)
    with pytest.raises(OutcomeUnknown):  # what the layer raises for it
        _abort_with(abort_error)


def _abort_with(error: Any) -> None:
    producer = TransactionalProducer({"transactional.id": "t"}, lambda _c: FakeProducer({"abort_transaction": error}),
                                     1, 0.0, threading.Event())
    assert producer.start()
    producer.abort()


def test_a_hung_commit_is_an_unknown_outcome():
    release = threading.Event()

    class Hangs(FakeProducer):
        def commit_transaction(self, timeout: float | None = None) -> None:
            release.wait(30)

    consumer = started()
    try:
        eos, producers = cycle(consumer, Hangs, hang_limit_s=0.3)
        assert run_all(eos, consumer, 10) == [BatchStatus.PRODUCER_RESTARTED, BatchStatus.COMMITTED,
                                              BatchStatus.COMMITTED]
        assert producers[0].aborts == 0 and issubclass(ProducerHung, OutcomeUnknown)
        assert_exactly_once(producers, 10)
    finally:
        release.set()


def test_unknown_outcomes_in_a_row_are_not_taken_for_a_second_live_process():
    consumer = started()
    limits = EosLimits(backoff_s=0.0, fatal_limit=2)
    timeouts = [kafka_error(TIMED_OUT, retriable=True)] * 3
    producers: list[FakeProducer] = []

    def make(_config: dict[str, Any]) -> FakeProducer:  # the first three producers' commits all time out
        producers.append(FakeProducer({"commit_transaction": list(timeouts)} if len(producers) < 3 else None,
                                      consumer=consumer))
        return producers[-1]

    stop = threading.Event()
    producer = TransactionalProducer({"transactional.id": "t"}, make, 3, 0.0, stop)
    assert producer.start()
    eos = ExactlyOnce(producer, consumer, stop, limits)
    statuses = run_all(eos, consumer, 10)  # no Fenced although 3 > fatal_limit
    assert statuses[:3] == [BatchStatus.PRODUCER_RESTARTED] * 3
    assert_exactly_once(producers, 10)
    fatal = kafka_error(KafkaError._FENCED, "fenced", fatal=True)
    consumer2 = started()
    eos2, _ = cycle(consumer2, faults={"commit_transaction": [fatal]}, limits=EosLimits(backoff_s=0.0, fatal_limit=1))
    with pytest.raises(Fenced):  # a fatal error still counts
        run_all(eos2, consumer2, 10)


class Answer(NamedTuple):
    """What ``Consumer.committed`` returns per partition (a TopicPartition's fields the rewind reads)."""

    topic: str
    partition: int
    offset: int
    error: Any = None


class CoordinatorMoving(FakeConsumer):
    """The group coordinator answers the first ``committed()`` with a per-partition error (it is moving, or the
    offset is still pending in a transaction that is completing); the next answer is the real offset."""

    def __init__(self, *args: Any, errors: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.errors = errors

    def committed(self, partitions: list[TopicPartition], timeout: float | None = None) -> list[Any]:
        answer = super().committed(partitions, timeout)
        if self.errors:
            self.errors -= 1
            return [Answer(tp.topic, tp.partition, OFFSET_INVALID, KafkaError(KafkaError.NOT_COORDINATOR))
                    for tp in answer]
        return [Answer(tp.topic, tp.partition, tp.offset) for tp in answer]


def test_a_partition_the_broker_answers_with_an_error_is_asked_again_never_guessed_from_memory():
    """The old rewind took an errored partition's OFFSET_INVALID for "never committed" and sought back to the
    batch's first offset: a batch whose transaction committed was scored again (a duplicate)."""
    consumer = CoordinatorMoving(records(10), committed={(TOPIC, 0): 5})
    consumer.assign([TopicPartition(TOPIC, 0, 5)])
    assert rewind(consumer, {(TOPIC, 0): 0}, threading.Event(), backoff_s=0.0)
    assert len(consumer.called("committed")) == 2
    assert consumer.called("seek")[-1].args == (TOPIC, 0, 5)


def test_a_commit_answer_lost_while_the_coordinator_moves_is_still_exactly_once():
    """Both at once: the commit's answer is lost, and the first read of the committed offsets errs."""
    consumer = CoordinatorMoving(records(10), errors=1)
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    eos, producers = cycle(consumer, AnswerLost)
    run_all(eos, consumer, 10)
    assert_exactly_once(producers, 10)


def test_a_partition_never_committed_falls_back_to_the_batch_s_first_offset():
    consumer = FakeConsumer(records(10))
    consumer.assign([TopicPartition(TOPIC, 0, 3)])
    assert rewind(consumer, {(TOPIC, 0): 3}, threading.Event(), backoff_s=0.0)
    assert consumer.called("seek")[-1].args == (TOPIC, 0, 3)


def test_pipelined_an_unknown_outcome_discards_the_batch_prepared_meanwhile_and_reads_both_from_the_broker():
    """Pipelined commits: commit N's answer is lost (it committed) while batch N+1 was prepared; N+1 is discarded,
    the producer re-created, and both batches' partition resumes from the offset the broker has: N is not
    scored again, N+1 is scored once."""
    consumer = started()
    eos, producers = cycle(consumer, AnswerLost)
    assert eos.start_batch(consumer.consume(5, 0.2), echo) == []  # commit N in flight
    outcomes = eos.start_batch(consumer.consume(5, 0.2), echo)
    assert [o.status for o in outcomes] == [BatchStatus.PRODUCER_RESTARTED, BatchStatus.DISCARDED]
    assert producers[0].aborts == 0 and consumer.called("seek")[-1].args == (TOPIC, 0, 5)
    outcomes = eos.start_batch(consumer.consume(5, 0.2), echo) + eos.settle()
    assert [o.status for o in outcomes] == [BatchStatus.COMMITTED]
    assert_exactly_once(producers, 10)
