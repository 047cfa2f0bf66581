"""JSON request producer: what services (and `sie produce`) use to send scoring requests.

Requests are validated against the model's ``input_schema`` *before* they are sent (optional), so
a caller learns about a bad payload at once instead of finding it later in the dead-letter topic.
The producer is idempotent (``enable.idempotence``, ``acks=all``): a retry inside librdkafka never
duplicates a request.  Delivery failures are counted and reported, never dropped silently.

With tracing on (``SIE_TRACING``, ``sie.kernel.tracing``) each sampled request gets a producer span
(ended when the broker acknowledges it) and its ``traceparent`` header: the scorer continues that trace.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import orjson

from sie.kernel.errors import SieError
from sie.kernel.settings import Settings
from sie.kernel.tracing import DISABLED, TRACEPARENT, Tracing

Validator = Callable[[dict[str, Any]], dict[str, Any]]


class ProduceError(SieError):
    """The broker refused deliveries (after librdkafka's own retries)."""


@dataclass
class ProduceSummary:
    """What happened to every input line: sent, rejected before sending (with reasons), or failed."""

    sent: int = 0
    delivered: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    rejected_examples: list[str] = field(default_factory=list)
    delivery_failures: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    def reject(self, reason: str, detail: str) -> None:
        self.rejected[reason] += 1
        if len(self.rejected_examples) < 10:
            self.rejected_examples.append(detail)

    def lines(self) -> list[str]:
        rate = self.delivered / self.seconds if self.seconds > 0 else 0.0
        out = [f"sent {self.sent}, delivered {self.delivered} in {self.seconds:.2f} s ({rate:,.0f}/s), "
               f"rejected {self.rejected_total}, failed {sum(self.delivery_failures.values())}"]
        out += [f"  rejected ({reason}): {n}" for reason, n in sorted(self.rejected.items())]
        out += [f"    e.g. {example}" for example in self.rejected_examples]
        out += [f"  delivery failed ({reason}): {n}" for reason, n in sorted(self.delivery_failures.items())]
        return out


class RateLimiter:
    """Token bucket: at most ``rate`` acquisitions per second (None = unlimited)."""

    def __init__(self, rate: float | None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._rate = rate
        self._clock = clock
        self._sleep = sleep
        self._next = clock()

    def acquire(self) -> None:
        if not self._rate:
            return
        now = self._clock()
        if self._next > now:
            self._sleep(self._next - now)
        self._next = max(self._next, now) + 1.0 / self._rate


def as_request(record: Any, line_no: int) -> dict[str, Any]:
    """Normalise one input record to the request contract ``{"id"?, "inputs", ...metadata}``.

    A record with an ``inputs`` object is taken as a full request; any other JSON object is taken as the
    inputs themselves.  Without an ``id`` the scorer assigns ``<topic>:<partition>:<offset>``.
    """
    if not isinstance(record, dict):
        raise ValueError(f"line {line_no}: a request must be a JSON object (got {type(record).__name__})")
    if "inputs" in record:
        if not isinstance(record["inputs"], dict):
            raise ValueError(f"line {line_no}: inputs must be a JSON object")
        return record
    return {"inputs": record}


class RequestProducer:
    """Sends scoring requests to one model's request topic.

    >>> with RequestProducer(settings, "sie.model.fraud-scorer.requests") as producer:
    ...     producer.send({"id": "tx-1", "inputs": {...}}, key="card-7")
    """

    def __init__(self, settings: Settings, topic: str, *, validator: Validator | None = None,
                 rate: float | None = None, extra_config: dict[str, Any] | None = None,
                 tracing: Tracing = DISABLED) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self._tracing = tracing
        self.summary = ProduceSummary()
        self._validator = validator
        self._limiter = RateLimiter(rate)
        self._started = time.monotonic()
        config = settings.kafka_client_config(**{
            "enable.idempotence": True,  # retries never duplicate a request
            "acks": "all",
            "linger.ms": 5,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 200_000,
            **(extra_config or {}),
        })
        self._producer = Producer(config)

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is None:
            self.summary.delivered += 1
        else:
            self.summary.delivery_failures[err.name()] += 1

    def _on_delivery_traced(self, span: Any, err: Any, msg: Any) -> None:
        self._on_delivery(err, msg)
        if err is None:
            span.set_attribute("messaging.kafka.partition", msg.partition())
            span.set_attribute("messaging.kafka.offset", msg.offset())
        else:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, err.name()))
        span.end()

    def send(self, request: dict[str, Any], key: str | bytes | None = None, parent: str | None = None) -> bool:
        """Validate (if configured) and send one request; False if it was rejected before sending.
        ``parent``: the caller's own ``traceparent`` (the request's span is then its child)."""
        if self._validator is not None:
            try:
                request = {**request, "inputs": self._validator(request["inputs"])}
            except ValueError as exc:  # SchemaViolation is a ValueError
                self.summary.reject("schema_violation", f"{request.get('id', '?')}: {exc}")
                return False
        value = orjson.dumps(request)
        self._limiter.acquire()
        headers, on_delivery = None, self._on_delivery
        if self._tracing.enabled:
            span = self._tracing.start(f"sie.produce {self.topic}", parent=parent, kind="producer", attributes={
                "messaging.system": "kafka", "messaging.destination.name": self.topic,
                "sie.request_id": str(request.get("id", ""))})
            if span is not None:
                headers = [(TRACEPARENT, Tracing.traceparent(span))]
                on_delivery = partial(self._on_delivery_traced, span)
        while True:
            try:
                self._producer.produce(self.topic, value=value, key=key, headers=headers, on_delivery=on_delivery)
                break
            except BufferError:  # local queue full: let librdkafka drain it
                self._producer.poll(0.05)
        self._producer.poll(0)
        self.summary.sent += 1
        return True

    def flush(self, timeout: float = 60.0) -> ProduceSummary:
        """Wait for every delivery report; raise if some never completed."""
        remaining = self._producer.flush(timeout)
        self.summary.seconds = time.monotonic() - self._started
        if remaining:
            raise ProduceError(f"{remaining} requests not delivered to {self.topic} within {timeout:.0f} s: "
                               f"is the cluster reachable ({self._producer})?")
        return self.summary

    def __enter__(self) -> RequestProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()


