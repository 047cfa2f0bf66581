"""W3C trace context in Kafka headers, and the OpenTelemetry spans SIE records: off by default, free when off.

A request is followed from its producer to its result by one header, ``traceparent`` (W3C Trace
Context, ``00-<trace id>-<span id>-<flags>``): ``sie produce`` (and the CDC stage, backfill) start a
trace and put the header on the request; the scorer continues it (spans for the queue wait, the
inference and the transaction commit, under one ``sie.score`` span) and puts its own ``traceparent``
on the result or the dead letter, so whoever reads the result can continue the same trace.

WHY parent-based: the producer decides (``SIE_TRACE_SAMPLE_RATIO``); a consumer records spans only
for requests whose header says "sampled", so the cost of tracing is bounded by the ratio chosen at the
edge, and a request without the header costs nothing at all.

Off (``SIE_TRACING=off``, the default) nothing of OpenTelemetry is imported and every hook is one
``if tracing.enabled`` per batch.  ``otlp`` exports over OTLP/HTTP to ``SIE_OTLP_ENDPOINT`` (a
collector, Jaeger, Tempo...); ``console`` prints spans (debugging).  Tests hand their own
``TracerProvider`` (an in-memory exporter) to ``Tracing``.

Headers are data: a consumer reads them only through ``sie.streams.eos.safe_headers`` (a header key
that is not UTF-8 crashes confluent-kafka otherwise) and hands the list here; a malformed
``traceparent`` is ignored, never formatted into a message or parsed further.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sie.kernel.errors import ConfigError

if TYPE_CHECKING:  # imported only when tracing is on
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span

TRACEPARENT = "traceparent"
#: version 00 of W3C Trace Context: 2 + 1 + 32 + 1 + 16 + 1 + 2 characters
_TRACEPARENT_LEN = 55
_TRACEPARENT_RE = re.compile(rb"\A00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}\Z")

HeaderList = Sequence[tuple[str, Any]]


def traceparent_of(headers: HeaderList | None) -> str | None:
    """The valid ``traceparent`` among ``headers`` (as ``safe_headers`` returned them), else None."""
    if not headers:
        return None
    for key, value in headers:
        if key == TRACEPARENT and type(value) is bytes and len(value) == _TRACEPARENT_LEN \
                and _TRACEPARENT_RE.match(value):
            return value.decode("ascii")
    return None


def trace_id_of(traceparent: str | bytes) -> str:
    """The 32-hex-digit trace id of a (valid) traceparent."""
    text = traceparent.decode("ascii") if isinstance(traceparent, bytes) else traceparent
    return text.split("-")[1]


def with_traceparent(headers: list[tuple[str, Any]] | None, value: bytes) -> list[tuple[str, Any]]:
    """``headers`` with its ``traceparent`` replaced by (or, if none, added as) ``value``."""
    kept = [(k, v) for k, v in headers or () if k != TRACEPARENT]
    kept.append((TRACEPARENT, value))
    return kept


class Tracing:
    """Starts spans and carries their context in ``traceparent`` headers; ``Tracing(None)`` does nothing."""

    def __init__(self, provider: TracerProvider | None = None, name: str = "sie") -> None:
        self.provider = provider
        self.enabled = provider is not None
        self._tracer = provider.get_tracer(name) if provider is not None else None
        self._propagator: Any = None
        if provider is not None:
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

            self._propagator = TraceContextTextMapPropagator()

    def start(self, name: str, *, parent: str | None = None, kind: str = "internal",
              start_ns: int | None = None, attributes: Mapping[str, Any] | None = None) -> Span | None:
        """A started span (end it with ``span.end(end_time=...)``), child of the ``parent`` traceparent
        or a new trace; None when tracing is off, or when a parent says "not sampled"."""
        if self._tracer is None:
            return None
        from opentelemetry.trace import SpanKind

        context = self._propagator.extract({TRACEPARENT: parent}) if parent is not None else None
        span = self._tracer.start_span(name, context=context, kind=SpanKind[kind.upper()],
                                       attributes=dict(attributes or {}), start_time=start_ns)
        if not span.get_span_context().trace_flags.sampled:
            return None  # not recorded: nothing downstream should continue it either
        return span

    def child(self, parent: Span, name: str, start_ns: int, end_ns: int,
              attributes: Mapping[str, Any] | None = None) -> None:
        """A finished child span of ``parent`` covering [start_ns, end_ns] (times measured elsewhere)."""
        if self._tracer is None:
            return
        from opentelemetry.trace import set_span_in_context

        span = self._tracer.start_span(name, context=set_span_in_context(parent), attributes=dict(attributes or {}),
                                       start_time=start_ns)
        span.end(end_time=max(start_ns, end_ns))

    @staticmethod
    def traceparent(span: Span) -> bytes:
        """The ``traceparent`` header value that makes ``span`` the parent of what reads the record."""
        ctx = span.get_span_context()
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}".encode("ascii")

    def flush(self, timeout_s: float = 5.0) -> None:
        """Export what is buffered (a process about to exit, a test about to look)."""
        if self.provider is not None:
            self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


DISABLED = Tracing(None)


def tracing_from_settings(settings: Any, service: str) -> Tracing:
    """The tracing a process was configured with (``SIE_TRACING``): ``DISABLED`` unless asked for."""
    mode = getattr(settings, "tracing", "off")
    if mode == "off":
        return DISABLED
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError:
        raise ConfigError(f"SIE_TRACING={mode}: the OpenTelemetry SDK is not installed; "
                          "pip install 'sie[tracing]' or set SIE_TRACING=off") from None
    exporter: SpanExporter
    if mode == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ConfigError("SIE_TRACING=otlp: opentelemetry-exporter-otlp-proto-http is not installed; "
                              "pip install 'sie[tracing]'") from None
        exporter = OTLPSpanExporter(endpoint=settings.otlp_endpoint)
    elif mode == "console":
        exporter = ConsoleSpanExporter(service_name=service)
    else:
        raise ConfigError(f"SIE_TRACING: must be off, otlp or console (got {mode!r})")
    provider = TracerProvider(resource=Resource.create({"service.name": service}),
                              sampler=ParentBased(TraceIdRatioBased(float(settings.trace_sample_ratio))))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return Tracing(provider)
