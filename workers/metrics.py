"""The agent's Prometheus /metrics: node and GPU gauges, replica states, restarts.

A registry of its own (not the process-global default) so two agents in one test
process, or an agent and a scorer, never collide.  Values are refreshed from the
inventory and the supervisor's snapshots once per heartbeat, so a scrape never
touches NVML or the supervisor.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sie.kernel.probe_http import start_metrics_server as start_http_server  # bounded (idle timeout, cap)
from sie.schemas.replica_state import AGENT_STATES, ReplicaState

#: one-hot series per replica: the states an agent can be in (never UNKNOWN / UNSCHEDULABLE), in wire order
_REPLICA_STATES = tuple(s for s in ReplicaState if s in AGENT_STATES)

_MB = 1024 * 1024


class AgentMetrics:
    def __init__(self, node: str, registry: CollectorRegistry | None = None) -> None:
        self.node = node
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.node_info = Gauge("sie_node_info", "Node identity (value 1).", ["node", "tier", "hostname"], registry=r)
        self.cpu_count = Gauge("sie_node_cpu_count", "CPU cores usable by the agent.", ["node"], registry=r)
        self.memory_bytes = Gauge("sie_node_memory_bytes", "Host memory.", ["node", "kind"], registry=r)
        gpu_labels = ["node", "gpu", "uuid", "product", "simulated"]
        self.gpu_memory = Gauge("sie_gpu_memory_bytes", "GPU memory (total/used/free).", [*gpu_labels, "kind"], registry=r)
        self.gpu_util = Gauge("sie_gpu_utilization_ratio", "GPU utilisation 0..1.", gpu_labels, registry=r)
        self.gpu_temp = Gauge("sie_gpu_temperature_celsius", "GPU temperature.", gpu_labels, registry=r)
        self.gpu_healthy = Gauge("sie_gpu_healthy", "1 if NVML could query the GPU.", gpu_labels, registry=r)
        self.replica_state = Gauge(
            "sie_replica_state", "1 for the replica's current state, 0 otherwise.", ["node", "replica", "model", "state"], registry=r
        )
        self.replica_restarts = Gauge(
            "sie_replica_restarts", "Restarts of the replica's worker since it was assigned.", ["node", "replica", "model"], registry=r
        )
        self.replica_records = Gauge(
            "sie_replica_records", "Records scored by the replica's current worker.", ["node", "replica", "model"], registry=r
        )
        self.transitions = Counter(
            "sie_replica_transitions_total", "Replica state changes.", ["node", "model", "state"], registry=r
        )
        self.heartbeats = Counter("sie_agent_heartbeats_total", "Heartbeats published.", ["node"], registry=r)
        self.assignments = Counter("sie_agent_assignments_total", "Assignment records applied.", ["node"], registry=r)
        self.loop_errors = Counter("sie_agent_loop_errors_total", "Failures of one agent subsystem pass.", ["node", "subsystem"], registry=r)
        self.update_seconds = Histogram(
            "sie_agent_update_seconds", "Duration of one supervisor update pass.", ["node"], registry=r,
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0),
        )
        self.start_seconds = Histogram(
            "sie_replica_start_seconds", "Worker launch to READY (readiness inference passed), by start kind.",
            ["node", "model", "start"], registry=r,
            buckets=(0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 60.0, 120.0, 300.0),
        )
        self.pool_workers = Gauge("sie_warm_pool_workers", "Warm-pool workers, by state (warm, starting).",
                                  ["node", "state"], registry=r)
        self.pool_memory = Gauge("sie_warm_pool_memory_bytes", "Host memory the warm pool holds.", ["node"], registry=r)
        self._known_replicas: set[tuple[str, str]] = set()

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start the /metrics HTTP server; returns the bound port (``port=0`` picks a free one)."""
        result = start_http_server(port, addr=addr, registry=self.registry)
        server = result[0] if isinstance(result, tuple) else None
        return int(server.server_port) if server is not None else port

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def observe_inventory(self, inventory: Any, tier: str | None) -> None:
        node = self.node
        self.node_info.labels(node, tier or "", inventory.hostname).set(1)
        self.cpu_count.labels(node).set(inventory.cpu_count)
        self.memory_bytes.labels(node, "total").set(inventory.memory_mb * _MB)
        self.memory_bytes.labels(node, "available").set(inventory.memory_available_mb * _MB)
        self.observe_gpus(inventory.gpus)

    def observe_gpus(self, gpus: Iterable[Any]) -> None:
        for gpu in gpus:
            labels = (self.node, str(gpu.index), gpu.uuid, gpu.product, "true" if gpu.simulated else "false")
            self.gpu_memory.labels(*labels, "total").set(gpu.memory_total_mb * _MB)
            self.gpu_memory.labels(*labels, "used").set(gpu.memory_used_mb * _MB)
            self.gpu_memory.labels(*labels, "free").set(gpu.memory_free_mb * _MB)
            self.gpu_util.labels(*labels).set(gpu.utilization_pct / 100.0)
            self.gpu_temp.labels(*labels).set(gpu.temperature_c)
            self.gpu_healthy.labels(*labels).set(1 if gpu.healthy else 0)

    def observe_replicas(self, snapshots: Iterable[Any]) -> None:
        """Set one-hot state gauges; replicas that disappeared are removed from the exposition."""
        seen: set[tuple[str, str]] = set()
        for snap in snapshots:
            key = (snap.replica_id, snap.model)
            seen.add(key)
            for state in _REPLICA_STATES:
                self.replica_state.labels(self.node, snap.replica_id, snap.model, state.value).set(
                    1 if snap.state == state else 0
                )
            self.replica_restarts.labels(self.node, snap.replica_id, snap.model).set(snap.restarts)
            self.replica_records.labels(self.node, snap.replica_id, snap.model).set(snap.records)
        for replica_id, model in self._known_replicas - seen:
            for state in _REPLICA_STATES:
                self.replica_state.remove(self.node, replica_id, model, state.value)
            self.replica_restarts.remove(self.node, replica_id, model)
            self.replica_records.remove(self.node, replica_id, model)
        self._known_replicas = seen

    def observe_transition(self, snapshot: Any) -> None:
        self.transitions.labels(self.node, snapshot.model, snapshot.state.value).inc()
        if snapshot.state == ReplicaState.READY and getattr(snapshot, "start_s", None) is not None:
            self.start_seconds.labels(self.node, snapshot.model, "warm" if snapshot.warm else "cold").observe(snapshot.start_s)

    def observe_pool(self, status: dict[str, Any]) -> None:
        self.pool_workers.labels(self.node, "warm").set(status["warm"])
        self.pool_workers.labels(self.node, "starting").set(status["starting"])
        self.pool_memory.labels(self.node).set(status["memory_mb"] * _MB)