def read_jsonl(lines: Iterable[str | bytes], summary: ProduceSummary) -> Iterator[tuple[int, dict[str, Any]]]:
    """Parse JSON lines; malformed ones are counted as rejected (with line numbers), never dropped silently."""
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield line_no, as_request(orjson.loads(line), line_no)
        except orjson.JSONDecodeError as exc:
            summary.reject("invalid_json", f"line {line_no}: {exc}")
        except ValueError as exc:
            summary.reject("not_a_request", str(exc))


def key_of(request: dict[str, Any], key_field: str | None) -> str | None:
    """The Kafka key: a field of the inputs (or of the request) named by ``key_field``."""
    if key_field is None:
        return None
    value = request.get("inputs", {}).get(key_field, request.get(key_field))
    return None if value is None else str(value)


def produce_jsonl(settings: Settings, topic: str, lines: Iterable[str | bytes], *,
                  validator: Validator | None = None, key_field: str | None = None,
                  rate: float | None = None,
                  progress: Callable[[ProduceSummary], None] | None = None,
                  tracing: Tracing = DISABLED) -> ProduceSummary:
    """Send every JSON line as a request; returns the summary (sent, rejected with reasons, failed)."""
    producer = RequestProducer(settings, topic, validator=validator, rate=rate, tracing=tracing)
    last_report = time.monotonic()
    for _line_no, request in read_jsonl(lines, producer.summary):
        producer.send(request, key=key_of(request, key_field))
        if progress is not None and time.monotonic() - last_report >= 1.0:
            progress(producer.summary)
            last_report = time.monotonic()
    return producer.flush()
