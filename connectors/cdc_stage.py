"""The CDC stage: a change-stream topic -> scoring requests on the model's request topic, exactly once.

Why a separate stage (and not the scorer reading the CDC topic through the adapter):

* the scorer stays format-agnostic: it reads one wire contract (``docs/scoring.md``) whatever produced it;
* conversion scales on its own (it is cheap per row; inference is not), and needs no model or GPU;
* a poison CDC event is dead-lettered *here*, with its own reason (``invalid_json``, ``malformed_event``,
  ``cast_error``, ``schema_mismatch``, ``missing_primary_key``) and the source bytes unchanged, before it
  could ever reach the model;
* requests are keyed ``db.table:pk``, so every change of one row lands on one request partition in order
  (a row's changes share a source partition too: canal/Debezium partition by primary key, and one stage
  instance owns a source partition at a time).

One batch = one transaction (``sie.streams.eos.ExactlyOnce``)::

    consume <= max_batch CDC records (group sie.cdc.<connector>, subscribe(), read_committed)
    begin -> per record: convert -> produce requests | produce one dead letter | count skips
          -> send_offsets_to_transaction(position, group metadata) -> commit

Requests, dead letters and the source offsets become visible together or not at all, so a crash (even
SIGKILL) re-converts exactly the uncommitted records and readers never see a duplicate request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from sie.connectors.cdc import CdcConnectorSpec, CdcConverter
from sie.kernel.errors import ConfigError
from sie.kernel.settings import Settings
from sie.streams.eos import (
    BatchStatus,
    EosLimits,
    ExactlyOnce,
    close_quietly,
    start_producer,
)
from sie.kernel.kafka_config import consumer_config, producer_config
from sie.streams.eos.lag import consumer_lag
from sie.streams.eos.batcher import Batcher
from sie.streams.scorer.config import INSTANCE_RE  # one rule for instance names across SIE

if TYPE_CHECKING:
    from sie.streams.eos.transaction import Checkpoint

log = logging.getLogger("sie.cdc")

_DETAIL_MAX = 500


def default_dead_letter_topic(connector: str, prefix: str = "sie") -> str:
    """The connector's own DLQ: source records (CDC JSON), not requests, so not the model's DLQ."""
    return f"{prefix}.cdc.{connector}.dlq"


@dataclass(frozen=True)
class CdcStageConfig:
    """Everything one stage instance needs; names derive from the connector name and ``instance``."""

    settings: Settings
    connector: CdcConnectorSpec
    instance: str
    field_types: Mapping[str, str] | None = None  # model input field -> type; None = values passed uncast
    request_topic: str | None = None  # default: connector.request_topic, else the model's default topic
    dead_letter_topic: str | None = None  # default: sie.cdc.<connector>.dlq
    max_batch: int = 1000
    max_wait_ms: int = 20
    poll_timeout_ms: int = 200
    session_timeout_ms: int = 10_000
    transaction_timeout_ms: int = 60_000
    metrics_port: int | None = None
    log_interval_s: float = 30.0
    limits: EosLimits = field(default_factory=EosLimits)

    def __post_init__(self) -> None:
        if not INSTANCE_RE.match(self.instance):
            raise ConfigError(f"cdc.instance: must match {INSTANCE_RE.pattern} (got {self.instance!r}); "
                              "pass --instance NAME")
        for name, value, low in (("max_batch", self.max_batch, 1), ("max_wait_ms", self.max_wait_ms, 0),
                                 ("poll_timeout_ms", self.poll_timeout_ms, 1),
                                 ("session_timeout_ms", self.session_timeout_ms, 1000)):
            if value < low:
                raise ConfigError(f"cdc.{name}: must be >= {low} (got {value})")

    @property
    def group_id(self) -> str:
        return f"{self.settings.topic_prefix}.cdc.{self.connector.name}"

    @property
    def transactional_id(self) -> str:
        return f"{self.settings.topic_prefix}.cdc.{self.connector.name}.{self.instance}"

    @property
    def dlq(self) -> str:
        return self.dead_letter_topic or default_dead_letter_topic(self.connector.name, self.settings.topic_prefix)


class CdcMetrics:
    """Prometheus counters of one stage (own registry: several stages may share a process)."""

    def __init__(self, connector: str) -> None:
        from prometheus_client import CollectorRegistry, Counter as PCounter, Gauge

        self.registry = r = CollectorRegistry(auto_describe=True)
        labels = {"connector": connector}
        self.records_in = PCounter("sie_cdc_records_in", "CDC source records committed.", ["connector"],
                                   registry=r).labels(**labels)
        self.requests_out = PCounter("sie_cdc_requests_out", "Scoring requests committed.", ["connector"],
                                     registry=r).labels(**labels)
        self.skipped = PCounter("sie_cdc_skipped", "Rows/records skipped, by reason (ddl, tombstone, ...).",
                                ["connector", "reason"], registry=r)
        self.dead_letters = PCounter("sie_cdc_dead_letters", "Source records dead-lettered, by reason.",
                                     ["connector", "reason"], registry=r)
        self.txn_aborts = PCounter("sie_cdc_txn_aborts", "Aborted transactions (batch re-read).", ["connector"],
                                   registry=r).labels(**labels)
        self.consumer_lag = Gauge("sie_cdc_consumer_lag", "High watermark minus position per source partition.",
                                  ["connector", "partition"], registry=r)
        self._connector = connector
        self._server: Any = None

    def serve(self, port: int) -> None:
        from prometheus_client import start_http_server

        self._server, _ = start_http_server(port, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, {"connector": self._connector, **labels}) or 0.0


@dataclass(frozen=True)
class CdcSummary:
    """What one ``run`` committed (printed by ``sie cdc run`` on exit, and periodically)."""

    batches: int
    records: int
    requests: int
    skipped: dict[str, int]
    dead_letters: dict[str, int]
    aborts: int
    producer_restarts: int

    def line(self) -> str:
        def fmt(d: dict[str, int]) -> str:
            return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"

        return (f"{self.records} records in {self.batches} transactions -> {self.requests} requests; "
                f"skipped: {fmt(self.skipped)}; dead letters: {fmt(self.dead_letters)}; "
                f"{self.aborts} aborts, {self.producer_restarts} producer restarts")


class _BatchCounts:
    __slots__ = ("records", "requests", "skipped", "dead")

    def __init__(self) -> None:
        self.records = 0
        self.requests = 0
        self.skipped: Counter = Counter()
        self.dead: Counter = Counter()


def dead_letter_headers(reason: str, detail: str, topic: str, partition: int, offset: int, connector: str,
                        original: list[tuple[str, bytes]] | None) -> list[tuple[str, bytes]]:
    """The record's own headers (minus stale ``sie.*``) plus why and where it came from."""
    headers = [(k, v) for k, v in original if not k.startswith("sie.")] if original else []
    if len(detail) > _DETAIL_MAX:
        detail = detail[: _DETAIL_MAX - 3] + "..."
    headers += [
        ("sie.reason", reason.encode()),
        ("sie.detail", detail.encode()),
        ("sie.source.topic", topic.encode()),
        ("sie.source.partition", str(partition).encode()),
        ("sie.source.offset", str(offset).encode()),
        ("sie.connector", connector.encode()),
    ]
    return headers


