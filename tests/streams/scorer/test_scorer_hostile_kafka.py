"""Hostile records and faults that used to stall or crash the scorer, on the real broker (issue 9).

Each test ends with the exactly-once proof (every request id answered once: a result or a dead letter)
and a bound on aborted transactions: a record that cannot be written never aborts its batch in a loop.
"""

from __future__ import annotations

import asyncio
import os
import time

import orjson
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from sie.kernel.admin import ensure_model_topics
from tests.support.helpers import wait_until
from tests.support.scorer_fixtures import (
    CommittedReader,
    ScorerThread,
    echo_spec,
    produce_requests,
    prove_exactly_once,
    requests,
    topics_for,
)

pytestmark = pytest.mark.kafka


def _headers(msg) -> dict[str, bytes]:
    return dict(msg.headers() or [])


def test_a_999900_byte_non_json_request_is_one_dead_letter_among_100_results(kafka_settings):
    """Issue 9, case 1: with SIE's default limits the dead letter (the whole original + sie.* headers) fits."""
    spec = echo_spec()
    topics_for(kafka_settings, spec, partitions=2)
    big = b"\x00not json" + b"x" * (999_900 - 9)
    reqs = requests(50) + [(b"big", big)] + requests(50, prefix="s")
    produce_requests(kafka_settings, spec.topics.requests, reqs)
    scorer = ScorerThread(kafka_settings, spec)
    try:
        ids = {f"r{i}" for i in range(50)} | {f"s{i}" for i in range(50)}
        results = CommittedReader(kafka_settings, spec.topics.results)
        dlq = CommittedReader(kafka_settings, spec.topics.dead_letters)
        try:
            wait_until(lambda: results.count() >= 100 and dlq.count() >= 1, 60,
                       message=lambda: f"100 results + 1 dead letter ({len(results.records)} + {len(dlq.records)})")
            assert results.read_to_end() == 100 and dlq.read_to_end() == 1
            topic_ids = {orjson.loads(m.value())["id"] for m in results.records}
            (letter,) = dlq.records
        finally:
            results.close()
            dlq.close()
    finally:
        summary = scorer.close()
    assert topic_ids == ids
    assert _headers(letter)["sie.reason"] == b"invalid_json"
    assert letter.value() == big  # the whole original: it fits the default record limit
    assert summary.aborts == 0, summary


def test_a_dead_letter_larger_than_the_record_limit_is_cut_to_fit(kafka_settings):
    """A small max_record_bytes: the original cannot travel whole; its prefix and coordinates do."""
    settings = kafka_settings.with_overrides(max_record_bytes=65_536)
    spec = echo_spec()
    t = spec.topics
    ensure_model_topics(settings, [t.results, t.dead_letters], 2)
    # the request topic is someone else's, with a larger record limit than SIE writes
    admin = AdminClient(kafka_settings.kafka_client_config())
    admin.create_topics([NewTopic(t.requests, 2, 1, config={"max.message.bytes": "2000000"})])[t.requests].result(30)
    big = b"{" + b"y" * 199_999
    produce_requests(kafka_settings, t.requests, requests(20) + [(b"big", big)])
    scorer = ScorerThread(settings, spec)
    try:
        results = CommittedReader(settings, t.results)
        dlq = CommittedReader(settings, t.dead_letters)
        try:
            wait_until(lambda: results.count() >= 20 and dlq.count() >= 1, 60,
                       message=lambda: f"20 results + 1 dead letter ({len(results.records)} + {len(dlq.records)})")
            assert results.read_to_end() == 20 and dlq.read_to_end() == 1
            (letter,) = dlq.records
        finally:
            results.close()
            dlq.close()
    finally:
        summary = scorer.close()
    h = _headers(letter)
    assert h["sie.reason"] == b"invalid_json"
    assert b"value kept" in h["sie.truncated"] and b"of 200000 bytes" in h["sie.truncated"]
    assert big.startswith(letter.value()) and 0 < len(letter.value()) < 65_536
    assert h["sie.source.topic"] == t.requests.encode() and int(h["sie.source.offset"]) >= 0
    assert summary.aborts == 0, summary


