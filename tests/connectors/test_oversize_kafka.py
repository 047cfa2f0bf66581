"""One 999,900-byte non-JSON record among 100 valid ones, through the CDC stage and backfill (issue 9,
case 1): 100 outputs and 1 dead letter, no aborted transaction; the scorer's version of this test is in
tests/streams/scorer/test_scorer_hostile_kafka.py."""

from __future__ import annotations

import uuid

import pytest

from sie.kernel.names import Names
from tests.connectors.test_backfill import make_spec, produce_timed, run_job
from tests.connectors.test_cdc_stage import StageThread, Topics, canal_row_event, connector, produce
from tests.support.helpers import consume_all, wait_until

pytestmark = pytest.mark.kafka

BIG = b"\x00not json" + b"x" * (999_900 - 9)


def test_cdc_stage_dead_letters_a_999900_byte_event_and_converts_the_100_around_it(kafka_settings):
    topics = Topics(kafka_settings, source_partitions=1)
    events = [(str(i).encode(), canal_row_event("INSERT", [{
        "id": str(100 + i), "customer_id": "1", "amount": "1.00", "currency": "EUR", "is_first_order": "0",
        "created_at": "2021-01-15 02:12:04"}])) for i in range(100)]
    produce(kafka_settings, topics.source, events[:50] + [(b"big", BIG)] + events[50:])
    stage = StageThread(kafka_settings, connector(topics, "canal-json"), topics)
    try:
        wait_until(lambda: stage.records_done() >= 101, 60,
                   message=lambda: f"101 source records committed (have {stage.records_done()})")
    finally:
        summary = stage.close()
    requests = consume_all(kafka_settings, topics.requests, expected=100, timeout=30)
    (letter,) = consume_all(kafka_settings, topics.dlq, expected=1, timeout=30)
    assert len(requests) == 100
    assert letter.headers["sie.reason"] == b"invalid_json" and letter.value == BIG
    assert summary.aborts == 0, summary


def test_backfill_dead_letters_a_999900_byte_request_and_scores_the_100_around_it(kafka_settings):
    spec = make_spec(kafka_settings, partitions=1)
    produce_timed(kafka_settings, spec.topics.requests, 101, 1, poison={50: BIG})
    report, _lines = run_job(kafka_settings, spec, f"big-{uuid.uuid4().hex[:6]}", "earliest", "now")
    assert report.complete and report.scored == 100 and report.dead_letters == {"invalid_json": 1}
    assert report.aborts == 0
    results = consume_all(kafka_settings, spec.topics.backfill, expected=100, timeout=30)
    (letter,) = consume_all(kafka_settings, Names.backfill_dead_letter_topic(spec.topics.backfill), expected=1, timeout=30)
    assert len(results) == 100 and letter.value == BIG
