"""The shapes of the control API's read answers, declared once: each GET route names one as its
``response_model``, so the OpenAPI document describes the answer and FastAPI derives the JSON from it
(validated, then dumped by pydantic's core straight to bytes).

The keys keep the order, names and values of the records the answers are built from
(``ModelStatus.to_record``, ``NodeView.to_json``, ``rollout.service.describe``, ...), which the CLI, the
status page, the Kubernetes operator and bench/bench_scale.py read.  Open-ended documents (a spec
summary's sections, an autoscaler decision, a subsystem's health) stay ``dict[str, Any]``.  A number that
may be whole or not is ``Number`` (``int | float``): a plain ``float`` would turn ``4`` into ``4.0``.  A
key only some answers have (a model not reconciled yet, a connector's offsets, the anonymous /healthz)
is ``NotRequired``: absent stays absent.

WHY ``TypedDict`` rather than ``BaseModel`` (the write answers of ``answers``): the routes build plain
records, and validating a list of thousands of them into dicts costs less than into model instances;
validate + dump of ``GET /v1/replicas`` at 3,000 replicas takes less than the ``json.dumps`` it replaces,
model instances took a fifth more.  (pydantic reads ``TypedDict`` from ``typing_extensions`` on 3.11.)
"""

from __future__ import annotations

from typing import Any, NotRequired

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

Number = int | float


# ---------------------------------------------------------------------------------- replicas and models


class ReplicaRow(TypedDict):
    """One desired replica (``GET /v1/replicas``; ``ModelStatus.replicas``)."""

    replica_id: str
    model: str
    version: str
    node: str | None
    gpu_indices: list[int]
    gpu_memory_mb: int
    state: str
    reason: str | None
    restarts: int
    actual_version: str | None
    process: str | None
    other_version: str | None
    #: nodes the replica is kept off after it failed there: ``{node, until_ms, reason}``
    cooldowns: list[dict[str, Any]]


class ReplicaList(TypedDict):
    replicas: list[ReplicaRow]
    #: with ``?limit=``: the last replica id of this page (``after`` of the next), None when there is no more
    next: NotRequired[str | None]
    #: with ``?limit=``: how many replicas match the filters, all pages together
    total: NotRequired[int]


class EventRow(TypedDict):
    """One event; an event said more than once is one row (``count``, ``first_ts_ms``)."""

    ts_ms: int
    first_ts_ms: int
    kind: str
    model: str | None
    replica_id: str | None
    node: str | None
    detail: str
    count: int


class EventList(TypedDict):
    events: list[EventRow]


class SpecSummary(TypedDict):
    """What a model's answer shows of its applied spec."""

    version: str
    priority_level: str
    service_type: str
    backend: str
    resources: dict[str, Any]
    scheduling: dict[str, Any]
    min_replicas: int
    max_replicas: int
    p99_latency_ms: Number | None
    topics: dict[str, Any]
    digest: str
    owner: str | None


class LiveNumbers(TypedDict):
    """From the workers' heartbeats: consumer lag (sum), recent p99 (worst replica), replicas reporting."""

    lag: int | None
    p99_ms: Number | None
    reporting: int


class ModelView(TypedDict):
    """One applied model: its status (desired vs actual), spec summary, live numbers, recent events.  A model
    not reconciled yet (``Pending``) or whose spec is invalid (``Invalid``) has only name, phase and reason of the
    status fields."""

    name: str
    version: NotRequired[str]
    priority_level: NotRequired[str]
    service_type: NotRequired[str]
    phase: str
    reason: str | None
    desired_replicas: NotRequired[int]
    ready_replicas: NotRequired[int]
    replicas: NotRequired[list[ReplicaRow]]
    epoch: NotRequired[int]
    updated_at_ms: NotRequired[int]
    #: the autoscaler's decision; None for a fixed-size model
    autoscale: NotRequired[dict[str, Any] | None]
    #: the replica the traffic director holds for the model; None: none
    director: NotRequired[dict[str, Any] | None]
    spec: NotRequired[SpecSummary]
    live: LiveNumbers
    events: list[EventRow]


class ModelList(TypedDict):
    models: list[ModelView]
    #: with ``?limit=``: the last model name of this page (``after`` of the next), None when there is no more
    next: NotRequired[str | None]
    #: with ``?limit=``: how many models match the filters, all pages together
    total: NotRequired[int]


# ---------------------------------------------------------------------------------- nodes


class GpuRow(TypedDict):
    index: int
    product: str
    memory_total_mb: int
    memory_used_mb: int
    utilization_pct: Number
    healthy: bool
    simulated: bool


