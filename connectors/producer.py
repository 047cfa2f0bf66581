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
from typing import TYPE_CHECKING, Any

import orjson

from sie.kernel.errors import SieError
from sie.kernel.settings import Settings

if TYPE_CHECKING:
    from sie.kernel.clients import KafkaClients
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
    #: sent but with no delivery report when the producer gave up waiting (broker unreachable)
    undelivered: int = 0
    #: sent with a null key because --allow-missing-key let a line without the key field through
    null_keys: int = 0
    #: the input was not read to its end (SIGINT/SIGTERM)
    interrupted: bool = False

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    @property
    def complete(self) -> bool:
        """Every line read was delivered: nothing rejected, failed, undelivered or left unread."""
        return not (self.rejected_total or self.delivery_failures or self.undelivered or self.interrupted)

    def reject(self, reason: str, detail: str) -> None:
        self.rejected[reason] += 1
        if len(self.rejected_examples) < 10:
            self.rejected_examples.append(detail)

    def lines(self) -> list[str]:
        rate = self.delivered / self.seconds if self.seconds > 0 else 0.0
        out = [f"sent {self.sent}, delivered {self.delivered} in {self.seconds:.2f} s ({rate:,.0f}/s), "
               f"rejected {self.rejected_total}, failed {sum(self.delivery_failures.values())}"
               + (f", undelivered {self.undelivered}" if self.undelivered else "")
               + (f", {self.null_keys} with a null key" if self.null_keys else "")
               + (" (interrupted: the rest of the input was not read)" if self.interrupted else "")]
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
                 tracing: Tracing = DISABLED, clients: KafkaClients | None = None) -> None:
        from sie.kernel.clients import KafkaClients, request_producer_config

        self.topic = topic
        self._tracing = tracing
        self.summary = ProduceSummary()
        self._validator = validator
        self._limiter = RateLimiter(rate)
        self._started = time.monotonic()
        config = request_producer_config(settings, settings.names.writer_client_id("requests"), **(extra_config or {}))
        self._producer = (clients or KafkaClients()).producer(config)
        self._bootstrap = settings.bootstrap_servers

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
        """Wait for every delivery report; raise (the counts kept in ``summary``) if some never completed."""
        remaining = self._producer.flush(timeout)
        self.summary.seconds = time.monotonic() - self._started
        self.summary.undelivered = remaining
        if remaining:
            raise ProduceError(f"{remaining} requests not delivered to {self.topic} within {timeout:.0f} s: "
                               f"is Kafka at {self._bootstrap} reachable (sie kafka status)?")
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


class MissingKey(ValueError):
    """The key field is absent or null (``absent``), or not a scalar; ``str`` says where it was looked for."""

    def __init__(self, message: str, absent: bool = True) -> None:
        super().__init__(message)
        self.absent = absent


_MISSING = object()


def _walk(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if not isinstance(doc, dict) or part not in doc:
            return _MISSING
        doc = doc[part]
    return doc


def _suggest(request: dict[str, Any], leaf: str) -> str:
    """``metadata.customer_id`` when the leaf name is one level down under another object."""
    for name, value in request.items():
        if name != "inputs" and isinstance(value, dict) and leaf in value:
            return f"; it is at {name}.{leaf}: use --key-field {name}.{leaf}"
    return ""


def key_of(request: dict[str, Any], key_field: str | None) -> str | None:
    """The Kafka key named by ``key_field``, a dotted path looked up in ``inputs`` first, then in the
    request (``card``, ``metadata.customer_id``, ``id``).  ``MissingKey`` when it is absent or null (a
    silent null key would lose per-key order); a number or a boolean becomes its JSON text."""
    if key_field is None:
        return None
    parts = key_field.split(".")
    value = _walk(request.get("inputs"), parts)
    if value is _MISSING or value is None:
        value = _walk(request, parts)
    if value is _MISSING or value is None:
        raise MissingKey(f"no {key_field!r} in inputs or the request" + ("" if value is _MISSING else " (null)")
                         + _suggest(request, parts[-1]))
    if isinstance(value, (dict, list)):
        raise MissingKey(f"{key_field!r} is a JSON {'object' if isinstance(value, dict) else 'array'}; a key "
                         f"field must be a string, number or boolean", absent=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def produce_jsonl(settings: Settings, topic: str, lines: Iterable[str | bytes], *,
                  validator: Validator | None = None, key_field: str | None = None,
                  allow_missing_key: bool = False, rate: float | None = None,
                  progress: Callable[[ProduceSummary], None] | None = None,
                  summary_out: list[ProduceSummary] | None = None,
                  tracing: Tracing = DISABLED) -> ProduceSummary:
    """Send every JSON line as a request; returns the summary (sent, rejected with reasons, failed).

    A line whose ``key_field`` is missing is rejected (``missing_key``) unless ``allow_missing_key``
    (then it is sent with a null key and counted).  SIGINT (``KeyboardInterrupt``) stops reading: what was
    sent is flushed and the summary says ``interrupted``.  ``summary_out`` receives the summary before the
    final flush, so a caller still has the counts when the flush raises ``ProduceError``.
    """
    producer = RequestProducer(settings, topic, validator=validator, rate=rate, tracing=tracing)
    summary = producer.summary
    if summary_out is not None:
        summary_out.append(summary)
    last_report = time.monotonic()
    try:
        for line_no, request in read_jsonl(lines, summary):
            try:
                key = key_of(request, key_field)
            except MissingKey as exc:
                if not (allow_missing_key and exc.absent):
                    summary.reject("missing_key", f"line {line_no}: --key-field {exc}")
                    continue
                key = None
                summary.null_keys += 1
            producer.send(request, key=key)
            if progress is not None and time.monotonic() - last_report >= 1.0:
                progress(summary)
                last_report = time.monotonic()
    except KeyboardInterrupt:
        summary.interrupted = True
    return producer.flush()
