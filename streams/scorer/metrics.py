"""Prometheus metrics of one scorer, on its own CollectorRegistry.

A per-scorer registry lets tests (and a node agent) run several scorers in one
process.  ``inference_latency_seconds`` uses exactly the labels of the SIE
article's unified schema (``model_id``, ``service_type``, ``priority_level``)
so dashboards work across every model; the ``sie_*`` series are
scorer-internal.  Everything is updated per batch, never per message.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_QUEUE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class ScorerMetrics:
    """The scorer's instruments; ``serve(port)`` exposes them over HTTP."""

    def __init__(self, model_id: str, service_type: str, priority_level: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.inference_latency = Histogram(
            "inference_latency_seconds", "Time of one batched backend.infer() call.",
            ["model_id", "service_type", "priority_level"], buckets=_LATENCY_BUCKETS, registry=r,
        ).labels(model_id=model_id, service_type=service_type, priority_level=priority_level)
        self.queue_time = Histogram(
            "sie_queue_time_seconds", "Record timestamp to start of its batch.", buckets=_QUEUE_BUCKETS, registry=r)
        self.batch_size = Histogram(
            "sie_batch_size", "Records per transaction.", buckets=_BATCH_BUCKETS, registry=r)
        self.records_in = Counter("sie_records_in", "Request records consumed and committed.", registry=r)
        self.records_out = Counter(
            "sie_records_out", "Result records committed, by status.", ["status"], registry=r)
        self.dead_letters = Counter(
            "sie_dead_letters", "Dead letters committed, by reason.", ["reason"], registry=r)
        self.txn_commit = Histogram(
            "sie_txn_commit_seconds", "Time to add the offsets to the transaction and commit it.",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.txn_aborts = Counter("sie_txn_aborts", "Aborted transactions (batch re-read).", registry=r)
        self.producer_restarts = Counter(
            "sie_producer_restarts", "Transactional producer re-created after a fatal error.", registry=r)
        self.backend_outages = Counter(
            "sie_backend_outages", "Batches retried because the backend failed on a known-good row.", registry=r)
        self.consumer_lag = Gauge(
            "sie_consumer_lag", "High watermark minus position, per assigned partition.", ["partition"], registry=r)
        self._server: Any = None

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Start the /metrics HTTP server (a daemon thread)."""
        self._server, _thread = start_http_server(port, addr=addr, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Current sample value (for tests and the exit summary); 0.0 if never set."""
        return self.registry.get_sample_value(name, labels or {}) or 0.0