class CdcStage:
    """Converts one connector's source topic exactly once. Build, then ``run(stop)``."""

    def __init__(self, config: CdcStageConfig, *, consumer_factory: Callable[[dict], Any] | None = None,
                 producer_factory: Callable[[dict], Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        spec = config.connector
        self.converter = CdcConverter(spec, config.field_types, request_topic=config.request_topic)
        self.request_topic = self.converter.request_topic
        self.dead_letter_topic = config.dlq
        if self.request_topic == spec.source_topic or self.dead_letter_topic == spec.source_topic:
            raise ConfigError(f"connector {spec.name!r}: request/dead-letter topic must differ from source_topic "
                              f"{spec.source_topic!r} (the stage would read its own output)")
        self.metrics = CdcMetrics(spec.name)
        self._consumer_factory = consumer_factory
        self._producer_factory = producer_factory
        self._clock = clock
        self._batcher: Batcher | None = None
        self._totals = _BatchCounts()
        self._batches = 0
        self._eos: ExactlyOnce | None = None

    # --- rebalance callbacks (inside consume(); no transaction is open then) ---------------------
    def _on_assign(self, _consumer: Any, partitions: list) -> None:
        log.info("cdc %s: assigned %s", self.config.connector.name, [p.partition for p in partitions])

    def _on_revoke(self, _consumer: Any, partitions: list) -> None:
        dropped = self._batcher.drop(partitions) if self._batcher else 0
        self.metrics.consumer_lag.clear()
        log.info("cdc %s: revoked %s (dropped %d uncommitted collected records)", self.config.connector.name,
                 [p.partition for p in partitions], dropped)

    # --- main loop --------------------------------------------------------------------------------
    def run(self, stop: threading.Event, on_ready: Callable[[], None] | None = None) -> CdcSummary:
        cfg = self.config
        if cfg.metrics_port is not None:
            self.metrics.serve(cfg.metrics_port)
        producer = start_producer(
            producer_config(cfg.settings, cfg.transactional_id, max_batch=cfg.max_batch,
                            transaction_timeout_ms=cfg.transaction_timeout_ms),
            stop, self._producer_factory, cfg.limits)
        if self._consumer_factory is None:
            from confluent_kafka import Consumer as consumer_factory  # noqa: N813
        else:
            consumer_factory = self._consumer_factory
        consumer = consumer_factory(consumer_config(
            cfg.settings, cfg.group_id, f"{cfg.transactional_id}.consumer", max_batch=cfg.max_batch,
            session_timeout_ms=cfg.session_timeout_ms))
        self._batcher = Batcher(consumer, cfg.max_batch, cfg.max_wait_ms / 1000, cfg.poll_timeout_ms / 1000,
                                self._clock)
        eos = self._eos = ExactlyOnce(producer, consumer, stop, cfg.limits)
        consumer.subscribe([cfg.connector.source_topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                           on_lost=self._on_revoke)
        if on_ready:
            on_ready()
        next_log = self._clock() + cfg.log_interval_s
        try:
            while not stop.is_set():
                batch = self._batcher.collect()
                now = self._clock()
                if now >= next_log:
                    self._update_lag(consumer)
                    log.info("cdc %s: %s", cfg.connector.name, self.summary().line())
                    next_log = now + cfg.log_interval_s
                if not batch:
                    continue
                status, counts = eos.run_batch(batch, self._process)
                if status is BatchStatus.COMMITTED:
                    self._record(counts, len(batch))
                else:
                    self.metrics.txn_aborts.inc()
        finally:
            close_quietly(consumer, producer)
            self.metrics.close()
        return self.summary()

    def summary(self) -> CdcSummary:
        t = self._totals
        eos = self._eos
        return CdcSummary(self._batches, t.records, t.requests, dict(t.skipped), dict(t.dead),
                          eos.aborts if eos else 0, eos.producer_restarts if eos else 0)

    # --- one batch (inside the transaction) -------------------------------------------------------
    def _process(self, batch: list, txn: "Checkpoint") -> _BatchCounts:
        counts = _BatchCounts()
        convert = self.converter.convert
        request_topic = self.request_topic
        for msg in batch:
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            txn.track(topic, partition, offset)
            outcome = convert(msg.key(), msg.value())
            if outcome.error is not None:
                reason = outcome.error.reason.value
                txn.produce(self.dead_letter_topic, msg.value(), msg.key(), -1,
                            dead_letter_headers(reason, outcome.error.detail, topic, partition, offset,
                                                self.config.connector.name, msg.headers()))
                counts.dead[reason] += 1
                continue
            for req in outcome.requests:
                txn.produce(request_topic, req.value, req.key)
            counts.requests += len(outcome.requests)
            if outcome.skipped:
                counts.skipped.update(outcome.skipped)
        return counts

    def _record(self, counts: _BatchCounts, n: int) -> None:
        """Counters move only after a commit, so they count what readers can see."""
        self._batches += 1
        t = self._totals
        t.records += n
        t.requests += counts.requests
        t.skipped.update(counts.skipped)
        t.dead.update(counts.dead)
        m = self.metrics
        name = self.config.connector.name
        m.records_in.inc(n)
        if counts.requests:
            m.requests_out.inc(counts.requests)
        for reason, c in counts.skipped.items():
            m.skipped.labels(connector=name, reason=reason).inc(c)
        for reason, c in counts.dead.items():
            m.dead_letters.labels(connector=name, reason=reason).inc(c)

    def _update_lag(self, consumer: Any) -> None:
        gauge, name = self.metrics.consumer_lag, self.config.connector.name
        for partition, lag in consumer_lag(consumer).items():
            gauge.labels(connector=name, partition=str(partition)).set(lag)


def run_cdc_stage(config: CdcStageConfig, stop: threading.Event,
                  on_ready: Callable[[CdcStage], None] | None = None) -> CdcSummary:
    """Library entry point (``sie cdc run`` and tests): run until ``stop`` is set."""
    stage = CdcStage(config)
    return stage.run(stop, on_ready=(lambda: on_ready(stage)) if on_ready else None)


def field_types_of(model_spec: Any) -> dict[str, str]:
    """``{field: type}`` of a ``ModelService``'s input schema (what ``CdcConverter`` coerces to)."""
    return {f.name: f.type for f in model_spec.input_schema.fields}
