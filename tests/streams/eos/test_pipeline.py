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
from confluent_kafka import ConsumerGroupState, KafkaError, TopicPartition

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
from tests.fakes.kafka_clients import FakeAdmin, FakeConsumer, FakeMessage, FakeProducer, fake_clients, kafka_error
from tests.support.helpers import wait_until

TOPIC, OUT, GROUP = "in", "out", "g"


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


def loop_for(consumer: FakeConsumer, producer_factory: Any, processor: Recorder, max_batch: int = 10,
             admin: FakeAdmin | None = None) -> StreamLoop[Any]:
    settings = StageSettings(name="test", topics=[TOPIC], producer_config={"transactional.id": "t"},
                             consumer_config={"group.id": GROUP}, max_batch=max_batch, max_wait_s=0.0, idle_s=0.05,
                             tick_interval_s=60.0, limits=EosLimits(backoff_s=0.0))
    return StreamLoop(settings, processor,
                      clients=fake_clients(consumer=consumer, producer=producer_factory, admin=admin).clients)


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
                      consumer: FakeConsumer | None = None,
                      admin: FakeAdmin | None = None) -> tuple[FakeConsumer, list[FakeProducer], Recorder]:
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
    loop_for(consumer, make, processor, admin=admin).run(stop)
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


def test_a_hand_over_in_a_settled_group_keeps_the_static_membership_for_the_successor():
    """``StopRequest.hand_over`` while the broker describes the group as stable with every partition owned (here:
    this member alone): its loaded successor (same instance id) takes the place and the partitions without a
    rebalance."""
    admin = FakeAdmin(topics={TOPIC: 1}, groups={GROUP: (ConsumerGroupState.STABLE, ["fake-member"])})
    consumer, _, _ = run_until_stopped(HandOver(), admin=admin)
    assert admin.called("describe_consumer_groups")
    assert consumer.closed and not consumer.called("unsubscribe") and consumer.member_id == "fake-member"
    assert consumer.committed_offsets[(TOPIC, 0)] == 40


@pytest.mark.parametrize("described", [
    # joined: cooperative, the first round took p0 from us for it; nobody owns it until the second round
    (ConsumerGroupState.STABLE, ["fake-member", "joined-member"], {"fake-member": [], "joined-member": []}),
    (ConsumerGroupState.COMPLETING_REBALANCING, ["fake-member"]),
    (ConsumerGroupState.STABLE, ["another-member"]),  # this member is not in the group the broker describes
    None,  # the describe fails: unknown, so leave
])
def test_a_hand_over_leaves_unless_the_broker_says_the_group_is_settled(described):
    """Its own assignment said "every partition" while the broker had a second member waiting for some of them
    (tests/test_handover_e2e.py lost 3 of 6 partitions that way): leave, so the group rebalances."""
    admin = FakeAdmin(topics={TOPIC: 1}, groups={GROUP: described} if described else {},
                      faults=None if described else {"describe_consumer_groups": RuntimeError("timed out")})
    consumer, _, _ = run_until_stopped(HandOver(), admin=admin)
    assert consumer.left == 1 and consumer.member_id is None and consumer.closed
    assert consumer.committed_offsets[(TOPIC, 0)] == 40


def test_a_hand_over_by_one_of_several_members_of_a_settled_group_keeps_its_place_for_the_successor():
    """Another member serves the other partition; the group is settled: the successor takes this member's place and
    partition 0 without a rebalance (leaving would cost two: bench/results/rollout_handover.txt)."""
    consumer = SharingConsumer(records(40), partitions={TOPIC: 2})
    admin = FakeAdmin(topics={TOPIC: 2}, groups={GROUP: (ConsumerGroupState.STABLE, ["fake-member", "other"], {
        "fake-member": [(TOPIC, 0)], "other": [(TOPIC, 1)]})})
    run_until_stopped(HandOver(), consumer=consumer, admin=admin)
    assert consumer.left == 0 and consumer.member_id == "fake-member" and consumer.closed


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


# --- stalls: a stage that can commit nothing gives its partitions back (stage.py, cycle.py) -------------------

