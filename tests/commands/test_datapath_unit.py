"""`sie describe model` counts the records of an offset span by reading it until the consumer's position reaches
the span's end (``sie.kernel.replay.ReadProgress``), never by waiting for a record at ``end - 1``: a span that
ends on a commit marker or on an aborted transaction has no record there (issue 39)."""

from __future__ import annotations

from sie.commands._datapath import _count_exact
from sie.kernel.settings import Settings
from tests.fakes.kafka_clients import FakeConsumer, FakeMessage, fake_clients

TOPIC = "t.results"


def _never_idle(_consumer: FakeConsumer) -> None:
    raise AssertionError("the reader waited for a record past a span it had read to its end")


def test_spans_ending_on_a_marker_or_an_aborted_transaction_are_read_without_waiting() -> None:
    consumer = FakeConsumer([FakeMessage(TOPIC, 0, 0), FakeMessage(TOPIC, 0, 1),  # a committed transaction
                             FakeMessage(TOPIC, 1, 0), FakeMessage(TOPIC, 1, 2), FakeMessage(TOPIC, 1, 4)],
                            on_idle=_never_idle)
    consumer.add_marker(TOPIC, 0, 2)  # its commit marker
    for offset in (3, 4, 5):  # an aborted transaction (two records, its abort marker): the log's end is 6
        consumer.add_marker(TOPIC, 0, offset)
    for offset in (1, 3, 5):  # partition 1: one record per transaction; the span [0, 4) ends on a marker
        consumer.add_marker(TOPIC, 1, offset)
    clients = fake_clients(consumer=consumer)
    counts = _count_exact(Settings(), {(TOPIC, 0): (0, 6), (TOPIC, 1): (0, 4)}, timeout=30, clients=clients.clients)
    assert counts == {(TOPIC, 0): 2, (TOPIC, 1): 2}  # the record at offset 4 of partition 1 lies past its span
    assert consumer.closed
