"""One request's trace, end to end on a real broker: ``sie produce``'s producer span -> the scorer's
queue wait -> inference -> transaction commit, and the same trace id on the result record's headers
(and on a dead letter's). Spans go to an in-memory exporter; a request sent without a traceparent
costs the scorer no span at all."""

from __future__ import annotations

import orjson
import pytest
from confluent_kafka import Producer
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sie.connectors.producer import RequestProducer
from sie.kernel.tracing import TRACEPARENT, Tracing, traceparent_of
from sie.streams.scorer.metrics import ScorerMetrics
from tests.support.helpers import wait_until
from tests.support.scorer_fixtures import POISON_X, ScorerThread, echo_spec, prove_exactly_once, topics_for

pytestmark = pytest.mark.kafka


def test_one_requests_spans_from_producer_to_commit_with_its_trace_id_on_the_result(kafka_settings):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider)
    spec = echo_spec()
    topics_for(kafka_settings, spec, partitions=2)

    producer = RequestProducer(kafka_settings, spec.topics.requests, tracing=tracing)
    for i in range(5):
        producer.send({"id": f"r{i}", "inputs": {"x": float(i)}}, key=f"k{i}")
    producer.send({"id": "poison", "inputs": {"x": POISON_X}}, key="kp")
    producer.flush(30)
    plain = Producer(kafka_settings.kafka_client_config())
    plain.produce(spec.topics.requests, orjson.dumps({"id": "untraced", "inputs": {"x": 9.0}}), key=b"ku")
    assert plain.flush(30) == 0

    metrics = ScorerMetrics.for_spec(spec)
    scorer = ScorerThread(kafka_settings, spec, instance="trace-0", scorer_kwargs={"tracing": tracing, "metrics": metrics})
    try:
        results, dead = prove_exactly_once(kafka_settings, spec, {*(f"r{i}" for i in range(5)), "poison", "untraced"})
        # the commit spans end when the commit returned: wait for the scorer to have finished them
        wait_until(lambda: len([s for s in exporter.get_finished_spans() if s.name.startswith("sie.score")]) == 6,
                   30, "six sie.score spans (five results, one dead letter)")
    finally:
        scorer.close()

    spans = exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}
    result = next(m for m in results if orjson.loads(m.value())["id"] == "r3")
    header = traceparent_of(result.headers())
    assert header is not None, result.headers()
    _v, trace_hex, span_hex, flags = header.split("-")
    assert int(flags, 16) & 1  # sampled

    # the result names its sie.score span; that span is the child of the request's producer span
    score = by_id[int(span_hex, 16)]
    assert score.name == f"sie.score {spec.name}" and score.attributes["sie.outcome"] == "result"
    assert f"{score.context.trace_id:032x}" == trace_hex
    produce = by_id[score.parent.span_id]
    assert produce.name == f"sie.produce {spec.topics.requests}" and produce.attributes["sie.request_id"] == "r3"
    assert produce.parent is None and produce.kind.name == "PRODUCER" and score.kind.name == "CONSUMER"

    # queue -> inference -> commit, in that order, inside the score span, in the same trace
    children = {s.name: s for s in spans if s.parent is not None and s.parent.span_id == score.context.span_id}
    assert set(children) == {"sie.queue", "sie.inference", "sie.commit"}
    queue, inference, commit = children["sie.queue"], children["sie.inference"], children["sie.commit"]
    assert all(s.context.trace_id == score.context.trace_id for s in children.values())
    assert score.start_time == queue.start_time <= queue.end_time <= inference.start_time <= inference.end_time
    assert inference.end_time <= commit.start_time <= commit.end_time == score.end_time
    assert produce.start_time <= queue.start_time + 1_000_000  # the record's timestamp (ms) vs the span's (ns)
    assert inference.attributes["sie.batch_size"] >= 1

    # the dead letter of the poison request carries its trace on too
    (poisoned,) = dead
    dead_header = traceparent_of(poisoned.headers())
    poison_produce = next(s for s in spans if s.attributes.get("sie.request_id") == "poison")
    assert dead_header is not None and int(dead_header.split("-")[1], 16) == poison_produce.context.trace_id
    assert by_id[int(dead_header.split("-")[2], 16)].attributes["sie.outcome"] == "dead_letter"

    # a request without a traceparent: no span, no header
    untraced = next(m for m in results if orjson.loads(m.value())["id"] == "untraced")
    assert not [h for h in untraced.headers() or () if h[0] == TRACEPARENT]
    assert len([s for s in spans if s.name.startswith("sie.produce")]) == 6
    # and the per-request latency histogram counted each result
    assert metrics.value("sie_request_latency_seconds_count", {
        "model_id": spec.name, "service_type": "scoring", "priority_level": "P1", "version": "1.0.0"}) == 6
