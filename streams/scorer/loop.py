"""The scorer: a model's request topic -> validate -> route -> infer -> results / dead letters, exactly once.

The consume loop, the transaction cycle and every recovery path are the exactly-once layer's
(``sie.streams.eos.StreamLoop`` / ``ExactlyOnce``); this module only says what one batch means::

    for record: parse/validate -> dead letter (poison) | expired result | group by version
    for version: ONE inference over its rows -> results (failing rows isolated, dead-lettered;
                 an output that breaks spec.outputSchema is dead-lettered output_violation, never ok)
    (the layer then commits offsets + results + dead letters atomically)

``BackendUnavailable`` (a ``RetryLater``) makes the layer abort and retry the batch after a backoff:
an outage never becomes dead letters.  With ``ScorerConfig.pipelined`` (``sie score --pipelined``; serial is
the default, ``sie.streams.eos.cycle.PIPELINED_DEFAULT``, the same for every stage) batch N commits on the
producer's committer thread while batch N+1 is parsed, validated and scored here.
A stop request (SIGTERM) is honoured between batches: the batch in flight is committed, the consumer
closed (leaving the group), and ``run`` returns a summary.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaException

from sie.kernel.clients import KafkaClients
from sie.kernel.tracing import Tracing, tracing_from_settings
from sie.streams.eos import StageSettings, StreamLoop
from sie.streams.eos.deadletter import dead_letter
from sie.streams.eos.errors import RetryLater
from sie.streams.eos.lag import consumer_lag
from sie.streams.eos.records import Output, Prepared
from sie.streams.eos.stage import PreparedClients
from sie.streams.scorer.codec import Codec, Poison, Request, default_id
from sie.streams.scorer.config import ScorerConfig
from sie.streams.scorer.errors import DeadLetterReason, VersionLost, VersionsNotReady
from sie.streams.scorer.inference import Inference, InferenceFailed, canary_row
from sie.streams.scorer.metrics import ScorerMetrics
from sie.streams.scorer.routing import RouteEntry, RoutingTable
from sie.streams.scorer.tracing import ScorerTrace

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


class _MetricsObserver:
    """The layer's failure events as the scorer's Prometheus counters (and its outage state, which the
    agent forwards to the control plane: ``ScorerMetrics.outage``)."""

    def __init__(self, metrics: ScorerMetrics, wall_clock: Callable[[], float] = time.time) -> None:
        self._m = metrics
        self._wall = wall_clock

    def aborted(self) -> None:
        self._m.txn_aborts.inc()

    def producer_restarted(self) -> None:
        self._m.producer_restarts.inc()

    def retry_later(self, exc: RetryLater) -> None:
        if isinstance(exc, VersionsNotReady):  # not an outage: the replica hands its partitions over (rollout.py)
            return
        self._m.backend_outage(str(exc), self._wall())


class Scorer:
    """Scores one model's request topic exactly once. Build, then ``run(stop_event)``."""

    def __init__(self, config: ScorerConfig, routing: RoutingTable, *,
                 validator: Callable[[dict], dict] | None = None,
                 clients: KafkaClients | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 metrics: ScorerMetrics | None = None,
                 tracing: Tracing | None = None) -> None:
        spec = config.spec
        self.config = config
        self._routing = routing
        if validator is None:
            from sie.schemas.validation import compile_validator

            validator = compile_validator(spec.input_schema)
        self._codec = Codec(spec.name, validator, config.request_limit, config.max_json_depth)
        from sie.schemas.validation import compile_output_check

        #: spec.outputSchema enforced on every result (None: the spec declares none); compiled once
        self._check_outputs = compile_output_check(spec.output_schema)
        self._clients = clients or KafkaClients()
        self._prepared: PreparedClients | None = None
        self._clock = clock
        self._wall = wall_clock
        self.metrics = metrics or ScorerMetrics.for_spec(spec)
        #: spans of traced requests (sie.kernel.tracing); off unless SIE_TRACING or a test says otherwise
        self._trace = ScorerTrace(tracing or tracing_from_settings(config.settings, "sie-scorer"), spec.name)
        self._results_topic = spec.topics.results
        self._dlq_topic = spec.topics.dead_letters
        self._max_queue_ms = spec.sla.max_queue_time_ms
        self._canary = canary_row(getattr(spec, "example_input", None), validator)
        self._inference: dict[int, Inference] = {}  # by id(backend): one canary per backend
        self._same_partition = False
        #: the producer's message.max.bytes: dead letters are fitted to it
        self._max_record_bytes = config.settings.max_record_bytes
        self._loop: StreamLoop | None = None
        self._counts = dict(batches=0, records_in=0, results=0, expired=0, dead_letters=0)

    # --- routing -------------------------------------------------------------------
    @property
    def routing(self) -> RoutingTable:
        return self._routing

    def set_routing(self, table: RoutingTable) -> None:
        """Swap the routing table; takes effect at the next batch (a batch uses one table throughout)."""
        self._routing = table

    # --- running ---------------------------------------------------------------------
    def run(self, stop: threading.Event, on_ready: Callable[[], None] | None = None) -> ScorerSummary:
        cfg = self.config
        if cfg.metrics_port is not None:
            self.metrics.serve(cfg.metrics_port, cfg.settings.metrics_bind)
        self._loop = StreamLoop(StageSettings(
            name=f"scorer {cfg.spec.name}", topics=[cfg.spec.topics.requests],
            producer_config=cfg.producer_config(), consumer_config=cfg.consumer_config(),
            max_batch=cfg.max_batch, max_wait_s=cfg.max_wait_ms / 1000, idle_s=cfg.poll_timeout_ms / 1000,
            tick_interval_s=cfg.lag_interval_s, limits=cfg.eos_limits(), pipelined=cfg.pipelined,
            fenced_hint=f"another live scorer probably uses --instance {cfg.instance}: give every replica a "
                        f"distinct --instance"),
            self, clients=self._clients, observer=_MetricsObserver(self.metrics, self._wall), clock=self._clock)
        try:
            self._loop.run(stop, on_ready)
        finally:
            self.metrics.close()
            self._trace.flush()
        return self.summary()

    def prepare_clients(self) -> None:
        """Create the Kafka clients now (``PreparedClients``: a standby successor); ``run`` fences and joins."""
        cfg = self.config
        self._prepared = PreparedClients(self._clients, cfg.producer_config(), cfg.consumer_config())
        self._clients = self._prepared.clients

    def close_prepared(self) -> None:
        """Close prepared clients that were never taken (a standby stopped before it served)."""
        if self._prepared is not None:
            self._prepared.close()

    def summary(self) -> ScorerSummary:
        eos = self._loop.eos if self._loop else None
        return ScorerSummary(**self._counts, aborts=eos.aborts if eos else 0,
                             producer_restarts=eos.producer_restarts if eos else 0)

    # --- BatchProcessor: what the exactly-once layer calls ------------------------------
    def started(self, consumer: Any) -> None:
        self._same_partition = self._partition_counts_match(consumer)

    def partitions_assigned(self, consumer: Any, partitions: list[Any]) -> None:
        # partitions may have been added to the request topic since we looked: results go to the request's
        # partition number only while both topics have as many partitions (else: by key)
        self._same_partition = self._partition_counts_match(consumer)

    def tick(self, consumer: Any) -> None:
        self.metrics.set_lag(consumer_lag(consumer))

    def partitions_dropped(self, partitions: list[Any], lost: bool) -> None:
        self.metrics.clear_lag()

    def prepare(self, batch: list) -> Prepared[dict[str, Any]]:
        """One output per record of ``batch``, in batch order, built before any transaction opens."""
        table = self._routing  # one table for the whole batch, even if set_routing() runs meanwhile
        codec = self._codec
        now_ms = self._wall() * 1000.0
        t0 = self._clock()
        max_q = self._max_queue_ms
        results_topic = self._results_topic
        same_partition = self._same_partition
        check_outputs = self._check_outputs
        outputs: list[Output | None] = [None] * len(batch)
        groups: dict[str, tuple[RouteEntry, list[int], list[Request], list[float]]] = {}
        dead: dict[str, int] = {}
        expired = 0
        oldest_ms = 0.0
        #: version -> queue times (ms) of the requests answered with a result: the per-request latency
        queued: dict[str, list[float]] = {}
        for i, msg in enumerate(batch):
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            ts_type, ts = msg.timestamp()
            ts_ms = None if ts_type == TIMESTAMP_NOT_AVAILABLE else ts
            key = msg.key()
            parsed = codec.parse(topic, partition, offset, key, msg.value(), ts_ms)
            if type(parsed) is Poison:
                entry = table.route(key, default_id(topic, partition, offset))
                outputs[i] = self._dead_letter(msg, parsed.reason, parsed.detail, entry.version)
                dead[parsed.reason.value] = dead.get(parsed.reason.value, 0) + 1
                continue
            entry = table.route(key, parsed.id)
            queue_ms = now_ms - ts_ms if ts_ms is not None and ts_ms < now_ms else 0.0
            if queue_ms > oldest_ms:
                oldest_ms = queue_ms
            if max_q is not None and queue_ms > max_q:
                if self.config.expired_to == "result":
                    outputs[i] = Output(results_topic, codec.expired(parsed, entry.version, queue_ms, max_q), key,
                                        partition if same_partition else -1, None, msg, "expired")
                    expired += 1
                    queued.setdefault(entry.version, []).append(queue_ms)
                else:
                    outputs[i] = self._dead_letter(
                        msg, DeadLetterReason.EXPIRED,
                        f"timestamp: queued {queue_ms:.0f} ms > sla.max_queue_time_ms {max_q:g}", entry.version)
                    dead["expired"] = dead.get("expired", 0) + 1
                continue
            group = groups.get(entry.version)
            if group is None:
                group = groups[entry.version] = (entry, [], [], [])
            group[1].append(i)
            group[2].append(parsed)
            group[3].append(queue_ms)

        ok = 0
        timing: dict[str, tuple[float, float, int]] = {}  # version -> (start after t0 ms, duration ms, rows)
        for version, (entry, indices, requests, queue_times) in groups.items():
            rows = [r.inputs for r in requests]
            started = self._clock()
            try:
                scored = self._inference_for(entry.backend).run(rows)  # BackendUnavailable: nothing produced yet
            except VersionLost as lost:
                # a companion version's process died or hung: no other version answers its rows (a key's version
                # is its bucket's); the batch is refused, nothing of it produced
                self.version_lost(lost)
                raise VersionsNotReady(str(lost)) from lost
            inference_ms = (self._clock() - started) * 1000.0
            self.metrics.inference(version).observe(inference_ms / 1000.0)
            n = len(rows)
            timing[version] = ((started - t0) * 1000.0, inference_ms, n)
            answered = queued.setdefault(version, [])
            for i, req, queue_ms, out in zip(indices, requests, queue_times, scored):
                reason = DeadLetterReason.INFERENCE_ERROR
                detail = out.detail if type(out) is InferenceFailed else None
                if detail is None and check_outputs is not None:
                    try:
                        out = check_outputs(out)
                    except ValueError as exc:  # SchemaViolation naming outputs.<field>: never an ok result
                        reason, detail = DeadLetterReason.OUTPUT_VIOLATION, f"model {codec.model} {version}: {exc}"
                if detail is None:
                    try:
                        value = codec.result(req, version, out, queue_ms, inference_ms, n)
                    except TypeError as exc:
                        detail = f"outputs: not JSON-serialisable ({exc})"
                    else:
                        outputs[i] = Output(results_topic, value, req.key,
                                            req.partition if same_partition else -1, None, batch[i], "result")
                        ok += 1
                        answered.append(queue_ms)
                        continue
                outputs[i] = self._dead_letter(batch[i], reason, detail, version)
                dead[reason.value] = dead.get(reason.value, 0) + 1
        stats = {"ok": ok, "expired": expired, "dead": dead, "oldest_ms": oldest_ms, "queued": queued, "at_ms": now_ms}
        if self._trace.enabled:
            versions = {i: v for v, group in groups.items() for i in group[1]}
            stats["spans"] = self._trace.prepared(batch, outputs, versions, timing, now_ms)
        return Prepared([o for o in outputs if o is not None], stats)

    def version_lost(self, lost: VersionLost) -> None:
        """A version's process was lost mid-call (the batch is refused and retried later): a single-version
        scorer has no companion version; the rollout scorer marks it lost."""

    def rejected(self, output: Output, detail: str, stats: dict[str, Any]) -> Output:
        """A result the producer refused (too large with the request's metadata copied in): its request is
        dead-lettered instead, and counted as such."""
        stats["expired" if output.kind == "expired" else "ok"] -= 1
        dead = stats["dead"]
        dead["result_too_large"] = dead.get("result_too_large", 0) + 1
        return self._dead_letter(output.source, DeadLetterReason.RESULT_TOO_LARGE, detail,
                                 self._version_of(output.source))

    def committed(self, stats: dict[str, Any], n: int) -> None:
        """Metrics and counters, only after a successful commit (so they count committed work)."""
        c = self._counts
        c["batches"] += 1
        c["records_in"] += n
        c["results"] += stats["ok"]
        c["expired"] += stats["expired"]
        c["dead_letters"] += sum(stats["dead"].values())
        eos = self._loop.eos if self._loop is not None else None
        commit_s = eos.last_commit_s if eos is not None else None
        # When the commit returned (the layer's stamp): pipelined, this hook runs only when the commit is
        # settled, after the next batch was prepared; the request latency and the commit span end at the commit.
        committed_at = eos.last_times.committed if eos is not None and eos.last_times.committed else self._wall()
        now_ms = committed_at * 1000.0
        self.metrics.batch_committed(stats, n, commit_s, now_ms)
        if "spans" in stats:
            self._trace.committed(stats["spans"], commit_s, now_ms)

    # --- helpers -----------------------------------------------------------------------
    def _inference_for(self, backend: Any) -> Inference:
        inference = self._inference.get(id(backend))
        if inference is None or inference.backend is not backend:
            inference = self._inference[id(backend)] = Inference(backend, self._canary)
        return inference

    def _dead_letter(self, msg: Any, reason: DeadLetterReason, detail: str, version: str) -> Output:
        return dead_letter(self._dlq_topic, msg, reason.value, detail, self._codec.dead_letter_tags(version),
                           self._max_record_bytes)

    def _version_of(self, msg: Any) -> str:
        """The version the routing table gives ``msg`` (for a dead letter built after the fact)."""
        return self._routing.route(msg.key(), default_id(msg.topic(), msg.partition(), msg.offset())).version

    def _partition_counts_match(self, consumer: Any) -> bool:
        """Results go to the request's partition number when both topics have the same partition count."""
        spec = self.config.spec
        try:
            # the two topics only: a request for every topic makes librdkafka cache the whole cluster's
            # metadata in this client (MBs on a cluster of thousands of topics, per scorer: docs/density.md)
            req = consumer.list_topics(spec.topics.requests, timeout=10).topics.get(spec.topics.requests)
            res = consumer.list_topics(spec.topics.results, timeout=10).topics.get(spec.topics.results)
            return bool(req and res and not req.error and not res.error
                        and len(req.partitions) == len(res.partitions) > 0)
        except KafkaException as exc:
            log.warning("topic metadata unavailable (%s); results partitioned by key", exc)
            return False


def run_scorer(config: ScorerConfig, backend_factory: Callable[[Any], Any], stop_event: threading.Event,
               on_ready: Callable[[Scorer], None] | None = None, **scorer_kwargs: Any) -> ScorerSummary:
    """Serve ``config.spec`` alone (one version, no rollout) until ``stop_event`` is set: the library entry point
    for embedding a scorer (benchmarks, tests).  ``sie score`` and the node agent's worker run
    ``sie.streams.scorer.rollout.run_rollout_scorer``, which also follows the model's rollout.

    ``backend_factory(spec)`` returns a *loaded* backend for the spec's version.  With one version the
    routing table sends it 100% of traffic; call ``scorer.set_routing`` (from ``on_ready``) to change that.
    """
    backend = backend_factory(config.spec)
    scorer = Scorer(config, RoutingTable.single(config.spec.version, backend), **scorer_kwargs)
    return scorer.run(stop_event, on_ready=(lambda: on_ready(scorer)) if on_ready else None)
