"""Bounded runs of ``StreamLoop`` (``sie.streams.eos.ranges``: backfill, redrive) against fake clients.

* a run reads each partition from its start to the end fixed when it started, each record committed once,
  and returns once every partition is done (records written past an end are left alone);
* the start offsets are read after ``init_transactions`` fenced any earlier holder of the id; a run with
  nothing left assigns nothing and returns;
* a failed batch is read again, never taken for the end of its partition;
* a partition whose last offsets are markers is done once its position passes the end;
* the throttle pauses the partitions and caps what one batch takes;
* consumer errors: a non-fatal one is logged and counted, a fatal one stops the run.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest
from confluent_kafka import KafkaError

from sie.streams.eos import EosLimits, Output, Prepared, StageSettings, StreamLoop
from sie.streams.eos.errors import ConsumerFatal
from sie.streams.eos.ranges import TP
from tests.fakes.kafka_clients import FakeConsumer, FakeMessage, FakeProducer, fake_clients, kafka_error

TOPIC, OUT = "in", "out"
RUN_LIMIT_S = 20.0


def records(n: int, partition: int = 0) -> list[FakeMessage]:
    return [FakeMessage(TOPIC, partition, i, f"k{partition}-{i}".encode(), f"v{partition}-{i}".encode())
            for i in range(n)]


class Processor:
    """Echoes each record; remembers what committed."""

    def __init__(self) -> None:
        self.committed_sizes: list[int] = []
        self.batch_sizes: list[int] = []
        self.ticks = 0

    def started(self, consumer: Any) -> None:
        pass

    def prepare(self, batch: list[Any]) -> Prepared[int]:
        self.batch_sizes.append(len(batch))
        return Prepared([Output(OUT, m.value(), m.key(), source=m, kind="result") for m in batch], len(batch))

    def rejected(self, output: Output, detail: str, value: Any) -> Output:
        raise AssertionError("nothing is refused here")

    def partitions_assigned(self, consumer: Any, partitions: list[Any]) -> None:
        raise AssertionError("a bounded run assign()s")

    def committed(self, value: Any, batch_size: int) -> None:
        self.committed_sizes.append(batch_size)

    def tick(self, consumer: Any) -> None:
        self.ticks += 1

    def partitions_dropped(self, partitions: list[Any], lost: bool) -> None:
        raise AssertionError("a bounded run assign()s")


class Ranges:
    """``ranges(consumer)``: from the committed offset (or 0) to ``ends``; remembers when it was asked."""

    def __init__(self, ends: Mapping[TP, int], producers: list[FakeProducer]) -> None:
        self.ends = dict(ends)
        self.asked_after_init: list[bool] = []
        self._producers = producers

    def __call__(self, consumer: Any) -> dict[TP, tuple[int, int]]:
        self.asked_after_init.append(any(p.called("init_transactions") for p in self._producers))
        return {tp: (consumer.committed_offsets.get(tp, 0), end) for tp, end in self.ends.items()}


class Run:
    def __init__(self, consumer: FakeConsumer, ends: Mapping[TP, int], *, faults: dict[str, Any] | None = None,
                 throttle: Any = None, max_batch: int = 4) -> None:
        self.consumer = consumer
        self.producers: list[FakeProducer] = []

        def make(_config: dict[str, Any]) -> FakeProducer:
            self.producers.append(FakeProducer(faults, consumer=consumer))
            return self.producers[-1]

        self.ranges = Ranges(ends, self.producers)
        self.processor = Processor()
        settings = StageSettings(name="bounded", topics=[TOPIC], producer_config={"transactional.id": "t"},
                                 consumer_config={}, max_batch=max_batch, max_wait_s=0.0, idle_s=0.02,
                                 tick_interval_s=60.0, limits=EosLimits(attempts=2, backoff_s=0.0), pipelined=False)
        self.loop: StreamLoop[int] = StreamLoop(settings, self.processor, ranges=self.ranges, throttle=throttle,
                                                clients=fake_clients(consumer=consumer, producer=make).clients)
        self.stop = threading.Event()

    def run(self) -> None:
        timer = threading.Timer(RUN_LIMIT_S, self.stop.set)
        timer.start()
        try:
            self.loop.run(self.stop)
        finally:
            timer.cancel()
        assert not self.stop.is_set(), f"the bounded run did not finish within {RUN_LIMIT_S}s"

    def visible(self) -> list[bytes | None]:
        return [r.value for p in self.producers for r in p.visible]


def test_a_bounded_run_answers_its_range_once_and_returns_at_the_ends_fixed_at_start():
    consumer = FakeConsumer(records(10, 0) + records(3, 1), committed={(TOPIC, 0): 2})
    run = Run(consumer, {(TOPIC, 0): 7, (TOPIC, 1): 3})
    run.run()
    assert sorted(run.visible()) == sorted([f"v0-{i}".encode() for i in range(2, 7)]  # from the mark to the end
                                           + [f"v1-{i}".encode() for i in range(3)])
    assert consumer.committed_offsets == {(TOPIC, 0): 7, (TOPIC, 1): 3}
    assert [c.args[0] for c in consumer.called("assign")] == [[(TOPIC, 0, 2), (TOPIC, 1, 0)]]
    assert (TOPIC, 0) in {tp for c in consumer.called("pause") for tp in c.args[0]}  # nothing past 7 is fetched
    assert run.loop.range_run is not None and run.loop.range_run.finished
    assert sum(run.processor.committed_sizes) == 8 and max(run.processor.batch_sizes) <= 4
    assert consumer.called("subscribe") == [] and consumer.closed


def test_the_start_offsets_are_read_after_fencing_and_a_run_with_nothing_left_assigns_nothing():
    """init_transactions first: it fences a zombie run of the same id and aborts its open transaction, whose
    pending offset commit would otherwise hold a read_committed committed() until the transaction times out."""
    work = Run(FakeConsumer(records(3)), {(TOPIC, 0): 3})
    work.run()
    assert work.ranges.asked_after_init == [True]  # read once, after init_transactions
    assert work.consumer.committed_offsets == {(TOPIC, 0): 3}

    done = Run(FakeConsumer(records(3), committed={(TOPIC, 0): 3}), {(TOPIC, 0): 3})
    done.run()
    assert done.ranges.asked_after_init == [True]
    assert done.consumer.called("assign") == [] and done.consumer.called("consume") == [] and done.consumer.closed
    assert [len(p.visible) for p in done.producers] == [0]


def test_an_aborted_batch_is_read_again_not_taken_for_the_end_of_its_partition():
    """After the abort the consumer is sought back, position() still reports the offset after the batch and
    the first fetch after the seek brings nothing (refetch_gap): the run must not call the partition done."""
    consumer = FakeConsumer(records(3), refetch_gap=1)
    run = Run(consumer, {(TOPIC, 0): 3},
              faults={"commit_transaction": [kafka_error(KafkaError._STATE, "abortable", txn_requires_abort=True)]})
    run.run()
    assert [c.args[1:] for c in consumer.called("seek")] == [(0, 0)]
    assert run.visible() == [b"v0-0", b"v0-1", b"v0-2"]  # each once: the aborted outputs never became visible
    assert consumer.committed_offsets == {(TOPIC, 0): 3} and run.loop.eos is not None and run.loop.eos.aborts == 1


def test_a_partition_whose_range_ends_in_markers_is_done_once_its_position_passes_the_end():
    consumer = FakeConsumer(records(2))
    consumer.add_marker(TOPIC, 0, 2)  # the commit marker of the transaction that wrote offsets 0-1
    run = Run(consumer, {(TOPIC, 0): 3})
    run.run()
    assert run.visible() == [b"v0-0", b"v0-1"] and run.loop.range_run is not None and run.loop.range_run.finished


class Throttle:
    """Paused for the first ``paused_for`` looks, then grants ``grant`` records per batch."""

    def __init__(self, paused_for: int, grant: int) -> None:
        self.looks, self.paused_for, self.grant = 0, paused_for, grant
        self.refunded = 0

    def paused(self) -> bool:
        self.looks += 1
        return self.looks <= self.paused_for

    def take(self, wanted: int) -> int:
        return min(wanted, self.grant)

    def refund(self, unused: int) -> None:
        self.refunded += unused

    def wait_s(self) -> float:
        return 0.001


def test_the_throttle_pauses_the_partitions_and_caps_each_batch():
    consumer = FakeConsumer(records(7))
    throttle = Throttle(paused_for=2, grant=2)
    run = Run(consumer, {(TOPIC, 0): 7}, throttle=throttle, max_batch=4)
    run.run()
    first_consume = consumer.called("consume")[0].seq
    assert consumer.called("pause")[0].seq < first_consume  # paused before anything was read
    assert consumer.called("resume")[0].args[0] == [(TOPIC, 0)]
    assert max(run.processor.batch_sizes) <= 2 and sum(run.processor.committed_sizes) == 7
    assert throttle.refunded >= 1  # the last grant was larger than what was left


def test_a_non_fatal_consumer_error_is_counted_and_a_fatal_one_stops_the_run():
    consumer = FakeConsumer(records(3))
    consumer.inject_error(KafkaError(KafkaError._TRANSPORT, "broker down"))
    run = Run(consumer, {(TOPIC, 0): 3})
    run.run()
    assert run.loop.batcher is not None and run.loop.batcher.consumer_errors == 1
    assert consumer.committed_offsets == {(TOPIC, 0): 3}

    fatal = FakeConsumer(records(3))
    fatal.inject_error(KafkaError(KafkaError._FATAL, "fenced", fatal=True))
    with pytest.raises(ConsumerFatal):
        Run(fatal, {(TOPIC, 0): 3}).loop.run(threading.Event())
    assert fatal.closed
