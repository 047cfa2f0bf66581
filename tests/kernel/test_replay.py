"""``sie.kernel.replay`` against fake clients: a topic read to its end past transaction markers and aborted
records, as a catch-up and as a read barrier; transient refusals retried; every failure names the topic and
the fix.  The same reads against a real broker: tests/kernel/test_replay_kafka.py."""

from __future__ import annotations

import itertools

import pytest
from confluent_kafka import KafkaError, TopicPartition

from sie.kernel.errors import KafkaUnavailable
from sie.kernel.replay import NotReadToEnd, ReadProgress, end_offsets, read_to_end, watermarks
from tests.fakes.kafka_clients import FakeConsumer, FakeMessage, eof_event, kafka_error

T = "sie.specs"


def records(partition: int, offsets: range, topic: str = T) -> list[FakeMessage]:
    return [FakeMessage(topic, partition, o, f"k{o}".encode(), f"v{o}".encode()) for o in offsets]


def ticking(step: float = 1.0):
    """A clock that advances ``step`` on every reading: deadlines pass without waiting for them."""
    counter = itertools.count()
    return lambda: next(counter) * step


def test_a_log_ending_on_commit_markers_and_aborted_records_is_read_to_its_end_without_eof_events():
    consumer = FakeConsumer(records(0, range(0, 3)) + records(1, range(0, 2)))
    consumer.add_marker(T, 0, 3)  # the commit marker of the transaction that wrote 0-2
    for o in (2, 3, 4):  # partition 1 ends on an aborted transaction: two records and its abort marker
        consumer.add_marker(T, 1, o)
    seen: list[tuple[int, int]] = []

    assert read_to_end(consumer, T, lambda m: seen.append((m.partition(), m.offset())), timeout_s=30)

    assert sorted(seen) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    assert consumer.eof_events == 0  # the position decided, not an end-of-partition event
    (assigned,) = [c.args[0] for c in consumer.called("assign")]
    assert assigned == [(T, 0, 0), (T, 1, 0)]  # every partition, from its low watermark


def test_a_partition_holding_only_markers_is_read_and_an_empty_one_is_done_at_once():
    consumer = FakeConsumer(partitions={T: 2})
    consumer.add_marker(T, 0, 0)
    consumer.add_marker(T, 0, 1)

    assert read_to_end(consumer, T, lambda m: pytest.fail(f"no record expected, got {m}"), timeout_s=30)


def test_an_end_of_partition_event_counts_as_its_offset_not_as_done():
    progress = ReadProgress({(T, 0): 5})
    progress.see(eof_event(T, 0, 3))
    assert progress.short() == {(T, 0): (3, 5)}
    progress.see(eof_event(T, 0, 5))
    assert progress.done


def test_compacted_history_below_the_low_watermark_is_not_waited_for():
    consumer = FakeConsumer(records(0, range(7, 10)))
    consumer.set_watermarks(T, 0, low=7)
    seen: list[int] = []

    assert read_to_end(consumer, T, lambda m: seen.append(m.offset()), timeout_s=30)
    assert seen == [7, 8, 9]


def test_records_written_after_the_read_began_are_not_waited_for():
    consumer = FakeConsumer(records(0, range(0, 2)))
    seen: list[int] = []

    def on_record(m: FakeMessage) -> None:
        seen.append(m.offset())
        if m.offset() == 0:
            consumer.append(FakeMessage(T, 0, 2, b"late", b"late"))

    assert read_to_end(consumer, T, on_record, timeout_s=30)
    assert seen[:2] == [0, 1]  # the end was taken at start (2); the late record may or may not come along


def test_a_read_barrier_takes_the_end_now_and_keeps_the_consumer_where_it_is():
    consumer = FakeConsumer(records(0, range(0, 4)))
    consumer.assign([TopicPartition(T, 0, 0)])
    first = consumer.consume(2, 0)  # the component read 0-1 before the barrier
    assert [m.offset() for m in first] == [0, 1]
    consumer.add_marker(T, 0, 4)
    seen: list[int] = []

    assert read_to_end(consumer, T, lambda m: seen.append(m.offset()), partitions=[0], assign=False, timeout_s=30)

    assert seen == [2, 3]
    assert len(consumer.called("assign")) == 1  # only the component's own


def test_a_read_barrier_ends_without_error_when_keep_going_turns_false():
    consumer = FakeConsumer(partitions={T: 1})
    consumer.set_watermarks(T, 0, high=3)  # records the consumer never gets
    consumer.assign([TopicPartition(T, 0, 0)])
    polls = itertools.count()

    assert not read_to_end(consumer, T, lambda m: None, partitions=[0], assign=False, timeout_s=30,
                           keep_going=lambda: next(polls) < 2)


