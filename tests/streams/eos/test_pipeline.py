"""Pipelined commits (sie.streams.eos.cycle / stage), against fake clients: the rules that keep them exactly once.

* one open transaction: batch N+1 begins only after commit N settled;
* a failed commit discards the batch prepared meanwhile and rewinds both: every record comes again, once;
* a rebalance callback returns only after the in-flight commit finished;
* a stop request commits the batch in flight before the loop returns.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError, TopicPartition

from sie.streams.eos import (
    BatchStatus,
    EosLimits,
    ExactlyOnce,
    Output,
    Prepared,
    StageSettings,
    StopRequest,
    StreamLoop,
)
from sie.streams.eos.transaction import TransactionalProducer
from tests.fakes.kafka_clients import FakeConsumer, FakeMessage, FakeProducer, fake_clients, kafka_error

TOPIC, OUT = "in", "out"


def records(n: int, partition: int = 0) -> list[FakeMessage]:
    return [FakeMessage(TOPIC, partition, i, f"k{i}".encode(), f"v{i}".encode()) for i in range(n)]


def echo(batch: list[Any]) -> Prepared[int]:
    return Prepared([Output(OUT, m.value(), m.key(), source=m, kind="result") for m in batch], len(batch))


def cycle(consumer: FakeConsumer, faults: dict[str, Any] | None = None) -> tuple[ExactlyOnce, list[FakeProducer]]:
    producers: list[FakeProducer] = []

    def make(_config: dict[str, Any]) -> FakeProducer:
        producers.append(FakeProducer(faults, consumer=consumer))
        return producers[-1]

    stop = threading.Event()
    producer = TransactionalProducer({"transactional.id": "t"}, make, 3, 0.0, stop)
    assert producer.start()
    return ExactlyOnce(producer, consumer, stop, EosLimits(backoff_s=0.0)), producers


def values(producers: list[FakeProducer]) -> list[bytes | None]:
    return [r.value for p in producers for r in p.visible]


def test_a_failed_commit_discards_the_batch_prepared_meanwhile_and_both_come_again():
    consumer = FakeConsumer(records(10))
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    eos, producers = cycle(consumer, {"commit_transaction": [kafka_error(KafkaError._STATE, txn_requires_abort=True)]})
    prepared: list[int] = []

    def prepare(batch: list[Any]) -> Prepared[int]:
        prepared.append(len(batch))
        return echo(batch)

    assert eos.start_batch(consumer.consume(5, 0), prepare) == []  # commit 1 in flight
    outcomes = eos.start_batch(consumer.consume(5, 0), prepare)  # prepared while commit 1 ran; commit 1 fails
    assert [o.status for o in outcomes] == [BatchStatus.ABORTED, BatchStatus.DISCARDED]
    assert prepared == [5, 5] and len(producers[0].called("produce")) == 5  # nothing of batch 2 was produced
    assert consumer.called("seek")[-1].args == (TOPIC, 0, 0)  # both batches' partition back to the committed offset
    outcomes = eos.start_batch(consumer.consume(10, 0), prepare) + eos.settle()
    assert [o.status for o in outcomes] == [BatchStatus.COMMITTED]
    assert values(producers) == [f"v{i}".encode() for i in range(10)]  # each record once, in order
    assert consumer.committed_offsets[(TOPIC, 0)] == 10 and eos.aborts == 1


def test_the_next_transaction_begins_only_after_the_previous_commit_returned():
    consumer = FakeConsumer(records(30))
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    eos, producers = cycle(consumer)
    done: list[Any] = []
    for _ in range(3):
        done += eos.start_batch(consumer.consume(10, 0), echo)
    done += eos.settle()
    assert [o.status for o in done] == [BatchStatus.COMMITTED] * 3 and [o.value for o in done] == [10, 10, 10]
    calls = [c.name for c in producers[0].calls if c.name in ("begin_transaction", "commit_transaction")]
    assert calls == ["begin_transaction", "commit_transaction"] * 3  # the FakeProducer also refuses a second begin
    assert consumer.committed_offsets[(TOPIC, 0)] == 30


class BlockingCommitProducer(FakeProducer):
    """commit_transaction waits for ``release`` (a commit still in flight on the committer thread)."""

    def __init__(self, consumer: FakeConsumer, entered: threading.Event, release: threading.Event) -> None:
        super().__init__(consumer=consumer)
        self.entered, self.release = entered, release

    def commit_transaction(self, timeout: float | None = None) -> None:
        self.entered.set()
        assert self.release.wait(30), "commit never released"
        super().commit_transaction(timeout)


class Recorder:
    """A BatchProcessor that echoes and records what the loop told it, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.stop_after: int | None = None
        self.stop: threading.Event | None = None
        self.prepared = 0

    def started(self, consumer: Any) -> None:
        pass

    def prepare(self, batch: list[Any]) -> Prepared[int]:
        self.prepared += len(batch)
        if self.stop is not None and self.stop_after is not None and self.prepared >= self.stop_after:
            self.stop.set()  # a stop request arrives while this batch is being prepared
        return echo(batch)

    def rejected(self, output: Output, detail: str, value: Any) -> Output:
        raise AssertionError("nothing is refused here")

    def partitions_assigned(self, consumer: Any, partitions: list[Any]) -> None:
        self.events.append(("assigned", consumer.serving))  # True: called inside librdkafka's callback serving

    def committed(self, value: Any, batch_size: int) -> None:
        self.events.append(("committed", batch_size))

    def tick(self, consumer: Any) -> None:
        pass

    def partitions_dropped(self, partitions: list[Any], lost: bool) -> None:
        self.events.append(("dropped", [p.partition for p in partitions]))