class Clock:
    """A monotonic clock the test moves: a little on every read, a lot when a call takes long or a poll waits."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


def waits_on(consumer: FakeConsumer, clock: Clock) -> FakeConsumer:
    """``consumer`` whose polls that return nothing take their whole timeout of ``clock``."""
    consume = consumer.consume

    def timed(num_messages: int = 1, timeout: float | None = None) -> list[FakeMessage]:
        got = consume(num_messages, 0)
        if not got and timeout:
            clock.now += timeout
        return got

    consumer.consume = timed  # type: ignore[method-assign]
    return consumer


class SlowFailingCommits(FakeProducer):
    """Each commit takes ``took_s`` of ``clock`` (records waiting out a message timeout); the first ``fails``
    fail abortably, as when the leaders of the output partitions cannot be reached."""

    def __init__(self, consumer: FakeConsumer, clock: Clock, fails: int, took_s: float) -> None:
        super().__init__(consumer=consumer)
        self.clock, self.fails, self.took_s = clock, fails, took_s

    def commit_transaction(self, timeout: float | None = None) -> None:
        self.clock.now += self.took_s
        if self.fails > 0:
            self.fails -= 1
            self._call("commit_transaction")
            raise kafka_error(KafkaError._TIMED_OUT, "3 message(s) timed out", txn_requires_abort=True)
        super().commit_transaction(timeout)


class StopWhenCommitted(Recorder):
    def __init__(self, stop: threading.Event, total: int) -> None:
        super().__init__()
        self.stop, self.total, self.done = stop, total, 0

    def prepare(self, batch: list[Any]) -> Prepared[int]:
        return echo(batch)

    def committed(self, value: Any, batch_size: int) -> None:
        super().committed(value, batch_size)
        self.done += batch_size
        if self.done >= self.total:
            self.stop.set()


def stall_stage(consumer: Any, producer: Any, processor: Any, clock: Any, max_batch: int = 40) -> StreamLoop[Any]:
    """The stall tests' stage: serial, stall_s 10 s, no retry backoff, on these fake clients and clock."""
    settings = StageSettings(name="test", topics=[TOPIC], producer_config={"transactional.id": "t"},
                             consumer_config={}, max_batch=max_batch, max_wait_s=0.0, idle_s=0.05,
                             tick_interval_s=60.0, limits=EosLimits(backoff_s=0.0, stall_s=10.0), pipelined=False)
    return StreamLoop(settings, processor, clock=clock,
                      clients=fake_clients(consumer=consumer, producer=lambda _c: producer).clients)


def stalled_loop(fails: int, took_s: float, alone: bool = False
                 ) -> tuple[StreamLoop[Any], FakeConsumer, SlowFailingCommits, StopWhenCommitted]:
    """A stage whose first ``fails`` commits fail, each ``took_s`` into it; it owns partition 0 of the topic's two
    (another member has the other), or ``alone`` every partition."""
    clock, stop = Clock(), threading.Event()
    consumer = waits_on(FakeConsumer(records(40)) if alone else SharingConsumer(records(40), partitions={TOPIC: 2}),
                        clock)
    producer = SlowFailingCommits(consumer, clock, fails, took_s)
    processor = StopWhenCommitted(stop, 40)
    loop = stall_stage(consumer, producer, processor, clock)
    loop.run(stop)
    return loop, consumer, producer, processor


def test_a_stage_that_commits_nothing_for_stall_s_leaves_its_group_then_joins_again():
    """Issue 27, case 4: a scorer that reaches its group coordinator but cannot commit kept its partitions,
    unscored, until max.poll.interval.ms.  Its second failed batch (12 s without a commit > stall_s 10 s)
    leaves the group BEFORE the recovery, so the others take over; it joins again after stall_s."""
    loop, consumer, producer, processor = stalled_loop(fails=3, took_s=6.0)
    unsubscribed = [c.seq for c in consumer.called("unsubscribe")]
    aborts = [c.seq for c in producer.called("abort_transaction")]
    assert loop.stall_leaves == 1 and len(unsubscribed) == 2  # the stall's leave, the planned stop's at the end
    assert aborts[0] < unsubscribed[0] < aborts[1]  # the first failure (6 s) is no stall; the second (12 s) is
    assert len(consumer.called("subscribe")) == 2  # joined again after the recovery
    assert consumer.committed_offsets[(TOPIC, 0)] == 40 and [r.value for r in producer.visible] == [
        f"v{i}".encode() for i in range(40)]  # each record once, in order
    assert loop.stalls_in_a_row == 0  # the commit reset it


class SlowAbort(SlowFailingCommits):
    """As ``SlowFailingCommits``; each abort also takes ``abort_s`` (a coordinator still finishing the previous
    transaction: the abort is retried until it answers)."""

    def __init__(self, consumer: FakeConsumer, clock: Clock, fails: int, took_s: float, abort_s: float) -> None:
        super().__init__(consumer, clock, fails, took_s)
        self.abort_s = abort_s

    def abort_transaction(self, timeout: float | None = None) -> None:
        self.clock.now += self.abort_s
        super().abort_transaction(timeout)


