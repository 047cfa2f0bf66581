"""Trace context through the connectors: a CDC row or a backfilled request hands its trace on to what it becomes.

The CDC stage is where a request is born from a database change, so it starts a trace for a source
record that carries none (sampled at ``SIE_TRACE_SAMPLE_RATIO``) and continues one that does; backfill
re-scores history in bulk, so it only continues traces its records already carry (a new trace per
backfilled record would be noise at backfill volumes).  Either way one span per source record, and its
``traceparent`` on every record produced from it; dead letters keep their source's own headers.
Only called while tracing is on (``Tracing.enabled``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sie.kernel.tracing import Tracing, traceparent_of, with_traceparent
from sie.streams.eos import safe_headers
from sie.streams.eos.deadletter import DEAD_LETTER
from sie.streams.eos.records import Output


def carry_traces(tracing: Tracing, name: str, outputs: Iterable[Output], *, start_new: bool,
                 attributes: Mapping[str, Any] | None = None) -> None:
    """Give every non-dead-letter output the ``traceparent`` of a span for its source record."""
    by_source: dict[int, bytes | None] = {}
    for out in outputs:
        if out.kind == DEAD_LETTER or out.source is None:
            continue
        key = id(out.source)
        if key not in by_source:
            parent = traceparent_of(safe_headers(out.source))
            span = None
            if parent is not None or start_new:
                span = tracing.start(name, parent=parent, kind="consumer", attributes={
                    **(attributes or {}), "messaging.system": "kafka",
                    "messaging.destination.name": out.source.topic(),
                    "messaging.kafka.partition": out.source.partition(),
                    "messaging.kafka.offset": out.source.offset()})
            by_source[key] = Tracing.traceparent(span) if span is not None else None
            if span is not None:
                span.end()
        value = by_source[key]
        if value is not None:
            out.headers = with_traceparent(out.headers, value)