def test_a_result_too_large_for_the_record_limit_becomes_a_result_too_large_dead_letter(kafka_settings):
    """A valid request whose metadata makes its result larger than the producer may write."""
    settings = kafka_settings.with_overrides(max_record_bytes=65_536)
    spec = echo_spec()
    t = spec.topics
    ensure_model_topics(settings, [t.results, t.dead_letters], 2)
    admin = AdminClient(kafka_settings.kafka_client_config())
    admin.create_topics([NewTopic(t.requests, 2, 1, config={"max.message.bytes": "2000000"})])[t.requests].result(30)
    fat = orjson.dumps({"id": "fat", "inputs": {"x": 1.0}, "metadata": {"blob": "z" * 70_000}})
    produce_requests(kafka_settings, t.requests, requests(30) + [(b"fat", fat)])
    scorer = ScorerThread(settings, spec)
    try:
        results = CommittedReader(settings, t.results)
        dlq = CommittedReader(settings, t.dead_letters)
        try:
            wait_until(lambda: results.count() >= 30 and dlq.count() >= 1, 60,
                       message=lambda: f"30 results + 1 dead letter ({len(results.records)} + {len(dlq.records)})")
            assert results.read_to_end() == 30 and dlq.read_to_end() == 1
            records, dead = results.records, dlq.records
        finally:
            results.close()
            dlq.close()
    finally:
        summary = scorer.close()
    assert {orjson.loads(m.value())["id"] for m in records} == {f"r{i}" for i in range(30)}
    h = _headers(dead[0])
    assert h["sie.reason"] == b"result_too_large" and b"refused by the producer" in h["sie.detail"]
    assert fat.startswith(dead[0].value()) and b"value kept" in h["sie.truncated"]  # the request, cut to fit
    assert summary.dead_letters == 1 and summary.results == 30 and summary.aborts == 0, summary


def _produce_with_raw_header_key(bootstrap: str, topic: str, value: bytes) -> None:
    """A record whose header key is not UTF-8 (librdkafka-based clients cannot write one; aiokafka's pure
    Python record builder can, given a key that encodes to raw bytes)."""
    os.environ.setdefault("AIOKAFKA_NO_EXTENSIONS", "1")
    from aiokafka import AIOKafkaProducer
    from aiokafka.record import default_records

    if getattr(default_records, "_DefaultRecordBatchBuilderCython", None) is not None and \
            default_records.DefaultRecordBatchBuilder is default_records._DefaultRecordBatchBuilderCython:
        pytest.skip("aiokafka's C record builder is loaded; it encodes header keys itself")

    class RawKey(str):
        def encode(self, *_a: object, **_k: object) -> bytes:  # type: ignore[override]
            return b"\xff\xfe-not-utf8"

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(topic, value, key=b"raw", headers=[(RawKey("x"), b"v")])
        finally:
            await producer.stop()

    asyncio.run(send())


def test_a_poison_record_with_a_non_utf8_header_key_is_dead_lettered_without_its_headers(kafka_settings):
    """Issue 9, case 6: reading such headers raises SystemError in confluent-kafka; the stage survives."""
    spec = echo_spec()
    topics_for(kafka_settings, spec, partitions=1)
    produce_requests(kafka_settings, spec.topics.requests, requests(10))
    _produce_with_raw_header_key(kafka_settings.bootstrap_servers, spec.topics.requests, b"{broken")
    produce_requests(kafka_settings, spec.topics.requests, requests(10, prefix="s"))
    scorer = ScorerThread(kafka_settings, spec)
    try:
        results = CommittedReader(kafka_settings, spec.topics.results)
        dlq = CommittedReader(kafka_settings, spec.topics.dead_letters)
        try:
            wait_until(lambda: results.count() >= 20 and dlq.count() >= 1, 60,
                       message=lambda: f"20 results + 1 dead letter ({len(results.records)} + {len(dlq.records)})")
            assert results.read_to_end() == 20 and dlq.read_to_end() == 1
            (letter,) = dlq.records
        finally:
            results.close()
            dlq.close()
    finally:
        summary = scorer.close()
    h = _headers(letter)
    assert h["sie.reason"] == b"invalid_json" and "sie.headers.dropped" in h
    assert letter.value() == b"{broken"
    assert summary.aborts == 0