def test_the_tail_reads_from_where_start_says():
    consumer = FakeConsumer(records(0, range(0, 10)) + records(1, range(0, 2)))
    seen: list[tuple[int, int]] = []

    assert read_to_end(consumer, T, lambda m: seen.append((m.partition(), m.offset())), timeout_s=30,
                       start=lambda low, end: end - 3)

    assert sorted(seen) == [(0, 7), (0, 8), (0, 9), (1, 0), (1, 1)]


def test_an_end_not_reached_by_the_deadline_names_the_topic_the_partitions_short_and_the_fix():
    consumer = FakeConsumer(records(0, range(0, 2)))
    consumer.set_watermarks(T, 0, high=5)  # three records the broker has but never hands out

    with pytest.raises(NotReadToEnd) as caught:
        read_to_end(consumer, T, lambda m: None, timeout_s=10, clock=ticking())

    text = str(caught.value)
    assert text.startswith(f"{T}: not read to its end within 10s")
    assert f"{T}[0] at 2 of 5" in text and "`sie topics list`" in text
    assert isinstance(caught.value, KafkaUnavailable) and caught.value.short == {(T, 0): (2, 5)}


def test_a_missing_topic_is_named_with_the_fix_or_read_as_empty_when_allowed():
    consumer = FakeConsumer(partitions={"other": 1})

    with pytest.raises(NotReadToEnd, match=r"sie.specs: the topic does not exist \(create it: `sie topics ensure`\)"):
        read_to_end(consumer, T, lambda m: None, timeout_s=5)
    assert read_to_end(consumer, T, lambda m: pytest.fail("nothing to read"), timeout_s=5, missing_ok=True)


def test_transient_refusals_of_the_end_offsets_are_retried_until_answered():
    not_leader = kafka_error(KafkaError.NOT_LEADER_FOR_PARTITION, "Broker: Not leader for partition")
    consumer = FakeConsumer(records(0, range(0, 2)), faults={"get_watermark_offsets": [not_leader, not_leader]})
    slept: list[float] = []

    assert watermarks(consumer, [(T, 0)], timeout_s=30, sleep=slept.append) == {(T, 0): (0, 2)}
    assert slept == [0.1, 0.2]  # backed off, bounded


def test_refusals_that_outlast_the_deadline_or_are_not_transient_raise_naming_the_topic():
    not_leader = kafka_error(KafkaError.NOT_LEADER_FOR_PARTITION, "Broker: Not leader for partition")
    consumer = FakeConsumer(records(0, range(0, 2)), faults={"get_watermark_offsets": not_leader})
    with pytest.raises(NotReadToEnd, match=r"^sie.specs: no end offsets within 3s \(last refusal: Broker: Not leader"):
        end_offsets(consumer, [(T, 0)], timeout_s=3, clock=ticking(), sleep=lambda s: None)

    denied = kafka_error(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization failed")
    consumer = FakeConsumer(records(0, range(0, 2)), faults={"get_watermark_offsets": [denied]})
    with pytest.raises(NotReadToEnd, match="its end offsets were refused .Broker: Topic authorization failed"):
        end_offsets(consumer, [(T, 0)], timeout_s=30, sleep=lambda s: pytest.fail("not retried"))

    consumer = FakeConsumer(records(0, range(0, 2)), faults={"get_watermark_offsets": [not_leader]})
    with pytest.raises(Exception, match="Not leader"):  # one try: the caller retries (retry_until_answered)
        end_offsets(consumer, [(T, 0)], timeout_s=0)


def test_consumer_errors_while_reading_go_to_on_error_and_a_fatal_one_is_raised():
    consumer = FakeConsumer(records(0, range(0, 2)))
    consumer.inject_error(KafkaError(KafkaError._TRANSPORT, "Local: Broker transport failure"))
    errors: list[str] = []
    assert read_to_end(consumer, T, lambda m: None, timeout_s=30, on_error=lambda m: errors.append(m.error().str()))
    assert errors == ["Local: Broker transport failure"]

    consumer = FakeConsumer(records(0, range(0, 2)))
    consumer.inject_error(KafkaError(KafkaError._FENCED, "Local: fenced", fatal=True))
    with pytest.raises(KafkaUnavailable, match="reading sie.specs: Local: fenced"):
        read_to_end(consumer, T, lambda m: None, timeout_s=30)


def test_one_try_waits_a_whole_request_for_the_answer_and_a_retried_read_never_past_its_deadline():
    class Asked:
        def __init__(self) -> None:
            self.timeouts: list[float] = []

        def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool) -> tuple[int, int]:
            self.timeouts.append(timeout)
            return 0, 1

    one_try = Asked()  # an agent retrying with retry_until_answered: a slow broker answers within 10 s
    assert end_offsets(one_try, [(T, 0)], timeout_s=0) == {(T, 0): 1} and one_try.timeouts == [10.0]
    bounded = Asked()
    end_offsets(bounded, [(T, 0)], timeout_s=3)
    assert 0.5 <= bounded.timeouts[0] <= 3