class NodeRow(TypedDict):
    """A registered node (``NodeView.to_json``)."""

    name: str
    status: str  # online, offline
    tier: str | None
    cpu: Number
    memory_mb: int
    memory_available_mb: int | None
    shared_process_slots: int
    simulated: bool
    labels: dict[str, str]
    last_heartbeat_ms: int | None
    gpus: list[GpuRow]


class NodeList(TypedDict):
    nodes: list[NodeRow]
    #: with ``?limit=``: the last node name of this page (``after`` of the next), None when there is no more
    next: NotRequired[str | None]
    #: with ``?limit=``: how many nodes match the filters, all pages together
    total: NotRequired[int]


# ---------------------------------------------------------------------------------- rollouts


#: one transition of a rollout (functional syntax: ``from`` is a keyword)
RolloutTransition = TypedDict(
    "RolloutTransition", {"at_ms": int, "from": str, "to": str, "step": int, "weight_bp": int, "reason": str}
)


class RolloutView(TypedDict):
    """One model's rollout (``rollout.service.describe``)."""

    model: str
    stable_version: str
    canary_version: str
    phase: str
    label: str
    step: int
    steps: list[int]
    weight_percent: Number
    epoch: int
    started_ms: int
    phase_since_ms: int
    reason: str | None
    events: list[RolloutTransition]


class RolloutList(TypedDict):
    rollouts: list[RolloutView]


# ---------------------------------------------------------------------------------- cluster


class Health(TypedDict):
    """``/healthz``.  An anonymous caller (the path listed in ``SIE_API_PUBLIC_PATHS``) sees only ``status``,
    ``role`` and ``state_caught_up``."""

    ok: NotRequired[bool]
    status: str  # ok, starting, degraded
    reasons: NotRequired[list[str]]
    #: per subsystem (state_feeder, leader_elector, reconcile_loop, liveness_guard, backlog_sampler, http):
    #: ``ok``, ``detail`` and what the subsystem reports
    subsystems: NotRequired[dict[str, dict[str, Any]]]
    instance: NotRequired[str]
    role: str  # leader, standby
    epoch: NotRequired[int | None]
    leader_instance: NotRequired[str | None]
    state_caught_up: bool
    last_reconcile_ms: NotRequired[int | None]
    reconcile_errors: NotRequired[dict[str, str]]
    feeder_errors: NotRequired[int]
    feeder_last_error: NotRequired[str | None]
    election_error: NotRequired[str | None]
    rollouts_error: NotRequired[str | None]
    takeover: NotRequired[dict[str, Any]]


class TargetGroup(TypedDict):
    """A Prometheus ``http_sd`` target group."""

    targets: list[str]
    labels: dict[str, str]


# ---------------------------------------------------------------------------------- artifacts, connectors


class ArtifactManifest(TypedDict):
    """Where an uploaded artifact's chunks are (``GET /v1/artifacts/sha256:<hex>``)."""

    sha256: str
    name: str
    size: int
    chunk_size: int
    chunks: int
    chunk_partition: int
    first_offset: int
    last_offset: int
    created_ms: int
    ref: str


class ArtifactUploaded(ArtifactManifest):
    """``PUT /v1/artifacts/sha256:<hex>``: 201 stored, 200 already on the cluster (``created`` false)."""

    created: bool


class ConnectorReplica(TypedDict):
    replica_id: str
    node: str | None
    state: str
    reason: str | None
    restarts: int


class PartitionOffsets(TypedDict):
    partition: int
    committed: int | None
    end: int
    lag: int


class ConnectorOffsets(TypedDict):
    """Per source partition: committed offset, end, lag; ``error`` when Kafka did not answer."""

    group: str
    source_topic: str
    partitions: list[PartitionOffsets]
    lag: int | None
    error: NotRequired[str]


class ConnectorView(TypedDict):
    """An applied connector: its spec, its replica, phase and reason; ``offsets`` in ``GET /v1/connectors/{name}``."""

    name: str
    paused: bool
    applied_at_ms: int
    spec: dict[str, Any]
    replicas: list[ConnectorReplica]
    phase: str
    reason: str | None
    offsets: NotRequired[ConnectorOffsets]


@with_config(ConfigDict(extra="forbid"))  # a connector's full status is not an InvalidConnector with extra keys
class InvalidConnector(TypedDict):
    """A connector whose record did not decode (phase ``Invalid``, the reason why)."""

    name: str
    phase: str
    reason: str
    replicas: list[ConnectorReplica]


class ConnectorList(TypedDict):
    connectors: list[ConnectorView | InvalidConnector]