def joins_and_leaves(consumer: FakeConsumer, clock: Clock) -> dict[str, list[float]]:
    """When (``clock``) ``consumer`` subscribed and unsubscribed."""
    at: dict[str, list[float]] = {"subscribe": [], "unsubscribe": []}
    for name in at:
        def timed(*args: Any, _call: Any = getattr(consumer, name), _name: str = name, **kwargs: Any) -> Any:
            at[_name].append(clock.now)
            return _call(*args, **kwargs)
        setattr(consumer, name, timed)
    return at


def test_the_backoff_before_joining_again_counts_from_the_leave():
    """Issue 27, case 6 (a broker cut from the others while clients reach it): the recovery after the leave
    (an abort waiting on its coordinator) took 20 s, and a backoff of stall_s started only after it kept the
    scorer out of its group 31 s, 16 s past the heal.  The time the recovery took counts: out of the group
    stall_s (10 s) since the leave, not the recovery (12 s) + stall_s."""
    clock, stop = Clock(), threading.Event()
    consumer = waits_on(SharingConsumer(records(40), partitions={TOPIC: 2}), clock)
    at = joins_and_leaves(consumer, clock)
    producer = SlowAbort(consumer, clock, fails=2, took_s=6.0, abort_s=12.0)
    processor = StopWhenCommitted(stop, 40)
    loop = stall_stage(consumer, producer, processor, clock)
    loop.run(stop)
    left, joined = at["unsubscribe"][0], at["subscribe"][1]
    assert loop.stall_leaves == 1
    assert 12.0 <= joined - left < 13.0, at  # right after the 12 s abort (it was 12 + 10 s)
    assert consumer.committed_offsets[(TOPIC, 0)] == 40


def test_failures_within_stall_s_of_a_commit_never_leave_the_group():
    loop, consumer, _, _ = stalled_loop(fails=1, took_s=6.0)
    assert loop.stall_leaves == 0 and len(consumer.called("subscribe")) == 1
    assert consumer.committed_offsets[(TOPIC, 0)] == 40


def test_a_stalled_stage_that_owns_every_partition_stays_in_the_group():
    """Nobody would take its partitions: leaving would only add a rebalance (a single scorer, a broker fault)."""
    loop, consumer, _, _ = stalled_loop(fails=3, took_s=6.0, alone=True)
    assert loop.stall_leaves == 0 and len(consumer.called("subscribe")) == 1
    assert consumer.committed_offsets[(TOPIC, 0)] == 40


class HangingFirstCommit(FakeProducer):
    """The first commit hangs (a coordinator that answers nothing) ``took_s`` of ``clock`` and until ``release``."""

    def __init__(self, consumer: FakeConsumer, clock: Clock, took_s: float, release: threading.Event) -> None:
        super().__init__(consumer=consumer)
        self.clock, self.took_s, self.release, self.hung = clock, took_s, release, False

    def commit_transaction(self, timeout: float | None = None) -> None:
        if not self.hung:
            self.hung = True
            self.clock.now += self.took_s
            assert self.release.wait(30), "the hanging commit was never released"
        super().commit_transaction(timeout)


def test_a_commit_that_hangs_past_stall_s_gives_the_partitions_back_while_it_hangs():
    """A coordinator that answers nothing: the watchdog gives the call up only after hang_limit_s (25 s per call);
    the partitions move on once stall_s passed without a commit, while the call still hangs.  The call then
    returned committed: the stage commits again, so it joins at once (no backoff)."""
    clock, stop, release = Clock(), threading.Event(), threading.Event()
    consumer = waits_on(SharingConsumer(records(40), partitions={TOPIC: 2}), clock)
    at = joins_and_leaves(consumer, clock)
    producer = HangingFirstCommit(consumer, clock, 12.0, release)
    processor = StopWhenCommitted(stop, 40)
    loop = stall_stage(consumer, producer, processor, clock, max_batch=20)

    def release_once_left() -> None:
        wait_until(lambda: consumer.called("unsubscribe"), 20, 0.05, "the stalled stage to leave its group")
        release.set()

    releaser = threading.Thread(target=release_once_left, daemon=True)
    releaser.start()
    loop.run(stop)
    releaser.join(5)
    assert release.is_set() and loop.stall_leaves == 1  # it left while the commit hung
    assert at["subscribe"][1] - at["unsubscribe"][0] < 1.0, at  # the commit landed: it commits again, joins at once
    assert len(consumer.called("subscribe")) == 2 and consumer.committed_offsets[(TOPIC, 0)] == 40


