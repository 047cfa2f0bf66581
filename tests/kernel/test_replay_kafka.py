"""``sie.kernel.replay`` on a real broker: a compacted topic written transactionally, whose partitions end on a
commit marker, on an aborted transaction, and on a transaction still open, read to its end (catch-up) and
again after more commits (read barrier).  What the fakes in test_replay.py assume, checked here: the
consumer's position passes markers and aborted records, and a read_committed end is the last stable offset."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from sie.kernel.clients import KafkaClients, state_reader_config, transactional_producer_config
from sie.kernel.replay import read_to_end, watermarks
from sie.kernel.settings import Settings
from tests.support.helpers import create_topic, unique_topic

pytestmark = pytest.mark.kafka


def _producer(settings: Settings) -> Any:
    producer = KafkaClients().producer(transactional_producer_config(settings, f"test.replay.{uuid.uuid4().hex[:8]}"))
    producer.init_transactions(30)
    return producer


def _transaction(producer: Any, topic: str, partition: int, keys: list[str], *, commit: bool) -> None:
    producer.begin_transaction()
    for key in keys:
        producer.produce(topic, key=key.encode(), value=f"value of {key}".encode(), partition=partition)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


@pytest.fixture()
def topic(kafka_settings: Settings) -> Iterator[str]:
    name = unique_topic("test.replay")
    create_topic(kafka_settings, name, partitions=3, config={"cleanup.policy": "compact"})
    yield name


def _reader(settings: Settings, eof: bool) -> Any:
    names = settings.names
    return KafkaClients().consumer(state_reader_config(
        settings, names.reader_group("test-replay", uuid.uuid4().hex[:8]), names.reader_client_id("test-replay"),
        partition_eof=eof))


@pytest.mark.parametrize("eof", [False, True], ids=["by-position", "with-eof-events"])
def test_a_transactional_topic_is_read_to_its_end_past_commit_and_abort_markers_and_not_into_an_open_transaction(
        kafka_settings: Settings, topic: str, eof: bool) -> None:
    writer, open_writer = _producer(kafka_settings), _producer(kafka_settings)
    try:
        _transaction(writer, topic, 0, ["a", "b", "c"], commit=True)  # p0 ends on a commit marker
        _transaction(writer, topic, 1, ["d"], commit=True)
        _transaction(writer, topic, 1, ["x", "y"], commit=False)  # p1 ends on an aborted transaction
        _transaction(writer, topic, 2, ["e"], commit=True)
        open_writer.begin_transaction()  # p2 ends on a transaction still open: not part of "the end now"
        open_writer.produce(topic, key=b"open", value=b"not committed", partition=2)
        open_writer.flush(30)

        probe = _reader(kafka_settings, eof)
        try:
            marks = watermarks(probe, [(topic, p) for p in range(3)], timeout_s=30)
        finally:
            probe.close()
        # offsets count the markers: 3 records + a commit marker; 1 record + its marker + 2 aborted + the abort marker;
        # the last stable offset of p2 stops before the open transaction's first record
        assert marks == {(topic, 0): (0, 4), (topic, 1): (0, 5), (topic, 2): (0, 2)}

        consumer = _reader(kafka_settings, eof)
        seen: list[tuple[int, bytes]] = []
        try:
            assert read_to_end(consumer, topic, lambda m: seen.append((m.partition(), m.key())), timeout_s=60)
            positions = {tp.partition: tp.offset for tp in consumer.position([TopicPartition(topic, p)
                                                                              for p in range(3)])}
        finally:
            consumer.close()
        assert sorted(seen) == [(0, b"a"), (0, b"b"), (0, b"c"), (1, b"d"), (2, b"e")]
        if not eof:  # what "read to the end" relied on: the position passed the trailing markers
            assert positions[0] >= 4 and positions[1] >= 5
    finally:
        open_writer.abort_transaction(30)
        writer.flush(10)


def test_a_read_barrier_reads_what_was_committed_after_the_catch_up_and_nothing_aborted(
        kafka_settings: Settings, topic: str) -> None:
    writer = _producer(kafka_settings)
    consumer = _reader(kafka_settings, eof=False)
    seen: list[bytes] = []
    try:
        _transaction(writer, topic, 0, ["a"], commit=True)
        assert read_to_end(consumer, topic, lambda m: seen.append(m.key()), timeout_s=60)
        _transaction(writer, topic, 0, ["b", "c"], commit=True)
        _transaction(writer, topic, 1, ["aborted"], commit=False)
        _transaction(writer, topic, 2, ["d"], commit=True)

        assert read_to_end(consumer, topic, lambda m: seen.append(m.key()), timeout_s=60, assign=False)
    finally:
        consumer.close()
        writer.flush(10)
    assert sorted(seen) == [b"a", b"b", b"c", b"d"]
