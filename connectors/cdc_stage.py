"""The CDC stage: a change-stream topic -> scoring requests on the model's request topic, exactly once.

Why a separate stage (and not the scorer reading the CDC topic through the adapter):

* the scorer stays format-agnostic: it reads one wire contract (``docs/scoring.md``) whatever produced it;
* conversion scales on its own (it is cheap per row; inference is not), and needs no model or GPU;
* a poison CDC event is dead-lettered *here*, with its own reason (``invalid_json``, ``malformed_event``,
  ``cast_error``, ``schema_mismatch``, ``missing_primary_key``, ``null_in_required_field``, and
  ``conversion_error`` for anything unforeseen), the source bytes unchanged and, for a row-level failure,
  the row's coordinates (``sie.cdc.db|table|op|pk|position`` headers), before it could ever reach the model.
  No record can stop the stage: converting one never raises (``CdcConverter.convert``);
* requests are keyed ``db.table:pk``, so every change of one row lands on one request partition in order
  (a row's changes share a source partition too: canal/Debezium partition by primary key, and one stage
  instance owns a source partition at a time).

One batch = one transaction (the exactly-once layer, ``sie.streams.eos.StreamLoop``)::

    consume <= max_batch CDC records (group sie.cdc.<connector>, subscribe(), read_committed)
    begin -> per record: convert -> produce requests | produce one dead letter | count skips
          -> offsets join the transaction (with the group metadata) -> commit

Requests, dead letters and the source offsets become visible together or not at all, so a crash (even
SIGKILL) re-converts exactly the uncommitted records and readers never see a duplicate request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sie.connectors.cdc import CdcConnectorSpec, CdcConverter
from sie.kernel.clients import (
    KafkaClients,
    eos_consumer_config,
    eos_transaction_timeout_ms,
    transactional_producer_config,
)
from sie.kernel.errors import ConfigError
from sie.kernel.names import check_instance
from sie.kernel.settings import Settings
from sie.schemas.connector_spec import connector_name_problems
from sie.streams.eos import EosLimits, StageSettings, StreamLoop
from sie.streams.eos.deadletter import RECORD_OVERHEAD, dead_letter, short
from sie.streams.eos.lag import consumer_lag
from sie.streams.eos.records import Output, Prepared

if TYPE_CHECKING:
    from sie.schemas.spec_models import IOSchema, ModelService

log = logging.getLogger("sie.cdc")

@dataclass(frozen=True)
class CdcStageConfig:
    """Everything one stage instance needs; names derive from the connector name and ``instance``."""

    settings: Settings
    connector: CdcConnectorSpec
    instance: str
    field_types: Mapping[str, str] | None = None  # model input field -> type; None = values passed uncast
    # the model's input schema: types and NULL rules (to_requests docstring); give it or field_types
    input_schema: IOSchema | None = None
    request_topic: str | None = None  # default: connector.request_topic, else the model's default topic
    dead_letter_topic: str | None = None  # default: sie.cdc.<connector>.dlq
    max_batch: int = 1000
    max_wait_ms: int = 20
    poll_timeout_ms: int = 200
    session_timeout_ms: int = 10_000
    transaction_timeout_ms: int | None = None  # None: the session timeout (clients.eos_transaction_timeout_ms)
    metrics_port: int | None = None
    log_interval_s: float = 30.0
    limits: EosLimits = field(default_factory=EosLimits)

    def __post_init__(self) -> None:
        check_instance(self.instance, "cdc.instance")
        for name, value, low in (("max_batch", self.max_batch, 1), ("max_wait_ms", self.max_wait_ms, 0),
                                 ("poll_timeout_ms", self.poll_timeout_ms, 1),
                                 ("session_timeout_ms", self.session_timeout_ms, 1000)):
            if value < low:
                raise ConfigError(f"cdc.{name}: must be >= {low} (got {value})")

    @property
    def group_id(self) -> str:
        return self.settings.names.cdc_group(self.connector.name)

    @property
    def transactional_id(self) -> str:
        return self.settings.names.cdc_transactional_id(self.connector.name, self.instance)

    @property
    def dlq(self) -> str:
        return self.dead_letter_topic or self.settings.names.cdc_dead_letter_topic(self.connector.name)


class CdcMetrics:
    """Prometheus counters of one stage (own registry: several stages may share a process)."""

    def __init__(self, connector: str) -> None:
        from prometheus_client import CollectorRegistry, Gauge
        from prometheus_client import Counter as PCounter

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
        self.port: int | None = None

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start the /metrics HTTP server on ``addr`` (``SIE_METRICS_BIND``); ``port`` 0 = any free one.
        Returns the bound port (also ``self.port``)."""
        from sie.kernel.probe_http import start_metrics_server as start_http_server  # bounded (idle timeout, cap)

        self._server, _ = start_http_server(port, addr=addr, registry=self.registry)
        self.port = int(self._server.server_port)
        return self.port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, {"connector": self._connector, **labels}) or 0.0