def loop_for(consumer: FakeConsumer, producer_factory: Any, processor: Recorder, max_batch: int = 10) -> StreamLoop[Any]:
    settings = StageSettings(name="test", topics=[TOPIC], producer_config={"transactional.id": "t"},
                             consumer_config={}, max_batch=max_batch, max_wait_s=0.0, idle_s=0.05,
                             tick_interval_s=60.0, limits=EosLimits(backoff_s=0.0))
    return StreamLoop(settings, processor, clients=fake_clients(consumer=consumer, producer=producer_factory).clients)


def test_a_rebalance_waits_for_the_commit_in_flight_before_the_partitions_go():
    consumer = FakeConsumer(records(5))
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    entered, release = threading.Event(), threading.Event()
    producer = BlockingCommitProducer(consumer, entered, release)
    processor = Recorder()
    loop = loop_for(consumer, lambda _c: producer, processor)
    stop = threading.Event()
    tp = TransactionalProducer({"transactional.id": "t"}, lambda _c: producer, 3, 0.0, stop)
    assert tp.start()
    loop.eos = eos = ExactlyOnce(tp, consumer, stop, EosLimits(backoff_s=0.0))
    assert eos.start_batch(consumer.consume(5, 0), echo) == []  # its commit is now blocked on the committer thread
    assert entered.wait(10)

    revoking = threading.Event()

    def release_once_revoking() -> None:
        revoking.wait(10)
        release.set()  # the commit can finish only once on_revoke has been called

    threading.Thread(target=release_once_revoking, daemon=True).start()
    revoking.set()
    loop._on_revoke(consumer, [TopicPartition(TOPIC, 0)])
    assert producer.commits == 1 and consumer.committed_offsets[(TOPIC, 0)] == 5  # finished before the return
    assert processor.events == [("committed", 5), ("dropped", [0])]  # counted, then the partitions went
    assert not eos.in_flight


def test_a_stop_request_commits_the_batch_in_flight_and_counts_it():
    consumer = FakeConsumer(records(40))
    producers: list[FakeProducer] = []

    def make(_c: dict[str, Any]) -> FakeProducer:
        producers.append(FakeProducer(consumer=consumer))
        return producers[-1]

    processor = Recorder()
    stop = threading.Event()
    processor.stop, processor.stop_after = stop, 40
    loop = loop_for(consumer, make, processor)
    loop.run(stop)
    assert consumer.committed_offsets[(TOPIC, 0)] == 40  # the last batch (its commit started after stop) committed
    assert sum(n for kind, n in processor.events if kind == "committed") == 40
    assert len(values(producers)) == 40 and consumer.closed


def run_until_stopped(stop: threading.Event, prepare_error: Exception | None = None,
                      consumer: FakeConsumer | None = None) -> tuple[FakeConsumer, list[FakeProducer], Recorder]:
    """A subscribed loop over 40 records, asked to stop (``stop``) once it prepared all of them, or whose
    ``prepare`` raises ``prepare_error`` (a crash out of the loop)."""
    consumer = consumer or FakeConsumer(records(40))
    producers: list[FakeProducer] = []

    def make(_c: dict[str, Any]) -> FakeProducer:
        producers.append(FakeProducer(consumer=consumer))
        return producers[-1]

    processor = Recorder()
    processor.stop, processor.stop_after = stop, 40
    if prepare_error is not None:
        def fail(_batch: list[Any]) -> Prepared[int]:
            raise prepare_error
        processor.prepare = fail  # type: ignore[method-assign]
    loop_for(consumer, make, processor).run(stop)
    return consumer, producers, processor


