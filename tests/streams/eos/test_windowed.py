"""Windowed stages of ``StreamLoop`` (``sie.streams.eos.windowed``: the LLM stage) against fake clients.

* only what the stage says is ready commits, with its offsets; records in flight stay uncommitted;
* a transaction that does not commit drops the window and rewinds every partition it held: every record is
  answered once in the end;
* a revoke commits the finished prefix before the partitions go;
* a stop request commits what is finished.
"""

from __future__ import annotations

import threading
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from sie.streams.eos import EosLimits, Output, Prepared, StageSettings, StreamLoop
from sie.streams.eos.ranges import TP
from tests.fakes.kafka_clients import FakeConsumer, FakeMessage, FakeProducer, fake_clients, kafka_error
from tests.support.helpers import wait_until

TOPIC, OUT = "in", "out"


def records(n: int, partition: int = 0) -> list[FakeMessage]:
    return [FakeMessage(TOPIC, partition, i, f"k{i}".encode(), f"v{partition}-{i}".encode()) for i in range(n)]


class Window:
    """Holds every record it is given; a record is finished once ``finish_below[tp]`` passed its offset
    (the test moves it); ``ready`` takes each partition's finished prefix."""

    def __init__(self, room: int = 100) -> None:
        self.held: dict[TP, list[Any]] = {}
        self.finish_below: dict[TP, int] = {}
        self._room = room
        self._taken: list[Any] = []
        self.failures = 0
        self.committed_sizes: list[int] = []
        self.dropped: list[tuple[list[int], bool]] = []
        self.closings = 0

    def started(self, consumer: Any) -> None:
        pass

    def room(self, consumer: Any) -> tuple[int, float]:
        return max(1, self._room - sum(len(v) for v in self.held.values())), 0.01

    def accept(self, batch: list[Any]) -> None:
        for msg in batch:
            self.held.setdefault((msg.topic(), msg.partition()), []).append(msg)

    def ready(self, force: bool) -> list[Any]:
        taken = []
        for tp, msgs in self.held.items():
            while msgs and msgs[0].offset() < self.finish_below.get(tp, 0):
                taken.append(msgs.pop(0))
        self._taken = taken
        return taken

    def prepare(self, batch: list[Any]) -> Prepared[int]:
        return Prepared([Output(OUT, m.value(), m.key(), source=m, kind="result") for m in batch], len(batch))

    def rejected(self, output: Output, detail: str, value: Any) -> Output:
        raise AssertionError("nothing is refused here")

    def failed(self) -> dict[TP, int]:
        self.failures += 1
        firsts: dict[TP, int] = {}
        for m in self._taken + [m for msgs in self.held.values() for m in msgs]:
            tp = (m.topic(), m.partition())
            firsts[tp] = min(firsts.get(tp, m.offset()), m.offset())
        self.held.clear()
        return firsts

    def closing(self) -> None:
        self.closings += 1

    def partitions_assigned(self, consumer: Any, partitions: list[Any]) -> None:
        pass

    def committed(self, value: Any, batch_size: int) -> None:
        self.committed_sizes.append(batch_size)

    def tick(self, consumer: Any) -> None:
        pass

    def partitions_dropped(self, partitions: list[Any], lost: bool) -> None:
        for p in partitions:
            self.held.pop((p.topic, p.partition), None)
        self.dropped.append(([p.partition for p in partitions], lost))


class Stage:
    def __init__(self, consumer: FakeConsumer, window: Window, faults: dict[str, Any] | None = None) -> None:
        self.consumer, self.window = consumer, window
        self.producers: list[FakeProducer] = []

        def make(_config: dict[str, Any]) -> FakeProducer:
            self.producers.append(FakeProducer(faults, consumer=consumer))
            return self.producers[-1]

        settings = StageSettings(name="windowed", topics=[TOPIC], producer_config={"transactional.id": "t"},
                                 consumer_config={}, max_batch=50, max_wait_s=0.0, idle_s=0.01, tick_interval_s=60.0,
                                 limits=EosLimits(attempts=2, backoff_s=0.0), pipelined=False)
        self.loop: StreamLoop[int] = StreamLoop(settings, window, window=window,
                                                clients=fake_clients(consumer=consumer, producer=make).clients)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def visible(self) -> list[bytes | None]:
        return [r.value for p in self.producers for r in p.visible]

    def held(self) -> int:
        return sum(len(v) for v in self.window.held.copy().values())  # copy(): atomic while the loop adds keys

    def close(self) -> None:
        self.stop.set()
        self.thread.join(15)
        assert not self.thread.is_alive()


def test_only_the_finished_prefix_commits_and_a_stop_commits_what_finished_since():
    consumer = FakeConsumer(records(6))
    window = Window()
    stage = Stage(consumer, window)
    try:
        wait_until(lambda: stage.held() == 6, 10, message=lambda: f"all 6 in the window (have {stage.held()})")
        assert stage.visible() == [] and consumer.committed_offsets == {}  # nothing finished: nothing commits
        window.finish_below[(TOPIC, 0)] = 3
        wait_until(lambda: consumer.committed_offsets.get((TOPIC, 0)) == 3, 10, message="the prefix 0-2 committed")
        assert stage.visible() == [b"v0-0", b"v0-1", b"v0-2"]
        window.finish_below[(TOPIC, 0)] = 6
        stage.close()
        assert consumer.committed_offsets == {(TOPIC, 0): 6} and len(stage.visible()) == 6
        assert window.closings >= 1
    finally:
        stage.stop.set()