class _Observer:
    """The layer's failure events as the stage's counters."""

    def __init__(self, metrics: CdcMetrics) -> None:
        self._m = metrics

    def aborted(self) -> None:
        self._m.txn_aborts.inc()

    def producer_restarted(self) -> None:
        pass

    def retry_later(self, exc: Exception) -> None:
        pass


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


class CdcStage:
    """Converts one connector's source topic exactly once. Build, then ``run(stop)``."""

    def __init__(self, config: CdcStageConfig, *, clients: KafkaClients | None = None,
                 clock: Callable[[], float] = time.monotonic, tracing: Any = None) -> None:
        from sie.kernel.tracing import tracing_from_settings

        self.config = config
        #: sie.kernel.tracing.Tracing: a CDC row starts (or continues) the trace of the requests it becomes
        self._tracing = tracing or tracing_from_settings(config.settings, "sie-cdc")
        spec = config.connector
        problems = connector_name_problems(spec, config.settings.topic_prefix, config.request_topic)
        if problems:  # a replica document from the assignments topic, or a spec file: refused before any client
            raise ConfigError(f"connector {spec.name!r} refused: " + "; ".join(problems))
        self.converter = CdcConverter(spec, config.field_types, request_topic=config.request_topic,
                                      topic_prefix=config.settings.topic_prefix, input_schema=config.input_schema)
        self.request_topic = self.converter.request_topic
        self.dead_letter_topic = config.dlq
        if self.request_topic == spec.source_topic or self.dead_letter_topic == spec.source_topic:
            raise ConfigError(f"connector {spec.name!r}: request/dead-letter topic must differ from source_topic "
                              f"{spec.source_topic!r} (the stage would read its own output)")
        self.metrics = CdcMetrics(spec.name)
        self._clients = clients or KafkaClients()
        self._clock = clock
        self._tags = [("sie.connector", spec.name.encode())]
        self._max_record_bytes = config.settings.max_record_bytes
        self._totals = _BatchCounts()
        self._batches = 0
        self._loop: StreamLoop | None = None
        self._next_log = 0.0

    # --- running ----------------------------------------------------------------------------------
    def run(self, stop: threading.Event, on_ready: Callable[[], None] | None = None) -> CdcSummary:
        cfg = self.config
        if cfg.metrics_port is not None:
            self.metrics.serve(cfg.metrics_port, cfg.settings.metrics_bind)
        self._next_log = self._clock() + cfg.log_interval_s
        self._loop = StreamLoop(StageSettings(
            name=f"cdc {cfg.connector.name}", topics=[cfg.connector.source_topic],
            producer_config=transactional_producer_config(cfg.settings, cfg.transactional_id, max_batch=cfg.max_batch,
                                                          transaction_timeout_ms=cfg.transaction_timeout_ms
                                                          or eos_transaction_timeout_ms(cfg.session_timeout_ms)),
            consumer_config=eos_consumer_config(cfg.settings, cfg.group_id,
                                                cfg.settings.names.stage_client_id(cfg.transactional_id, "consumer"),
                                                max_batch=cfg.max_batch, session_timeout_ms=cfg.session_timeout_ms),
            max_batch=cfg.max_batch, max_wait_s=cfg.max_wait_ms / 1000, idle_s=cfg.poll_timeout_ms / 1000,
            tick_interval_s=min(cfg.log_interval_s, 5.0),
            # a stage that can commit nothing for a session's length gives its partitions to the others
            limits=cfg.limits if cfg.limits.stall_s is not None else replace(cfg.limits,
                                                                             stall_s=cfg.session_timeout_ms / 1000),
            fenced_hint="give every stage instance a distinct --instance"),
            self, clients=self._clients, observer=_Observer(self.metrics), clock=self._clock)
        try:
            self._loop.run(stop, on_ready)
        finally:
            self.metrics.close()
        return self.summary()

    def summary(self) -> CdcSummary:
        t = self._totals
        eos = self._loop.eos if self._loop else None
        return CdcSummary(self._batches, t.records, t.requests, dict(t.skipped), dict(t.dead),
                          eos.aborts if eos else 0, eos.producer_restarts if eos else 0)

    # --- BatchProcessor: what the exactly-once layer calls -----------------------------------------
    def started(self, consumer: Any) -> None:
        pass

    def tick(self, consumer: Any) -> None:
        gauge, name = self.metrics.consumer_lag, self.config.connector.name
        for partition, lag in consumer_lag(consumer).items():
            gauge.labels(connector=name, partition=str(partition)).set(lag)
        now = self._clock()
        if now >= self._next_log:
            log.info("cdc %s: %s", name, self.summary().line())
            self._next_log = now + self.config.log_interval_s

    def partitions_dropped(self, partitions: list[Any], lost: bool) -> None:
        self.metrics.consumer_lag.clear()

    # --- one batch (inside the transaction) -------------------------------------------------------
    def prepare(self, batch: list) -> Prepared[_BatchCounts]:
        counts = _BatchCounts()
        convert = self.converter.convert
        request_topic = self.request_topic
        limit = self._max_record_bytes - RECORD_OVERHEAD
        outputs: list[Output] = []
        for msg in batch:
            outcome = convert(msg.key(), msg.value())
            if outcome.error is not None:
                error = outcome.error
                tags = self._tags
                if error.coordinates:
                    tags = tags + [(f"sie.cdc.{k}", short(v).encode()) for k, v in error.coordinates.items()]
                outputs.append(self._dead_letter(msg, error.reason.value, error.detail, counts, tags))
                continue
            requests = [Output(request_topic, req.value, req.key, -1, None, msg, "request") for req in outcome.requests]
            too_large = next((r for r in requests if r.size() > limit), None)
            if too_large is not None:  # all of a source record's requests, or none: its dead letter alone
                outputs.append(self._dead_letter(
                    msg, "request_too_large", f"request: {too_large.size()} bytes > max_record_bytes "
                    f"{self._max_record_bytes}", counts))
                continue
            outputs.extend(requests)
            counts.requests += len(requests)
            if outcome.skipped:
                counts.skipped.update(outcome.skipped)
        if self._tracing.enabled:
            from sie.connectors.tracing import carry_traces

            carry_traces(self._tracing, f"sie.cdc {self.config.connector.name}", outputs, start_new=True,
                         attributes={"sie.connector": self.config.connector.name})
        return Prepared(outputs, counts)

    def rejected(self, output: Output, detail: str, counts: _BatchCounts) -> Output:
        """A request the producer refused anyway: its source record's dead letter goes in its place."""
        counts.requests -= 1
        return self._dead_letter(output.source, "request_too_large", detail, counts)

    def partitions_assigned(self, consumer: Any, partitions: list[Any]) -> None:
        pass

    def _dead_letter(self, msg: Any, reason: str, detail: str, counts: _BatchCounts,
                     tags: list[tuple[str, bytes]] | None = None) -> Output:
        counts.dead[reason] += 1
        return dead_letter(self.dead_letter_topic, msg, reason, detail, tags or self._tags, self._max_record_bytes)

    def committed(self, counts: _BatchCounts, n: int) -> None:
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


def run_cdc_stage(config: CdcStageConfig, stop: threading.Event,
                  on_ready: Callable[[CdcStage], None] | None = None) -> CdcSummary:
    """Library entry point (``sie cdc run`` and tests): run until ``stop`` is set."""
    stage = CdcStage(config)
    return stage.run(stop, on_ready=(lambda: on_ready(stage)) if on_ready else None)


def field_types_of(model_spec: ModelService) -> dict[str, str]:
    """``{field: type}`` of a ``ModelService``'s input schema (what ``CdcConverter`` coerces to); pass
    ``input_schema=model_spec.input_schema`` instead to apply the model's NULL rules too."""
    return {f.name: f.type for f in model_spec.input_schema.fields}