def test_a_stop_request_leaves_the_group_after_the_last_commit():
    """A planned stop: the member leaves (unsubscribe, the eager revoke served, LeaveGroup) before it closes, so
    the others take its partitions at their next heartbeat, static member or not (transaction.leave_group)."""
    consumer, producers, processor = run_until_stopped(threading.Event())
    assert consumer.left == 1 and consumer.member_id is None and consumer.closed
    last_commit = producers[-1].called("commit_transaction")[-1].seq
    unsubscribed, closed = consumer.called("unsubscribe")[0].seq, consumer.called("close")[0].seq
    assert last_commit < unsubscribed < closed  # the last batch committed first; the member left before close
    assert processor.events[-1] == ("dropped", [0])  # the revoke was served: nothing in flight, nothing dropped


class HandOver(StopRequest):
    def set(self) -> None:  # what the Recorder calls: a hand-over instead of a plain stop
        self.handing_over = True
        super().set()


class SharingConsumer(FakeConsumer):
    """A member of a group with another member: it is assigned partition 0 of the topic's two."""

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        super().subscribe(topics, **callbacks)
        with self._cond:
            self._events[-1] = ("assign", [TopicPartition(TOPIC, 0)])


def test_a_hand_over_by_the_only_member_keeps_the_static_membership_for_the_successor():
    """``StopRequest.hand_over`` by a member owning every partition: leaving would empty the group; its loaded
    successor (same instance id) takes the place without a rebalance."""
    consumer, _, _ = run_until_stopped(HandOver())
    assert consumer.closed and not consumer.called("unsubscribe") and consumer.member_id == "fake-member"
    assert consumer.committed_offsets[(TOPIC, 0)] == 40


def test_a_hand_over_by_one_of_several_members_leaves_so_the_others_serve_while_the_successor_starts():
    consumer = SharingConsumer(records(40), partitions={TOPIC: 2})
    run_until_stopped(HandOver(), consumer=consumer)
    assert consumer.left == 1 and consumer.member_id is None and consumer.closed
    assert consumer.committed_offsets[(TOPIC, 0)] == 40


def test_a_loop_that_ends_on_an_error_keeps_the_membership_for_its_restart():
    """A crash is no planned stop: no leave, so a static member's restart takes its place without a rebalance."""
    consumer = FakeConsumer(records(40))
    with pytest.raises(RuntimeError, match="model crashed"):
        run_until_stopped(threading.Event(), prepare_error=RuntimeError("model crashed"), consumer=consumer)
    assert consumer.closed and not consumer.called("unsubscribe") and consumer.member_id == "fake-member"


def test_the_processor_hears_of_an_assignment_outside_librdkafka_s_callback():
    """A consumer call made inside a rebalance callback that takes confluent-kafka's call state (list_topics)
    clears it; the next callback of the same poll then aborts the process (StreamLoop._on_assign)."""
    _, _, processor = run_until_stopped(threading.Event())
    assert ("assigned", False) in processor.events and ("assigned", True) not in processor.events


def test_a_batch_stays_open_while_the_previous_commit_runs_and_closes_when_it_returns():
    from sie.streams.eos.batcher import Batcher

    consumer = FakeConsumer(records(1))
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    asked: list[bool] = []

    def commit_running(wait_s: float) -> bool:
        assert wait_s > 0  # waits on the commit (its end wakes the wait), no busy polling
        asked.append(True)
        if len(asked) == 1:  # a record arrives while the previous commit is still running
            consumer.append(FakeMessage(TOPIC, 0, 1, b"k1", b"v1"))
            return True
        return False  # the commit returned: the batch closes

    batch = Batcher(consumer, 10, 0.0, 1.0).collect(commit_running)
    assert [m.offset() for m in batch] == [0, 1] and len(asked) == 2
    consumer.append(FakeMessage(TOPIC, 0, 2, b"k2", b"v2"))
    consumer.append(FakeMessage(TOPIC, 0, 3, b"k3", b"v3"))
    assert [m.offset() for m in Batcher(consumer, 1, 0.0, 1.0).collect(lambda _s: True)] == [2]  # full: closes at once
    assert [m.offset() for m in Batcher(consumer, 10, 0.0, 1.0).collect()] == [3]  # serial: what is fetched