# --- rebalances that move nothing here, and the JoinGroup throttle (issue 34: hand-over gaps) ------------------
def test_an_empty_incremental_assignment_is_not_handed_to_the_processor():
    """A cooperative round that gave this member nothing new: the processor's assignment work (the rollout
    scorer's read barrier) would stall every partition the member holds, for nothing."""
    consumer, processor = FakeConsumer(records(1)), Recorder()
    loop = loop_for(consumer, lambda _c: FakeProducer(consumer=consumer), processor)
    loop._on_assign(consumer, [])
    loop._hand_assigned(consumer)
    assert processor.events == []
    loop._on_assign(consumer, [TopicPartition(TOPIC, 0)])
    loop._hand_assigned(consumer)
    assert processor.events == [("assigned", False)]


def test_after_a_rebalance_callback_the_loop_asks_for_metadata_every_nudge_interval_for_a_few_seconds():
    """librdkafka sends a member's JoinGroup at most once a second unless a metadata answer came in since: the
    nudge (StreamLoop._nudge) keeps a member that must join the next round from holding the whole group."""
    from sie.streams.eos import stage

    now = [100.0]
    consumer = FakeConsumer(records(1))
    settings = StageSettings(name="test", topics=[TOPIC], producer_config={"transactional.id": "t"},
                             consumer_config={"group.id": GROUP}, max_batch=10, max_wait_s=0.0, idle_s=0.05,
                             tick_interval_s=60.0, limits=EosLimits(backoff_s=0.0))
    loop = StreamLoop(settings, Recorder(), clients=fake_clients(consumer=consumer).clients, clock=lambda: now[0])
    loop._consumer = consumer
    loop._nudge()
    assert consumer.called("list_topics") == []  # no rebalance: no request
    loop._on_assign(consumer, [])
    asked = []
    while now[0] < 100.0 + stage.REBALANCE_NUDGE_S + 1.0:
        before = len(consumer.called("list_topics"))
        loop._nudge()
        if len(consumer.called("list_topics")) > before:
            asked.append(round(now[0] - 100.0, 3))
        now[0] += 0.01
    assert asked[0] == 0.0 and asked[-1] < stage.REBALANCE_NUDGE_S
    assert all(b - a >= stage.NUDGE_EVERY_S - 1e-9 for a, b in zip(asked, asked[1:]))
    assert len(asked) == pytest.approx(stage.REBALANCE_NUDGE_S / stage.NUDGE_EVERY_S, abs=1)
    assert all(c.args == (TOPIC,) for c in consumer.called("list_topics"))


def test_prepared_clients_hand_out_the_clients_made_ahead_once_then_make_new_ones():
    """A standby successor's clients are created while its predecessor serves (connections up, coordinators
    found); creating them neither fences (init_transactions) nor joins (subscribe)."""
    from sie.streams.eos.stage import PreparedClients

    consumers = [FakeConsumer(records(1)) for _ in range(3)]
    made: list[str] = []

    def consumer_factory(_c: dict[str, Any]) -> FakeConsumer:
        made.append("consumer")
        return consumers[len([m for m in made if m == "consumer"]) - 1]

    def producer_factory(_c: dict[str, Any]) -> FakeProducer:
        made.append("producer")
        return FakeProducer(consumer=consumers[0])

    base = fake_clients(consumer=consumer_factory, producer=producer_factory).clients
    prepared = PreparedClients(base, {"transactional.id": "t"}, {"group.id": GROUP})
    assert made == ["producer", "consumer"]
    first = prepared.clients.producer({"transactional.id": "t"})
    assert not first.called("init_transactions") and consumers[0].called("subscribe") == []
    assert prepared.clients.consumer({"group.id": GROUP}) is consumers[0]
    assert prepared.clients.producer({"transactional.id": "t"}) is not first  # a restart makes a new one
    assert prepared.clients.consumer({"group.id": GROUP}) is consumers[1]
    prepared.close()
    assert not consumers[0].closed  # taken: the stage closes it

    unused = PreparedClients(base, {"transactional.id": "t"}, {"group.id": GROUP})
    unused.close()
    assert consumers[2].closed  # a standby stopped before it served
