"""The normalised ModelService: one frozen shape for both accepted document styles.

Readers of a spec (control plane, agent, scorer, CLI) only ever see these
classes; the two YAML styles (flat article model-spec, Kubernetes-style
``kind: ModelService``) are reduced to them by ``sie.schemas.spec.load``.  The
models check only invariants that must hold wherever a spec is read back
(e.g. from the ``specs`` topic on another machine); checks that depend on the
machine that wrote the spec (artifact file exists) live in the parser.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

FieldType = Literal["string", "int", "float", "bool"]
UnknownFieldPolicy = Literal["reject", "ignore", "allow"]
BackendType = Literal["torch", "python", "sglang"]
TorchFormat = Literal["torchscript", "export", "safetensors"]
PriorityLevel = Literal["P0", "P1", "P2"]

BACKEND_TYPES: tuple[str, ...] = ("torch", "python", "sglang")
#: backends whose replicas may share a multi-model worker process (issue 16); sglang stays one server a replica
SHARED_PROCESS_BACKENDS: frozenset[str] = frozenset({"torch", "python"})


def may_share_process(priority: str, backend: str, gpus: int) -> bool:
    """THE rule for which replicas may run in a shared multi-model worker process (placement's memory count
    and the agent's launch both ask it): P1/P2 only (a P0 model gets a process of its own: a neighbour's hang
    or crash must not reach the low-latency tier), only backends that can share (torch, python; an sglang
    replica is a server of its own) and only models that take no whole GPU (a whole-GPU model is not small)."""
    return priority != "P0" and backend in SHARED_PROCESS_BACKENDS and gpus == 0
FIELD_TYPES: tuple[str, ...] = ("string", "int", "float", "bool")
PRIORITY_LEVELS: tuple[str, ...] = ("P0", "P1", "P2")
SERVICE_TYPES_KNOWN: tuple[str, ...] = ("scoring", "ner", "classification", "embedding", "generation")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FieldSpec(_Frozen):
    """One field of a request's ``inputs`` or of a result's ``outputs``."""

    name: str
    type: FieldType
    required: bool = True
    nullable: bool = False
    max_length: int | None = Field(None, ge=1)
    range: tuple[float, float] | None = None
    description: str | None = None


class IOSchema(_Frozen):
    """Ordered fields (the torch backend maps inputs to tensor columns in this order).

    ``unknown_fields``: ``reject`` = a field not declared is a schema violation;
    ``ignore`` = dropped from the validated dict; ``allow`` = passed through
    unvalidated (used when a spec declares no schema at all).
    """

    fields: tuple[FieldSpec, ...] = ()
    unknown_fields: UnknownFieldPolicy = "reject"

    def field(self, name: str) -> FieldSpec | None:
        for f in self.fields:
            if f.name == name:
                return f
        return None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)


SHA256_RE = r"^[0-9a-f]{64}$"


class ArtifactRef(_Frozen):
    """A file a replica needs, named by its content: every node fetches it, checks that its bytes hash to
    ``sha256`` and refuses it otherwise.

    ``uri`` None: on the cluster's artifacts topic (``sie apply`` uploads it there); else a ``file://``,
    ``http(s)://`` or object-store URI (fsspec) under ``SIE_ARTIFACT_SOURCES``.  ``name`` is the file name
    the node gives its copy (the suffix tells the torch format; ``.pt2`` archives are still inspected).
    """

    sha256: str = Field(pattern=SHA256_RE)
    name: str = Field("artifact", pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,199}$")
    size: int | None = Field(None, ge=0)
    uri: str | None = Field(None, max_length=4096)

    @property
    def label(self) -> str:
        """``sha256:ab12cd34ef56 (fraud.safetensors)`` for messages."""
        return f"sha256:{self.sha256[:12]} ({self.name})"


class BackendSpec(_Frozen):
    """How a replica runs the model.

    ``artifact`` is the file the backend loads on THIS node; ``artifact_ref`` says where it comes from on
    every other one (the agent fetches and verifies it and hands its worker a spec whose ``artifact`` is the
    cached copy).  ``modules`` is an archive of the spec's own Python package (what ``moduleClass`` or
    ``callable`` names, found next to the spec file by ``sie apply``); ``modules_path`` the verified copy a
    worker imports it from, and only from (set by the agent).
    """

    type: BackendType
    artifact: Path | None = None
    artifact_ref: ArtifactRef | None = None
    modules: ArtifactRef | None = None
    modules_path: Path | None = None
    format: TorchFormat | None = None
    module_class: str | None = None
    module_kwargs: dict[str, Any] = Field(default_factory=dict)
    callable: str | None = None
    model_path: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    device: str = "auto"


class Resources(_Frozen):
    """What one replica needs.

    ``gpu_memory_mb`` is the memory the replica needs on each GPU it uses
    (0 = CPU-only).  ``gpus`` = whole GPUs reserved (0 = share a GPU by memory).
    ``memory_mb`` = host memory (0 = not declared).
    """

    gpu_memory_mb: int = Field(0, ge=0)
    gpus: int = Field(0, ge=0)
    cpu: float = Field(1.0, ge=0)
    memory_mb: int = Field(0, ge=0)


class Scheduling(_Frozen):
    node_selector: dict[str, str] = Field(default_factory=dict)
    tier: str | None = None


class Sla(_Frozen):
    p99_latency_ms: float | None = Field(None, gt=0)
    max_queue_time_ms: float | None = Field(None, gt=0)
    min_qps: float | None = Field(None, ge=0)
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _replicas_ordered(self) -> Sla:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}")
        return self


class SpecTopics(_Frozen):
    """The data-path topics of a model (resolved: defaults or the spec's overrides)."""

    requests: str
    results: str
    dead_letters: str
    backfill: str

    @property
    def backfill_results(self) -> str:
        """Same name as ``sie.kernel.topics.ModelTopics`` uses."""
        return self.backfill


class KafkaInput(_Frozen):
    """The article's ``kafka_input`` block, kept as written (SIE's own cluster settings win)."""

    bootstrap_servers: str | None = None
    topic: str | None = None
    group_id: str | None = None
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    value_deserializer: Literal["json"] = "json"


class ModelService(_Frozen):
    """A model the cluster should serve; normalised, frozen, JSON round-trippable."""

    name: str
    version: str
    priority_level: PriorityLevel = "P1"
    service_type: str = "scoring"
    backend: BackendSpec
    resources: Resources = Field(default_factory=Resources)
    scheduling: Scheduling = Field(default_factory=Scheduling)
    input_schema: IOSchema = Field(default_factory=IOSchema)
    output_schema: IOSchema = Field(default_factory=IOSchema)
    sla: Sla = Field(default_factory=Sla)
    max_concurrent_requests: int | None = Field(None, ge=1)
    topics: SpecTopics
    group_id: str
    kafka_input: KafkaInput | None = None
    example_input: dict[str, Any] | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    #: the ``rollout`` block as written (validated at parse time: ``sie.schemas.rollout_policy``); None = defaults
    rollout: dict[str, Any] | None = None
    description: str | None = None
    #: who manages this model when not a person: ``ModelService <namespace>/<name> <uid>`` when the Kubernetes
    #: operator applied it (annotation ``sie.lmsys.org/owner``); None for ``sie apply`` and the API.  The operator
    #: overwrites or deletes only a model carrying its own mark (``sie.k8s.operator``); the API refuses a marked
    #: apply over another owner's model.  Left out of the document when None (specs from before are unchanged).
    owner: str | None = Field(None, max_length=400)
    source: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def model_id(self) -> str:
        return f"{self.name}:{self.version}"

    def to_document(self) -> dict[str, Any]:
        """JSON-able normalised form (what ``sie apply`` publishes on the specs topic)."""
        doc = self.model_dump(mode="json")
        if doc.get("owner") is None:
            doc.pop("owner", None)
        return doc

    def digest(self) -> str:
        """sha256 of the normalised spec, without where it was read from and its warnings: equal digests, equal
        specs.  The control API shows it (``GET /v1/models/{name}``: ``spec.digest``) so a client that holds a
        desired spec (the Kubernetes operator) publishes only what differs: re-publishing an unchanged spec is
        not a no-op (it ends cool-downs)."""
        import hashlib
        import json

        doc = {k: v for k, v in self.to_document().items() if k not in ("source", "warnings")}
        return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> ModelService:
        """Inverse of ``to_document`` (no file-system checks: the reader may be another machine)."""
        return cls.model_validate(doc)