def test_a_failed_transaction_drops_the_window_and_every_record_is_answered_once():
    consumer = FakeConsumer(records(5) + records(5, 1))
    window = Window()
    window.finish_below = {(TOPIC, 0): 100, (TOPIC, 1): 2}
    abort = kafka_error(KafkaError._STATE, "injected abort", txn_requires_abort=True)
    stage = Stage(consumer, window, faults={"commit_transaction": [abort]})
    try:
        wait_until(lambda: window.failures == 1, 10, message="the first transaction aborted")
        window.finish_below[(TOPIC, 1)] = 100
        wait_until(lambda: consumer.committed_offsets == {(TOPIC, 0): 5, (TOPIC, 1): 5}, 10,
                   message=lambda: f"everything committed (have {consumer.committed_offsets})")
        stage.close()
        assert sorted(stage.visible()) == sorted([f"v{p}-{i}".encode() for p in (0, 1) for i in range(5)])
        # both partitions went back, the one whose records were only in flight too
        assert {c.args[1] for c in consumer.called("seek")} == {0, 1}
    finally:
        stage.stop.set()


def test_a_revoke_commits_the_finished_prefix_before_the_partition_goes():
    consumer = FakeConsumer(records(6))
    window = Window()
    stage = Stage(consumer, window)
    try:
        wait_until(lambda: stage.held() == 6, 10, message="all 6 in the window")
        window.finish_below[(TOPIC, 0)] = 4
        consumer.revoke([TopicPartition(TOPIC, 0)])  # before the loop's next look at what is ready, or after it
        wait_until(lambda: window.dropped, 10, message="revoked")
        assert consumer.committed_offsets == {(TOPIC, 0): 4} and window.dropped == [([0], False)]
        assert stage.held() == 0  # 4 and 5 are left for the next owner
        stage.close()
        assert stage.visible() == [b"v0-0", b"v0-1", b"v0-2", b"v0-3"]
    finally:
        stage.stop.set()


class StopWhenAllCommitted(Window):
    """Offsets 0-19 finish at once, the rest once a transaction failed twice or when ``closing`` collects them
    (as the LLM stage's drain collects generations that finished meanwhile)."""

    def __init__(self, stop: threading.Event, total: int) -> None:
        super().__init__()
        self.stop, self.total = stop, total
        self.finish_below = {(TOPIC, 0): 20}

    def closing(self) -> None:
        super().closing()
        self.finish_below[(TOPIC, 0)] = 10**9

    def failed(self) -> dict[TP, int]:
        firsts = super().failed()
        if self.failures >= 2:
            self.finish_below[(TOPIC, 0)] = 10**9
        return firsts

    def committed(self, value: Any, batch_size: int) -> None:
        super().committed(value, batch_size)
        if sum(self.committed_sizes) >= self.total:
            self.stop.set()


def test_a_windowed_stage_that_stalls_leaves_its_group_without_committing_inside_the_recovery():
    """The stall rule holds for a windowed stage too; the revoke that the leave serves runs inside the failed
    batch's recovery (its transaction not yet aborted), so it must not start another transaction there."""
    from tests.streams.eos.test_pipeline import Clock, SharingConsumer, SlowFailingCommits, waits_on

    clock, stop = Clock(), threading.Event()
    consumer = waits_on(SharingConsumer(records(40), partitions={TOPIC: 2}), clock)
    producer = SlowFailingCommits(consumer, clock, 3, 6.0)
    window = StopWhenAllCommitted(stop, 40)
    settings = StageSettings(name="windowed", topics=[TOPIC], producer_config={"transactional.id": "t"},
                             consumer_config={}, max_batch=40, max_wait_s=0.0, idle_s=0.05, tick_interval_s=60.0,
                             limits=EosLimits(backoff_s=0.0, stall_s=10.0), pipelined=False)
    loop: StreamLoop[int] = StreamLoop(settings, window, window=window, clock=clock,
                                       clients=fake_clients(consumer=consumer, producer=lambda _c: producer).clients)
    deadline = threading.Timer(20.0, stop.set)  # a stage that never gets there ends, and the asserts say why
    deadline.start()
    try:
        loop.run(stop)
    finally:
        deadline.cancel()
    assert loop.stall_leaves == 1 and len(consumer.called("subscribe")) == 2  # left, joined again
    begins = [c.seq for c in producer.called("begin_transaction")]
    aborts = [c.seq for c in producer.called("abort_transaction")]
    leave = consumer.called("unsubscribe")[0].seq
    assert not [b for b in begins if leave < b < min(a for a in aborts if a > leave)]  # nothing begun in the leave
    assert consumer.committed_offsets[(TOPIC, 0)] == 40
    assert sorted(r.value for r in producer.visible) == sorted(f"v0-{i}".encode() for i in range(40))  # once each
