"""Prometheus metrics of one scorer, on its own CollectorRegistry.

A per-scorer registry lets tests (and a node agent) run several scorers in one process.  Every
series carries ``model_id`` (a dashboard or rule can ``sum by (model_id)`` across replicas), and the
latency histograms carry the SIE article's unified labels (``model_id``, ``service_type``,
``priority_level``) plus ``version`` (a rollout compares versions).  Two latency histograms:

- ``sie_inference_latency_seconds``: one batched ``backend.infer()`` call (what the model costs);
- ``sie_request_latency_seconds``: per request, its Kafka timestamp to the commit of its result (what
  the caller waits; ``spec.sla.p99_latency_ms``, exported as ``sie_model_p99_budget_seconds``, is the
  budget of this one).

Everything is updated per batch, never per message: the per-request histogram is filled from the
batch's queue times in one vectorised pass (``BatchHistogram``).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from sie.kernel.probe_http import start_metrics_server as start_http_server  # bounded (idle timeout, cap)
from sie.streams.scorer.errors import DeadLetterReason

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_QUEUE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
#: how far back ``recent_p99`` looks (the status page's "p99 now", not Prometheus' 5 m window)
_RECENT_WINDOW_S = 60.0


class BatchHistogram(Collector):
    """A labelled Prometheus histogram filled with many observations at once (``observe_many``).

    ``prometheus_client.Histogram.observe`` takes a lock per value; a 1024-record batch would pay that
    1024 times.  Here a batch costs one ``numpy.searchsorted`` + ``bincount`` per label set.  The
    exposition is an ordinary histogram (``_bucket{le}``, ``_count``, ``_sum``).
    """

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float],
                 registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self.bounds = np.asarray(buckets, dtype=float)
        self._lock = threading.Lock()
        #: label values -> (per-bucket counts incl. +Inf, sum)
        self._series: dict[tuple[str, ...], tuple[np.ndarray, list[float]]] = {}
        registry.register(self)

    def _get(self, labels: tuple[str, ...]) -> tuple[np.ndarray, list[float]]:
        series = self._series.get(labels)
        if series is None:
            series = self._series[labels] = (np.zeros(len(self.bounds) + 1, dtype=np.int64), [0.0])
        return series

    def touch(self, *labelvalues: str) -> None:
        """Export the series at 0 before its first observation (a rule or panel finds it at once)."""
        with self._lock:
            self._get(tuple(labelvalues))

    def observe_many(self, values: Any, *labelvalues: str) -> None:
        array = np.asarray(values, dtype=float)
        if array.size == 0:
            return
        # le is inclusive: a value equal to a bound belongs to that bucket (side="left")
        counts = np.bincount(np.searchsorted(self.bounds, array, side="left"), minlength=len(self.bounds) + 1)
        total = float(array.sum())
        with self._lock:
            buckets, acc = self._get(tuple(labelvalues))
            buckets += counts
            acc[0] += total

    def snapshot(self, *labelvalues: str) -> tuple[np.ndarray, float] | None:
        """(per-bucket counts incl. +Inf, sum) of one label set; None before it exists."""
        with self._lock:
            series = self._series.get(tuple(labelvalues))
            return None if series is None else (series[0].copy(), series[1][0])

    def label_sets(self) -> list[tuple[str, ...]]:
        with self._lock:
            return list(self._series)

    def describe(self) -> Iterable[HistogramMetricFamily]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterable[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        with self._lock:
            items = [(labels, buckets.copy(), acc[0]) for labels, (buckets, acc) in self._series.items()]
        edges = [*(_fmt(b) for b in self.bounds), "+Inf"]
        for labels, buckets, total in items:
            cumulative = np.cumsum(buckets)
            family.add_metric(list(labels), list(zip(edges, (float(c) for c in cumulative))), total)
        return [family]


def _fmt(bound: float) -> str:
    return repr(float(bound))


def quantile_from_buckets(bounds: Sequence[float], counts: Sequence[float], q: float) -> float | None:
    """Prometheus' ``histogram_quantile`` over one histogram's per-bucket counts (last = +Inf);
    None when it holds no observation."""
    total = float(sum(counts))
    if total <= 0:
        return None
    rank = q * total
    cumulative = 0.0
    for i, count in enumerate(counts):
        below = cumulative
        cumulative += float(count)
        if cumulative >= rank and count > 0:
            if i >= len(bounds):  # the +Inf bucket: the highest finite bound, as Prometheus answers
                return float(bounds[-1])
            lower = float(bounds[i - 1]) if i > 0 else 0.0
            return lower + (float(bounds[i]) - lower) * (rank - below) / float(count)
    return float(bounds[-1])


class ScorerMetrics:
    """The scorer's instruments; ``serve(port)`` exposes them over HTTP (``port`` 0: any free port)."""

    def __init__(self, model_id: str, service_type: str, priority_level: str, version: str = "",
                 p99_budget_ms: float | None = None) -> None:
        self.model_id, self.service_type, self.priority_level = model_id, service_type, priority_level
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        unified = ["model_id", "service_type", "priority_level", "version"]
        self._inference = Histogram(
            "sie_inference_latency_seconds", "Time of one batched backend.infer() call.",
            unified, buckets=_LATENCY_BUCKETS, registry=r)
        self.request_latency = BatchHistogram(
            "sie_request_latency_seconds",
            "Per request: its Kafka timestamp to the commit of its result (ok or expired).",
            unified, _REQUEST_BUCKETS, r)
        mid = ["model_id"]
        self.queue_time = Histogram(
            "sie_queue_time_seconds", "Oldest record of a batch: its timestamp to the start of the batch.", mid,
            buckets=_QUEUE_BUCKETS, registry=r).labels(model_id)
        self.batch_size = Histogram(
            "sie_batch_size", "Records per transaction.", mid, buckets=_BATCH_BUCKETS, registry=r).labels(model_id)
        self.records_in = Counter(
            "sie_records_in", "Request records consumed and committed.", mid, registry=r).labels(model_id)
        self.records_out = Counter(
            "sie_records_out", "Result records committed, by status.", ["model_id", "status"], registry=r)
        self.dead_letters = Counter(
            "sie_dead_letters", "Dead letters committed, by reason.", ["model_id", "reason"], registry=r)
        self.txn_commit = Histogram(
            "sie_txn_commit_seconds", "Time to add the offsets to the transaction and commit it.", mid,
            buckets=_LATENCY_BUCKETS, registry=r).labels(model_id)
        self.txn_aborts = Counter(
            "sie_txn_aborts", "Aborted transactions (batch re-read).", mid, registry=r).labels(model_id)
        self.producer_restarts = Counter(
            "sie_producer_restarts", "Transactional producer re-created after a fatal error.", mid,
            registry=r).labels(model_id)
        self.backend_outages = Counter(
            "sie_backend_outages", "Batches retried because the backend failed on a known-good row.", mid,
            registry=r).labels(model_id)
        self._in_outage = Gauge(
            "sie_backend_outage", "1 while the backend is in an outage: since a batch was retried because it "
            "failed on a known-good row, and until a batch scores again.", mid, registry=r).labels(model_id)
        self._lag = Gauge(
            "sie_consumer_lag", "High watermark minus position, per assigned partition.", ["model_id", "partition"],
            registry=r)
        self.p99_budget = Gauge(
            "sie_model_p99_budget_seconds", "The model's spec.sla.p99_latency_ms (its per-request latency budget).",
            ["model_id", "service_type", "priority_level"], registry=r)
        # every series a rule or a dashboard names exists from the start (a 0, not a gap)
        for status in ("ok", "expired"):
            self.records_out.labels(model_id, status)
        for reason in DeadLetterReason:
            self.dead_letters.labels(model_id, reason.value)
        if version:
            self.inference(version)
            self.request_latency.touch(model_id, service_type, priority_level, version)
        if p99_budget_ms is not None:
            self.p99_budget.labels(model_id, service_type, priority_level).set(p99_budget_ms / 1000.0)
        self._lag_partitions: set[str] = set()
        #: (monotonic time, per-bucket counts summed over versions) samples for ``recent_p99``
        self._recent: list[tuple[float, np.ndarray]] = []
        self._server: Any = None
        self.port: int | None = None
        #: (wall time it began, the latest failure) while the backend is in an outage, else None
        self._outage: tuple[float, str] | None = None

    @classmethod
    def for_spec(cls, spec: Any) -> ScorerMetrics:
        """``model_id`` is the model's name (not ``name:version``): a model keeps its series across a
        rollout, ``version`` tells the versions apart, and the control plane's per-model series
        (``sie_control_model_*{model_id}``) join with these on the same value."""
        return cls(spec.name, spec.service_type, spec.priority_level, spec.version,
                   getattr(spec.sla, "p99_latency_ms", None))

    # --- instruments per label set -----------------------------------------------------------------
    def inference(self, version: str) -> Any:
        """The inference histogram of one version (a routing table may split traffic between two)."""
        return self._inference.labels(self.model_id, self.service_type, self.priority_level, version)

    def set_lag(self, lags: Mapping[int, int]) -> None:
        """One value per assigned partition; partitions no longer assigned are dropped, not left stale."""
        seen = set()
        for partition, lag in lags.items():
            key = str(partition)
            seen.add(key)
            self._lag.labels(self.model_id, key).set(lag)
        for gone in self._lag_partitions - seen:
            self._lag.remove(self.model_id, gone)
        self._lag_partitions = seen

    def clear_lag(self) -> None:
        self._lag.clear()
        self._lag_partitions = set()

    def lag(self) -> int:
        """The sum of the per-partition lags last measured (what the agent reports for the replica)."""
        return int(sum(self.value("sie_consumer_lag", {"model_id": self.model_id, "partition": p})
                       for p in self._lag_partitions))

    # --- the backend's outages --------------------------------------------------------------------
    def backend_outage(self, detail: str, now: float) -> None:
        """A batch is retried because the backend failed on a known-good row (``BackendUnavailable``): the
        outage begins (``now``, wall seconds) or goes on, with ``detail`` as its latest reason."""
        self.backend_outages.inc()
        since = self._outage[0] if self._outage is not None else now
        self._outage = (since, " ".join(str(detail).split())[:500])
        self._in_outage.set(1)

    def set_outage(self, since: float | None, detail: str = "") -> None:
        """For a stage that sees its backend's state itself (the LLM window: no endpoint in service): the outage
        that began at ``since`` (wall seconds) goes on with ``detail``, or ends (None).  Counts nothing: the
        caller counts each outage once (``backend_outages``)."""
        if since is None:
            self._outage = None
            self._in_outage.set(0)
        else:
            self._outage = (since, " ".join(str(detail).split())[:500])
            self._in_outage.set(1)

    def outage(self) -> dict[str, Any] | None:
        """``{"since_ms", "detail"}`` while the backend is in an outage (what the agent forwards), else None."""
        if self._outage is None:
            return None
        return {"since_ms": int(self._outage[0] * 1000), "detail": self._outage[1]}

    # --- one committed batch -----------------------------------------------------------------------
    def batch_committed(self, stats: Mapping[str, Any], n: int, commit_s: float | None, now_ms: float) -> None:
        """Count a committed batch; ``stats`` is the scorer's prepared summary (``ok``, ``expired``,
        ``dead`` by reason, ``oldest_ms``, ``queued``: version -> queue times in ms of its results,
        ``at_ms``: wall time the batch was prepared).  A batch with results ends an outage (the backend
        scored again; a batch of expired or invalid requests alone never called it)."""
        mid = self.model_id
        if stats["ok"] and self._outage is not None:
            self._outage = None
            self._in_outage.set(0)
        self.records_in.inc(n)
        self.batch_size.observe(n)
        if commit_s is not None:
            self.txn_commit.observe(commit_s)
        self.queue_time.observe(stats["oldest_ms"] / 1000.0)
        if stats["ok"]:
            self.records_out.labels(mid, "ok").inc(stats["ok"])
        if stats["expired"]:
            self.records_out.labels(mid, "expired").inc(stats["expired"])
        for reason, count in stats["dead"].items():
            self.dead_letters.labels(mid, reason).inc(count)
        queued = stats.get("queued")
        if queued:
            since_prepare_ms = max(0.0, now_ms - float(stats.get("at_ms", now_ms)))
            for version, queue_ms in queued.items():
                values = (np.asarray(queue_ms, dtype=float) + since_prepare_ms) / 1000.0
                self.request_latency.observe_many(values, mid, self.service_type, self.priority_level, version)

    # --- the replica's own summary (what the agent forwards to the control plane) ------------------
    def recent_p99(self, now: float | None = None, window_s: float = _RECENT_WINDOW_S) -> float | None:
        """p99 of the per-request latency (seconds) over about the last ``window_s`` (all versions), from
        the difference of two snapshots of the histogram, as ``histogram_quantile(rate(...))`` would;
        None when no request completed in the window.  Call it regularly (the worker's progress loop)."""
        now = time.monotonic() if now is None else now
        total = np.zeros(len(self.request_latency.bounds) + 1, dtype=np.int64)
        for labels in self.request_latency.label_sets():
            snap = self.request_latency.snapshot(*labels)
            if snap is not None:
                total += snap[0]
        self._recent.append((now, total))
        while len(self._recent) > 2 and now - self._recent[1][0] >= window_s:
            self._recent.pop(0)
        delta = total - self._recent[0][1]
        return quantile_from_buckets(list(self.request_latency.bounds), list(delta), 0.99)

    # --- HTTP ----------------------------------------------------------------------------------------
    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start the /metrics HTTP server (a daemon thread); returns the bound port."""
        self._server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self.port = int(self._server.server_port)
        return self.port

    def close(self) -> None:
        """Stop the /metrics server and free its port.  ``shutdown()`` alone waits until the server loop's
        select (every 0.5 s) returns: up to 0.5 s of every planned stop, in which a
        replica handing over to its successor still held its partitions' id.  A connection wakes it."""
        server, self._server = self._server, None
        if server is None:
            return
        stopper = threading.Thread(target=server.shutdown, name="metrics-shutdown", daemon=True)
        stopper.start()
        try:
            with socket.create_connection(tuple(server.server_address[:2]), timeout=0.5):
                pass
        except OSError:  # nothing listens any more: the loop is ending anyway
            pass
        stopper.join(2.0)
        server.server_close()

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Current sample value (for tests and the exit summary); 0.0 if never set."""
        return self.registry.get_sample_value(name, labels or {}) or 0.0


__all__ = ["BatchHistogram", "ScorerMetrics", "quantile_from_buckets"]
