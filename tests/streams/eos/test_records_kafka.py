"""``safe_headers`` against a real record whose header key is not UTF-8 (confluent-kafka builds a tuple
with a NULL item for it: touching that item would crash the interpreter)."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition

from sie.streams.eos import safe_headers
from tests.streams.scorer.test_scorer_hostile_kafka import _produce_with_raw_header_key

pytestmark = pytest.mark.kafka


def test_safe_headers_survives_repeated_reads_of_an_undecodable_header_key(kafka_settings):
    topic = f"test.rawhdr.{uuid.uuid4().hex[:8]}"
    _produce_with_raw_header_key(kafka_settings.bootstrap_servers, topic, b"v")
    consumer = Consumer(kafka_settings.kafka_client_config(**{"group.id": f"g-{uuid.uuid4().hex[:8]}",
                                                              "auto.offset.reset": "earliest"}))
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        msg = None
        for _ in range(100):
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                break
        assert msg is not None and msg.error() is None, "the record never arrived"
        # many reads: a warm call site is where CPython 3.11 once let the broken list through
        assert all(safe_headers(msg) is None for _ in range(500))
        # the broken list was replaced: any later reader is safe, and sees why
        assert [k for k, _v in msg.headers()] == ["sie.headers.dropped"]
    finally:
        consumer.close()
