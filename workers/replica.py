"""Replica state: the frozen desired replica and the one container of actual replicas.

Why separate shapes (Ray Serve's pattern): the desired replica is a value
(frozen, comparable) so "apply the same assignment twice" is a set comparison
that changes nothing; the actual replica is the only mutable thing and lives in
one container the supervisor queries by state, so every question the agent
asks ("what is READY?", "what must be reported?") has one answer.

``ReplicaState`` (and its transition table) lives in ``sie.schemas.replica_state``, the contract
shared with the control plane; it is re-exported here for the agent's code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from sie.schemas.replica_state import ReplicaState
from sie.schemas.replica_template import template_hash

__all__ = ["ActualReplica", "DesiredReplica", "ExitInfo", "ReplicaState", "ReplicaTable"]


@dataclass(frozen=True)
class DesiredReplica:
    """One replica this node should run, as the control plane asked for it.

    ``template_json`` is the replica template (``sie.schemas.replica_template``: the ModelService document
    without the replica count and the rollout block), run as it is; ``template_hash`` its hash as the
    Assignment carried it (empty: computed here).  Two desired replicas with the same id but another template
    (a new model version, new resources) or other GPUs are different targets, and the old process is drained
    before the new one starts.  ``gpu_indices`` are node-local GPU indices (empty = CPU).
    """

    replica_id: str
    model: str
    version: str
    template_json: str
    gpu_indices: tuple[int, ...] = ()
    gpu_memory_mb: int = 0
    epoch: int = 0
    #: during a rollout, the other version's template(s) (JSON) the replica serves from a process of its own;
    #: not part of ``target_hash``: a rollout starting or ending restarts no worker
    companions: tuple[str, ...] = ()
    template_hash: str = ""

    @cached_property
    def target_hash(self) -> str:
        """Short identity of what the process runs: restart iff this changes.  Not part of it: the epoch and
        the companions; nor the model's replica count, which the template leaves out, so scaling a model up or
        down starts or stops only the replicas it adds or removes instead of restarting every one it keeps (a
        restart is a gap in results: bench/results/rollout_handover.txt)."""
        digest = hashlib.sha256()
        digest.update((self.template_hash or template_hash(self.template_json)).encode())
        digest.update(repr((self.gpu_indices, self.gpu_memory_mb)).encode())
        return digest.hexdigest()[:12]


@dataclass(frozen=True)
class ExitInfo:
    """How a worker process ended, decoded from its waitpid status."""

    exit_code: int | None
    signal: int | None
    cause: str


@dataclass
class ActualReplica:
    """What this node is actually doing for one replica id (mutable, owned by the supervisor)."""

    desired: DesiredReplica
    state: ReplicaState = ReplicaState.PENDING
    handle: Any = None  # sie.workers.process.ProcessHandle while a process exists
    restarts: int = 0
    crash_times: list[float] = field(default_factory=list)
    next_start_at: float = 0.0
    started_at: float = 0.0
    last_progress_at: float = 0.0
    drain_deadline: float = 0.0
    records: int = 0
    reason: str = ""
    exit: ExitInfo | None = None
    #: the last ``{"event": "error"}`` detail of the current process (quoted in its crash reason)
    worker_error: str | None = None
    #: set when the replica is no longer desired (or its target changed): drain, then forget it
    retiring: bool = False
    #: the worker's report of the rollout's other version (``{"1.1.0": {"state": ..., "detail": ...}}``)
    versions: dict[str, dict[str, str]] = field(default_factory=dict)
    #: what the current process reported of itself: its /metrics port (``ready``), its consumer lag,
    #: recent per-request p99 and records per second of inference time (``progress``; the autoscaler's
    #: capacity estimate before it measured one); None until it said so, reset when a new process starts
    metrics_port: int | None = None
    lag: int | None = None
    p99_ms: float | None = None
    inference_rps: float | None = None
    #: the backend's outage the current process reports (``{"since_ms", "detail"}``: its batches are retried
    #: because the backend fails on a known-good row); None while it scores
    outage: dict | None = None
    #: why the current process holds no partitions now (a version it routes to is not ready), None while it may
    holding: str | None = None
    #: seconds from launch to READY of the current worker, and whether a warm-pool worker took the launch
    start_s: float | None = None
    warm: bool = False
    #: replace in place (``sie.workers.supervisor`` "hand-over"): ``handing_over``: a retired replica that still
    #: serves until its successor is loaded (DRAINING, no signal yet); ``standby``: a successor launched with
    #: ``--standby`` (loads while its predecessor serves), ``standby_ready`` once it said so, ``serving`` once
    #: told to serve; ``released``: the worker closed its consumer and producer (a successor may take over)
    handing_over: bool = False
    standby: bool = False
    standby_ready: bool = False
    serving: bool = False
    released: bool = False

    @property
    def replica_id(self) -> str:
        return self.desired.replica_id

    @property
    def pid(self) -> int | None:
        return getattr(self.handle, "pid", None)


class ReplicaTable:
    """The one container of actual replicas, keyed by replica id.

    A replica being retired and its successor (same id, new target) can exist at
    once, so the table holds a list per id; ``current(id)`` is the newest.
    """

    def __init__(self) -> None:
        self._by_id: dict[str, list[ActualReplica]] = {}

    def add(self, replica: ActualReplica) -> None:
        self._by_id.setdefault(replica.replica_id, []).append(replica)

    def remove(self, replica: ActualReplica) -> None:
        entries = self._by_id.get(replica.replica_id, [])
        if replica in entries:
            entries.remove(replica)
        if not entries:
            self._by_id.pop(replica.replica_id, None)

    def current(self, replica_id: str) -> ActualReplica | None:
        """The newest non-retiring replica for an id."""
        for replica in reversed(self._by_id.get(replica_id, [])):
            if not replica.retiring:
                return replica
        return None

    def all(self) -> list[ActualReplica]:
        return [r for entries in self._by_id.values() for r in entries]

    def in_state(self, *states: ReplicaState) -> list[ActualReplica]:
        return [r for r in self.all() if r.state in states]

    def __iter__(self) -> Iterator[ActualReplica]:
        return iter(self.all())

    def __len__(self) -> int:
        return len(self.all())
