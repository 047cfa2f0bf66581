"""The test helpers' own contract, against the real broker: a helper that hits its deadline fails, it never
returns a partial answer, and reading "everything" means reading to the end of every partition.

Tests elsewhere prove exactly-once and "nothing else was written" with ``consume_all``; these prove that
such an assertion can fail.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from tests.support.helpers import consume_all, create_topic, produce_json, unique_topic
from tests.support.scorer_fixtures import CommittedReader

pytestmark = pytest.mark.kafka


@pytest.fixture()
def txn_producer(kafka_settings) -> Iterator[Producer]:
    producer = Producer(kafka_settings.kafka_client_config(**{"transactional.id": f"contract-{uuid.uuid4().hex[:8]}"}))
    producer.init_transactions(60)
    try:
        yield producer
    finally:
        producer.close()


def _committed(producer: Producer, topic: str, values: list[bytes]) -> None:
    producer.begin_transaction()
    for v in values:
        producer.produce(topic, v, partition=0)
    producer.commit_transaction(30)


def test_expected_n_raises_when_fewer_exist_naming_topic_and_count(kafka_settings):
    topic = create_topic(kafka_settings, unique_topic("contract"), partitions=2)
    produce_json(kafka_settings, topic, [{"n": i} for i in range(3)], key_fn=lambda r: str(r["n"]))
    with pytest.raises(AssertionError) as info:
        consume_all(kafka_settings, topic, expected=5, timeout=3)
    text = str(info.value)
    assert topic in text and "got 3 of 5 records" in text and "last records read" in text


def test_expected_none_returns_everything_to_the_end_of_every_partition(kafka_settings):
    topic = create_topic(kafka_settings, unique_topic("contract"), partitions=3)
    assert consume_all(kafka_settings, topic) == []  # an empty topic is at its end at once
    produce_json(kafka_settings, topic, [{"n": i} for i in range(60)], key_fn=lambda r: str(r["n"]))
    records = consume_all(kafka_settings, topic)
    assert sorted(r.json()["n"] for r in records) == list(range(60))
    assert len({r.partition for r in records}) == 3  # all three partitions were read, not the first to answer
    assert records == sorted(records, key=lambda r: (r.partition, r.offset))


def test_a_duplicate_beyond_n_is_returned_so_an_exact_count_fails(kafka_settings):
    topic = create_topic(kafka_settings, unique_topic("contract"), partitions=1)
    produce_json(kafka_settings, topic, [{"id": f"r{i}"} for i in range(5)] + [{"id": "r0"}])  # r0 twice
    records = consume_all(kafka_settings, topic, expected=5)
    assert len(records) == 6  # not trimmed to the 5 asked for
    assert Counter(r.json()["id"] for r in records)["r0"] == 2


def test_a_missing_topic_fails_at_the_deadline(kafka_settings):
    topic = unique_topic("contract-missing")
    with pytest.raises(AssertionError, match=f"topic {topic} to exist"):
        consume_all(kafka_settings, topic, timeout=2)


def test_read_committed_end_is_past_transaction_markers_and_before_an_open_transaction(kafka_settings, txn_producer):
    """The end is the last stable offset: commit markers after the last record do not leave the read short
    (a record's offset + 1 never reaches them), and an open transaction is neither waited for nor returned."""
    topic = create_topic(kafka_settings, unique_topic("contract"), partitions=1)
    producer = txn_producer
    _committed(producer, topic, [b"a", b"b"])
    producer.begin_transaction()
    for v in (b"x", b"y", b"z"):
        producer.produce(topic, v, partition=0)
    assert producer.flush(30) == 0  # written, not committed
    try:
        assert [r.value for r in consume_all(kafka_settings, topic)] == [b"a", b"b"]
        with pytest.raises(AssertionError, match="got 2 of 5 records"):
            consume_all(kafka_settings, topic, expected=5, timeout=3)
        assert [r.value for r in consume_all(kafka_settings, topic, isolation="read_uncommitted")] == [
            b"a", b"b", b"x", b"y", b"z"]
    finally:
        producer.commit_transaction(30)
    assert [r.value for r in consume_all(kafka_settings, topic, expected=5)] == [b"a", b"b", b"x", b"y", b"z"]


def test_committed_reader_reads_to_the_end_past_the_markers(kafka_settings, txn_producer):
    topic = create_topic(kafka_settings, unique_topic("contract"), partitions=1)
    for i in range(3):  # three transactions: a commit marker after each record
        _committed(txn_producer, topic, [b"%d" % i])
    reader = CommittedReader(kafka_settings, topic)
    try:
        assert reader.read_to_end(timeout=10) == 3
    finally:
        reader.close()
