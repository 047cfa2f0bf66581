"""The scorer run loop: consume -> validate -> route -> infer -> produce -> commit, exactly once.

One iteration = one batch = one transaction::

    batch = batcher.collect()             # consume(); rebalance callbacks run here, no txn open
    txn.begin()
    for record: parse/validate -> dead letter (poison) | expired result | group by version
    for version: ONE backend.infer(rows) -> results (failing rows isolated, dead-lettered)
    txn.commit()                           # offsets + results + dead letters, atomically

Failure handling (each path ends with the consumer rewound to the committed offsets):
``TxnAbortable`` -> abort; ``ProducerFatal`` -> re-create the producer;
``BackendUnavailable`` -> abort and back off (the batch is retried, never dead-lettered).
A stop request (SIGTERM) is honoured between batches: the current batch is committed,
the consumer closed (leaving the group), and ``run`` returns a summary.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaException, Producer

from sie.streams.eos.lag import consumer_lag
from sie.streams.eos.batcher import Batcher
from sie.streams.scorer.codec import Codec, Poison, Request, default_id
from sie.streams.scorer.config import ScorerConfig
from sie.streams.scorer.errors import (
    BackendUnavailable,
    DeadLetterReason,
    ProducerFatal,
    ProducerHung,
    ScorerFenced,
    TxnAbortable,
)
from sie.streams.scorer.metrics import ScorerMetrics
from sie.streams.scorer.routing import RouteEntry, RoutingTable
from sie.streams.eos.transaction import Checkpoint, TransactionalProducer, close_quietly, rewind

log = logging.getLogger("sie.scorer")


@dataclass(frozen=True)
class ScorerSummary:
    """What one ``run`` did (printed by ``sie score`` on exit)."""

    batches: int
    records_in: int
    results: int
    expired: int
    dead_letters: int
    aborts: int
    producer_restarts: int

    def line(self) -> str:
        return (f"{self.records_in} records in {self.batches} transactions: {self.results} results, "
                f"{self.expired} expired, {self.dead_letters} dead letters; {self.aborts} aborts, "
                f"{self.producer_restarts} producer restarts")


class InferenceFailed:
    """Marker for a row the backend could not score (with the backend's message)."""

    __slots__ = ("detail",)

    def __init__(self, detail: str) -> None:
        self.detail = detail


def infer_isolating(backend: Any, rows: list[dict]) -> list[Any]:
    """One output per row; rows that fail are isolated by bisection and returned as ``InferenceFailed``.

    A batch with one poison row costs about 2*log2(n) extra calls; healthy batches cost one.
    """
    try:
        out = backend.infer(rows)
        if type(out) is not list or len(out) != len(rows):
            raise ValueError(f"backend returned {type(out).__name__} of {len(out) if hasattr(out, '__len__') else '?'} "
                             f"outputs for {len(rows)} inputs")
        return out
    except Exception as exc:  # InferenceError, or anything a model raises: isolate before judging
        if len(rows) == 1:
            return [InferenceFailed(f"{type(exc).__name__}: {exc}")]
        mid = len(rows) // 2
        return infer_isolating(backend, rows[:mid]) + infer_isolating(backend, rows[mid:])


class Scorer:
    """Scores one model's request topic exactly once. Build, then ``run(stop_event)``."""

    def __init__(self, config: ScorerConfig, routing: RoutingTable, *,
                 validator: Callable[[dict], dict] | None = None,
                 consumer_factory: Callable[[dict], Any] = Consumer,
                 producer_factory: Callable[[dict], Any] = Producer,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 metrics: ScorerMetrics | None = None) -> None:
        spec = config.spec
        self.config = config
        self._routing = routing
        if validator is None:
            from sie.schemas.validation import compile_validator

            validator = compile_validator(spec.input_schema)
        self._codec = Codec(spec.name, validator, config.max_request_bytes, config.max_json_depth)
        self._consumer_factory = consumer_factory
        self._producer_factory = producer_factory
        self._clock = clock
        self._wall = wall_clock
        self.metrics = metrics or ScorerMetrics(spec.model_id, spec.service_type, spec.priority_level)
        self._results_topic = spec.topics.results
        self._dlq_topic = spec.topics.dead_letters
        self._max_queue_ms = spec.sla.max_queue_time_ms
        self._canary: dict | None = None
        if getattr(spec, "example_input", None):
            try:
                self._canary = validator(dict(spec.example_input))
            except Exception:
                self._canary = None
        self._consumer: Any = None
        self._batcher: Batcher | None = None
        self._same_partition = False
        self._counts = dict(batches=0, records_in=0, results=0, expired=0, dead_letters=0, aborts=0,
                            producer_restarts=0)

    # --- routing -------------------------------------------------------------------
    @property
    def routing(self) -> RoutingTable:
        return self._routing

    def set_routing(self, table: RoutingTable) -> None:
        """Swap the routing table; takes effect at the next batch (a batch uses one table throughout)."""
        self._routing = table

    # --- rebalance callbacks (run inside consume(), never with a transaction open) ---
    def _on_assign(self, consumer: Any, partitions: list) -> None:
        log.info("assigned %s", [p.partition for p in partitions])

    def _on_revoke(self, consumer: Any, partitions: list) -> None:
        dropped = self._batcher.drop(partitions) if self._batcher else 0
        self.metrics.consumer_lag.clear()
        log.info("revoked %s (dropped %d uncommitted collected records)", [p.partition for p in partitions], dropped)

    def _on_lost(self, consumer: Any, partitions: list) -> None:
        dropped = self._batcher.drop(partitions) if self._batcher else 0
        self.metrics.consumer_lag.clear()
        log.warning("lost %s (dropped %d collected records)", [p.partition for p in partitions], dropped)

    # --- main loop -----------------------------------------------------------------
    def run(self, stop: threading.Event, on_ready: Callable[[], None] | None = None) -> ScorerSummary:
        cfg = self.config
        if cfg.metrics_port is not None:
            self.metrics.serve(cfg.metrics_port)
        producer = TransactionalProducer(cfg.producer_config(), self._producer_factory,
                                         cfg.retriable_attempts, cfg.retry_backoff_s, stop, cfg.txn_hang_limit_s)
        if not producer.start(patience_s=60.0):  # stopped before the broker answered
            self.metrics.close()
            return self.summary()
        consumer = self._consumer = self._consumer_factory(cfg.consumer_config())
        self._batcher = Batcher(consumer, cfg.max_batch, cfg.max_wait_ms / 1000, cfg.poll_timeout_ms / 1000,
                                self._clock)
        self._same_partition = self._partition_counts_match(consumer)
        consumer.subscribe([cfg.spec.topics.requests], on_assign=self._on_assign,
                           on_revoke=self._on_revoke, on_lost=self._on_lost)
        if on_ready:
            on_ready()
        fatal_streak = 0
        backend_backoff = cfg.retry_backoff_s
        next_lag = self._clock()
        try:
            while not stop.is_set():
                batch = self._batcher.collect()
                if self._clock() >= next_lag:
                    self._update_lag(consumer)
                    next_lag = self._clock() + cfg.lag_interval_s
                if not batch:
                    continue
                txn = Checkpoint(producer, consumer)
                try:
                    stats = self._process(batch, txn)
                except TxnAbortable as exc:
                    log.warning("transaction aborted: %s", exc)
                    self._abort(producer, txn, stop)
                    continue
                except BackendUnavailable as exc:
                    log.error("%s; retrying the batch in %.1fs", exc, backend_backoff)
                    self.metrics.backend_outages.inc()
                    self._abort(producer, txn, stop)
                    stop.wait(backend_backoff)
                    backend_backoff = min(backend_backoff * 2, cfg.backend_backoff_max_s)
                    continue
                except ProducerFatal as exc:
                    if not isinstance(exc, ProducerHung):  # a hang means "broker down", not "fenced"
                        fatal_streak += 1
                    if fatal_streak >= cfg.fatal_limit:
                        raise ScorerFenced(
                            f"transactional.id {producer.transactional_id}: {fatal_streak} fatal producer errors in a "
                            f"row (last: {exc}); another live scorer probably uses --instance {cfg.instance}: "
                            f"give every replica a distinct --instance") from exc
                    log.error("producer unusable (%s); re-creating it", exc)
                    self._restart(producer, txn, stop)
                    continue
                fatal_streak = 0
                backend_backoff = cfg.retry_backoff_s
                self._record(stats, len(batch))
        finally:
            self._shutdown(consumer, producer)
        return self.summary()

    def summary(self) -> ScorerSummary:
        return ScorerSummary(**self._counts)

    # --- one batch -------------------------------------------------------------------
    def _process(self, batch: list, txn: Checkpoint) -> dict[str, Any]:
        """Produce one output per record of ``batch`` inside ``txn`` and commit; returns counters."""
        table = self._routing  # one table for the whole batch, even if set_routing() runs meanwhile
        codec = self._codec
        now_ms = self._wall() * 1000.0
        max_q = self._max_queue_ms
        results_topic = self._results_topic
        same_partition = self._same_partition
        groups: dict[str, tuple[RouteEntry, list[Request], list[float]]] = {}
        dead: dict[str, int] = {}
        expired = 0
        oldest_ms = 0.0
        txn.begin()
        for msg in batch:
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            txn.track(topic, partition, offset)
            ts_type, ts = msg.timestamp()
            ts_ms = None if ts_type == TIMESTAMP_NOT_AVAILABLE else ts
            key = msg.key()
            parsed = codec.parse(topic, partition, offset, key, msg.value(), ts_ms)
            if type(parsed) is Poison:
                entry = table.route(key, default_id(topic, partition, offset))
                self._dead_letter(txn, msg, parsed.reason, parsed.detail, entry.version)
                dead[parsed.reason.value] = dead.get(parsed.reason.value, 0) + 1
                continue
            entry = table.route(key, parsed.id)
            queue_ms = now_ms - ts_ms if ts_ms is not None and ts_ms < now_ms else 0.0
            if queue_ms > oldest_ms:
                oldest_ms = queue_ms
            if max_q is not None and queue_ms > max_q:
                if self.config.expired_to == "result":
                    txn.produce(results_topic, codec.expired(parsed, entry.version, queue_ms, max_q), key,
                                partition if same_partition else -1)
                    expired += 1
                else:
                    self._dead_letter(txn, msg, DeadLetterReason.EXPIRED,
                                      f"timestamp: queued {queue_ms:.0f} ms > sla.max_queue_time_ms {max_q:g}",
                                      entry.version)
                    dead["expired"] = dead.get("expired", 0) + 1
                continue
            group = groups.get(entry.version)
            if group is None:
                group = groups[entry.version] = (entry, [], [])
            group[1].append(parsed)
            group[2].append(queue_ms)

        ok = 0
        by_offset = None
        for version, (entry, requests, queue_times) in groups.items():
            rows = [r.inputs for r in requests]
            started = self._clock()
            outputs = self._infer(entry.backend, rows)
            inference_ms = (self._clock() - started) * 1000.0
            self.metrics.inference_latency.observe(inference_ms / 1000.0)
            n = len(rows)
            for req, queue_ms, out in zip(requests, queue_times, outputs):
                detail = out.detail if type(out) is InferenceFailed else None
                if detail is None:
                    try:
                        value = codec.result(req, version, out, queue_ms, inference_ms, n)
                    except TypeError as exc:
                        detail = f"outputs: not JSON-serialisable ({exc})"
                    else:
                        txn.produce(results_topic, value, req.key, req.partition if same_partition else -1)
                        ok += 1
                        continue
                if by_offset is None:
                    by_offset = {(m.topic(), m.partition(), m.offset()): m for m in batch}
                msg = by_offset[(req.topic, req.partition, req.offset)]
                self._dead_letter(txn, msg, DeadLetterReason.INFERENCE_ERROR, detail, version)
                dead["inference_error"] = dead.get("inference_error", 0) + 1
        commit_started = self._clock()
        txn.commit()
        return {"ok": ok, "expired": expired, "dead": dead, "oldest_ms": oldest_ms,
                "commit_s": self._clock() - commit_started}

    def _infer(self, backend: Any, rows: list[dict]) -> list[Any]:
        """Outputs for ``rows``; poison rows come back as ``InferenceFailed``; a down backend raises."""
        outputs = infer_isolating(backend, rows)
        failed = sum(1 for o in outputs if type(o) is InferenceFailed)
        if failed == 0:
            self._canary = rows[0]
            return outputs
        if failed < len(rows):
            # Some rows scored, so the backend works. A row that failed may still be the victim of a
            # failure that ended mid-bisection: give each one a second, individual try before judging it.
            for i, out in enumerate(outputs):
                if type(out) is InferenceFailed:
                    outputs[i] = infer_isolating(backend, [rows[i]])[0]
            return outputs
        # Every row failed. Outage or all-poison batch? Ask the backend about a row known to be good.
        if self._canary is not None:
            try:
                _infer_isolating_strict(backend, [self._canary])
            except Exception as exc:
                raise BackendUnavailable(
                    f"backend fails on a known-good row too ({type(exc).__name__}: {exc}): outage, not poison") from exc
            outputs = infer_isolating(backend, rows)  # second chance: the backend answers now
        return outputs

    def _dead_letter(self, txn: Checkpoint, msg: Any, reason: DeadLetterReason, detail: str,
                     version: str) -> None:
        headers = self._codec.dead_letter_headers(reason, detail, msg.topic(), msg.partition(), msg.offset(),
                                                  version, msg.headers())
        txn.produce(self._dlq_topic, msg.value() if msg.value() is not None else None, msg.key(), -1, headers)

    def _record(self, stats: dict[str, Any], n: int) -> None:
        """Metrics and counters, only after a successful commit (so they count committed work)."""
        m = self.metrics
        c = self._counts
        c["batches"] += 1
        c["records_in"] += n
        c["results"] += stats["ok"]
        c["expired"] += stats["expired"]
        m.records_in.inc(n)
        m.batch_size.observe(n)
        m.txn_commit.observe(stats["commit_s"])
        m.queue_time.observe(stats["oldest_ms"] / 1000.0)
        if stats["ok"]:
            m.records_out.labels(status="ok").inc(stats["ok"])
        if stats["expired"]:
            m.records_out.labels(status="expired").inc(stats["expired"])
        for reason, count in stats["dead"].items():
            m.dead_letters.labels(reason=reason).inc(count)
            c["dead_letters"] += count

    # --- recovery --------------------------------------------------------------------
    def _abort(self, producer: TransactionalProducer, txn: Checkpoint, stop: threading.Event) -> None:
        self._counts["aborts"] += 1
        self.metrics.txn_aborts.inc()
        try:
            producer.abort()
        except ProducerFatal as exc:
            log.error("abort failed (%s); re-creating the producer", exc)
            self._restart(producer, txn, stop)
            return
        rewind(self._consumer, txn.first_offsets(), stop)

    def _restart(self, producer: TransactionalProducer, txn: Checkpoint, stop: threading.Event) -> None:
        self._counts["producer_restarts"] += 1
        self.metrics.producer_restarts.inc()
        # init_transactions() aborts (or completes) whatever the old producer left open; retried until the
        # broker answers, False if stopped first (then there is nothing to rewind: we are leaving the group).
        if producer.restart():
            rewind(self._consumer, txn.first_offsets(), stop)

    # --- housekeeping ------------------------------------------------------------------
    def _partition_counts_match(self, consumer: Any) -> bool:
        """Results go to the request's partition number when both topics have the same partition count."""
        spec = self.config.spec
        try:
            md = consumer.list_topics(timeout=10)
            req = md.topics.get(spec.topics.requests)
            res = md.topics.get(spec.topics.results)
            return bool(req and res and not req.error and not res.error
                        and len(req.partitions) == len(res.partitions) > 0)
        except KafkaException as exc:
            log.warning("topic metadata unavailable (%s); results partitioned by key", exc)
            return False

    def _update_lag(self, consumer: Any) -> None:
        gauge = self.metrics.consumer_lag
        for partition, lag in consumer_lag(consumer).items():
            gauge.labels(partition=str(partition)).set(lag)

    def _shutdown(self, consumer: Any, producer: TransactionalProducer) -> None:
        close_quietly(consumer, producer)  # leaves the group: partitions move to the other replicas at once
        self.metrics.close()


def _infer_isolating_strict(backend: Any, rows: list[dict]) -> list[Any]:
    out = backend.infer(rows)
    if type(out) is not list or len(out) != len(rows):
        raise ValueError("backend returned the wrong number of outputs")
    return out


def run_scorer(config: ScorerConfig, backend_factory: Callable[[Any], Any], stop_event: threading.Event,
               on_ready: Callable[[Scorer], None] | None = None, **scorer_kwargs: Any) -> ScorerSummary:
    """Serve ``config.spec`` until ``stop_event`` is set; the library entry point (CLI and node agent).

    ``backend_factory(spec)`` returns a *loaded* backend for the spec's version.  With one version the
    routing table sends it 100% of traffic; call ``scorer.set_routing`` (from ``on_ready``) to change that.
    """
    backend = backend_factory(config.spec)
    scorer = Scorer(config, RoutingTable.single(config.spec.version, backend), **scorer_kwargs)
    return scorer.run(stop_event, on_ready=(lambda: on_ready(scorer)) if on_ready else None)