def test_partitions_added_to_the_request_topic_while_scoring(kafka_settings):
    """Issue 9, case 8: requests on the new partitions are answered (by key) instead of looping on an
    unknown result partition."""
    spec = echo_spec()
    topics_for(kafka_settings, spec, partitions=2)
    produce_requests(kafka_settings, spec.topics.requests, requests(200))
    scorer = ScorerThread(kafka_settings, spec)
    try:
        results = CommittedReader(kafka_settings, spec.topics.results)
        try:
            wait_until(lambda: results.count() >= 200, 60, message="the first 200 results")
        finally:
            results.close()
        admin = AdminClient(kafka_settings.kafka_client_config())
        admin.create_partitions([NewPartitions(spec.topics.requests, 4)])[spec.topics.requests].result(30)
        producer = Producer(kafka_settings.kafka_client_config())
        for i in range(200):  # explicitly onto the new partitions 2 and 3
            producer.produce(spec.topics.requests, orjson.dumps({"id": f"n{i}", "inputs": {"x": float(i)}}),
                             f"n{i}".encode(), partition=2 + i % 2)
        assert producer.flush(30) == 0
        records, dead = prove_exactly_once(kafka_settings, spec, {f"r{i}" for i in range(200)}
                                           | {f"n{i}" for i in range(200)}, timeout=90)
    finally:
        summary = scorer.close()
    assert dead == [] and len(records) == 400
    assert summary.aborts <= 2, summary  # at most the batches in flight while the metadata changed


def test_backend_outage_during_bisection_dead_letters_nothing_healthy(kafka_settings, tmp_path):
    """Issue 9, case 5: the model goes down in the middle of isolating one poison row; the batch is
    retried once it is back, and only the poison row becomes a dead letter."""
    from tests.support.scorer_fixtures import POISON_X

    flag = tmp_path / "down"
    spec = echo_spec()
    topics_for(kafka_settings, spec, partitions=1)
    reqs = requests(40) + [(b"p", orjson.dumps({"id": "poison", "inputs": {"x": POISON_X}}))]
    produce_requests(kafka_settings, spec.topics.requests, reqs)
    calls = {"n": 0}

    def backend_factory(spec_):
        from tests.support.scorer_fixtures import load_echo_backend

        real = load_echo_backend(spec_)

        class GoesDown:
            """Goes down in the middle of isolating the poison row, right after the first half of the
            poisoned batch has scored, for 1.5 s: longer than the rest of the bisection and the individual
            retries (milliseconds), so only the known-good probe can tell it is an outage."""

            armed = False
            down_until = 0.0

            def infer(self, rows):
                calls["n"] += 1
                if time.monotonic() < self.down_until:
                    raise RuntimeError("backend connection refused")
                if len(rows) > 1 and any(r["x"] == POISON_X for r in rows):
                    self.armed = True  # bisection starts
                out = real.infer(rows)
                if self.armed and not flag.exists():
                    flag.write_text("down")
                    self.down_until = time.monotonic() + 1.5
                return out

        return GoesDown()

    scorer = ScorerThread(kafka_settings, spec, backend_factory=backend_factory, max_batch=64)
    try:
        records, dead = prove_exactly_once(kafka_settings, spec, {f"r{i}" for i in range(40)} | {"poison"})
    finally:
        scorer.close()
    assert flag.exists(), "the backend never went down: the test did not exercise the outage"
    assert [_headers(m)["sie.reason"] for m in dead] == [b"inference_error"]
    assert orjson.loads(dead[0].value())["id"] == "poison" and len(records) == 40



def test_inference_slower_than_the_transaction_timeout_still_commits(kafka_settings):
    """Issue 9, case 7: outputs are prepared before the transaction opens, so a batch whose inference
    takes longer than transaction.timeout.ms commits instead of aborting and retrying forever."""
    spec = echo_spec()
    topics_for(kafka_settings, spec, partitions=1)
    produce_requests(kafka_settings, spec.topics.requests, requests(30))

    def slow_backend(spec_):
        from tests.support.scorer_fixtures import load_echo_backend

        real = load_echo_backend(spec_)

        class Slow:
            def infer(self, rows):
                time.sleep(2.5)  # the model's own latency (not test synchronisation): > the 2 s timeout
                return real.infer(rows)

        return Slow()

    scorer = ScorerThread(kafka_settings, spec, backend_factory=slow_backend, transaction_timeout_ms=2000,
                          max_batch=16)
    try:
        records, dead = prove_exactly_once(kafka_settings, spec, {f"r{i}" for i in range(30)}, timeout=90)
    finally:
        summary = scorer.close()
    assert dead == [] and len(records) == 30
    assert summary.aborts == 0, summary
