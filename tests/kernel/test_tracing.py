"""``sie.kernel.tracing``: traceparent headers read as untrusted data, nothing at all while tracing is off,
and the connectors' hand-over of a trace from a source record to what it becomes."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sie.connectors.tracing import carry_traces
from sie.kernel.settings import Settings
from sie.kernel.tracing import (
    DISABLED,
    TRACEPARENT,
    Tracing,
    trace_id_of,
    traceparent_of,
    tracing_from_settings,
    with_traceparent,
)
from sie.streams.eos.records import Output
from tests.fakes.kafka_clients import FakeMessage

GOOD = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def memory_tracing() -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider), exporter


@pytest.mark.parametrize("value", [
    b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",          # no flags
    b"00-00000000000000000000000000000000-b7ad6b7169203331-01",       # zero trace id
    b"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",       # zero span id
    b"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",       # unknown version
    b"00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",       # upper case
    GOOD + b"\n", b"\xff" * 55, b"", None, "not bytes",
])
def test_a_malformed_traceparent_is_ignored(value):
    assert traceparent_of([("other", b"x"), (TRACEPARENT, value)]) is None


def test_a_valid_traceparent_is_found_and_replaced():
    headers = [("a", b"1"), (TRACEPARENT, GOOD)]
    assert traceparent_of(headers) == GOOD.decode()
    assert trace_id_of(GOOD) == "0af7651916cd43dd8448eb211c80319c"
    assert with_traceparent(headers, b"x") == [("a", b"1"), (TRACEPARENT, b"x")]
    assert with_traceparent(None, b"x") == [(TRACEPARENT, b"x")]
    assert traceparent_of(None) is None and traceparent_of([]) is None


def test_off_is_the_default_and_does_nothing():
    assert tracing_from_settings(Settings(), "t") is DISABLED
    assert not DISABLED.enabled and DISABLED.start("x") is None
    DISABLED.flush()


@pytest.mark.parametrize("mode", ["otlp", "console"])
def test_on_builds_a_sampling_provider(mode):
    tracing = tracing_from_settings(Settings(tracing=mode, trace_sample_ratio=0.0), "t")
    try:
        assert tracing.enabled
        assert tracing.start("root") is None  # ratio 0: a new trace is not sampled, so nothing is sent on
        child = tracing.start("child", parent=GOOD.decode())  # a sampled parent is followed regardless
        assert child is not None and Tracing.traceparent(child).split(b"-")[1] == GOOD.split(b"-")[1]
        child.end()
    finally:
        tracing.shutdown()


def test_a_child_span_continues_the_trace_and_not_sampled_parents_are_not_followed():
    tracing, exporter = memory_tracing()
    span = tracing.start("s", parent=GOOD.decode(), kind="consumer")
    tracing.child(span, "c", 10, 20)
    span.end()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert f"{spans['s'].context.trace_id:032x}" == trace_id_of(GOOD)
    assert spans["s"].parent.span_id == int(GOOD.split(b"-")[2], 16)
    assert spans["c"].parent.span_id == spans["s"].context.span_id
    assert (spans["c"].start_time, spans["c"].end_time) == (10, 20)
    assert tracing.start("s", parent=GOOD.decode()[:-2] + "00") is None  # the producer said: not sampled


def test_cdc_starts_traces_backfill_only_continues_them_and_dead_letters_keep_their_headers():
    tracing, exporter = memory_tracing()
    traced = FakeMessage("src", 0, 1, headers=[(TRACEPARENT, GOOD)])
    plain = FakeMessage("src", 0, 2)
    outs = [Output("req", b"a", source=traced, kind="request"), Output("req", b"b", source=traced, kind="request"),
            Output("req", b"c", source=plain, kind="request"),
            Output("dlq", b"d", headers=[("sie.reason", b"x")], source=plain, kind="dead_letter")]
    carry_traces(tracing, "sie.cdc c", outs, start_new=True)
    a, b, c, d = (traceparent_of(o.headers) for o in outs)
    assert a == b and trace_id_of(a) == trace_id_of(GOOD) and a != GOOD.decode()  # one span per source record
    assert c is not None and trace_id_of(c) != trace_id_of(GOOD)  # a new trace for the untraced row
    assert d is None
    assert len(exporter.get_finished_spans()) == 2
    plain_out = Output("res", b"e", source=FakeMessage("src", 0, 3), kind="result")
    carry_traces(tracing, "sie.backfill j", [plain_out], start_new=False)
    assert plain_out.headers is None and len(exporter.get_finished_spans()) == 2
