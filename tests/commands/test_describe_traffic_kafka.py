"""`sie describe model`'s records per second count records, not offsets (issue 38, item 7): a scorer committing small
transactions writes a transaction marker per partition per commit, and above ``exact_below`` offsets the count was
the offsets' (``results 133.83/s`` for 100 requests/s in batches of 3).  Now a large span's last ``exact_below``
offsets are read and the span is scaled by their share of records."""

from __future__ import annotations

import pytest

from sie.commands._datapath import traffic
from sie.kernel.clients import KafkaClients, transactional_producer_config
from sie.kernel.settings import Settings
from tests.support.helpers import create_topic, unique_topic

pytestmark = pytest.mark.kafka


def test_small_transactions_are_counted_as_records_not_offsets(kafka_settings: Settings) -> None:
    topic = create_topic(kafka_settings, unique_topic("describe-rate"))
    producer = KafkaClients().producer(transactional_producer_config(kafka_settings, f"{topic}.txn"))
    producer.init_transactions(30)
    sent = 300
    for i in range(0, sent, 3):  # batches of 3, as a scorer at 100 requests/s commits them: a marker per 3 records
        producer.begin_transaction()
        for j in range(3):
            producer.produce(topic, value=b"{}", key=str(i + j).encode())
        producer.commit_transaction(30)
    large = traffic(kafka_settings, [topic], exact_below=100)[topic]  # 400 offsets in the window: sampled
    assert not large.exact
    assert abs(large.records - sent) <= 3, f"{large.records} records counted for {sent} sent (400 offsets)"
    exact = traffic(kafka_settings, [topic], exact_below=1000)[topic]  # read whole: exact
    assert exact.exact and exact.records == sent


def test_a_topic_ending_on_an_aborted_transaction_is_counted_at_once(kafka_settings: Settings) -> None:
    """Its end lies past the last record (the aborted records and their marker): the read ends when the position
    gets there (``sie.kernel.replay``'s rule), long before its deadline, with the committed records only."""
    import time

    topic = create_topic(kafka_settings, unique_topic("describe-aborted"))
    producer = KafkaClients().producer(transactional_producer_config(kafka_settings, f"{topic}.txn"))
    producer.init_transactions(30)
    for committed in (True, True, False):
        producer.begin_transaction()
        for j in range(3):
            producer.produce(topic, value=b"{}", key=str(j).encode())
        if committed:
            producer.commit_transaction(30)
        else:
            producer.flush(30)
            producer.abort_transaction(30)
    started = time.monotonic()
    counted = traffic(kafka_settings, [topic], exact_below=1000, timeout=20)[topic]
    assert counted.exact and counted.records == 6
    assert time.monotonic() - started < 15, "the read waited for a record past the topic's end"
