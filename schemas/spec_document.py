"""The ModelService DOCUMENT as a user writes it: every section, every key in both spellings, declared once.

``sie.schemas.spec_models`` is the normalised spec the rest of SIE reads; this module is the shape of the
YAML that becomes it, in both styles the article writes (Kubernetes ``kind: ModelService`` and the flat
model-spec).  The CRD's ``openAPIV3Schema`` is derived from these models (``sie.k8s.crd``)::

    document --(flat? reshape into the Kubernetes layout)--> ModelServiceDocument
        every section: extra="forbid" (a typo never drops a constraint), strict types,
                       both spellings (AliasChoices, camelCase or snake_case as the article writes it),
                       warn-and-keep keys (image, tolerations, probes, limits) declared as fields
        CRD: model_json_schema() + the CEL rules each section declares (``cel`` in its json_schema_extra)

``key: null`` means "not given" for a key with a default, an empty section for a section, and is refused for a
required value or a choice (``_Section._null_is_absent``).  ``document_problems`` words pydantic's errors as
``<field path as written>: <reason> (got <value>)``; the rules the shape cannot state are
``sie.schemas.spec_rules``'s.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal, get_origin

from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    model_validator,
)

API_VERSION: Final = "sie.lmsys.org/v1"
KIND: Final = "ModelService"
#: the annotation that marks a spec as applied by the Kubernetes operator for one ModelService (``ModelService.owner``)
OWNER_ANNOTATION = "sie.lmsys.org/owner"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,199}$")
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
CALLABLE_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
FIELD_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
SERVICE_TYPE_RE = re.compile(r"^[a-z][a-z0-9_-]*$")
QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?([eE][0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|K|M|G|T|P|E|m)?$")
TYPE_ALIASES = {
    "string": "string", "str": "string", "text": "string",
    "int": "int", "integer": "int", "int32": "int", "int64": "int", "long": "int",
    "float": "float", "float32": "float", "float64": "float", "double": "float", "number": "float",
    "bool": "bool", "boolean": "bool",
}
#: a list in a spec is bounded so every CEL rule's cost is bounded (the API server refuses unbounded rules)
MAX_FIELDS = 1000
MAX_LIST = 100

_ANY: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}
#: an untyped value: a mapping of anything (config, kwargs, example input) or a value of several shapes
AnyMapping = Annotated[dict[str, Any], WithJsonSchema({"type": "object", **_ANY})]
#: a Kubernetes quantity (2, "500m", "32Gi"): its text is read by the reader (``spec_rules.parse_quantity``)
Quantity = Annotated[Any, WithJsonSchema({
    "x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}],
    "pattern": QUANTITY_RE.pattern})]
_PROBE_TEXT = ("Accepted as the article writes it and not run (warning): SIE's readiness is a real inference on "
               "exampleInput and the agent watches the process.")
#: a key SIE accepts as written and does not act on (a warning names it): any value is kept, the CRD says its shape
Probe = Annotated[Any, WithJsonSchema({"description": _PROBE_TEXT, "type": "object", **_ANY})]
Sha256 = Annotated[str, Field(pattern="^[0-9a-fA-F]{64}$")]


def _scalars_as_text(value: Any) -> Any:
    """Labels and node selectors: a YAML scalar is its text (``true`` is "true", ``3`` is "3")."""
    if not isinstance(value, dict):
        return value
    return {k: (str(v).lower() if isinstance(v, bool) else str(v)) if isinstance(v, (str, int, float)) else v
            for k, v in value.items()}


#: a mapping of names to text (labels, nodeSelector); YAML scalars are read as their text
TextMap = Annotated[dict[str, str], BeforeValidator(_scalars_as_text)]
#: free text (a description): whatever YAML read, as text
Text = Annotated[str, BeforeValidator(lambda v: v if isinstance(v, str) or v is None else str(v))]


def spelled(*spellings: str, **kwargs: Any) -> Any:
    """A key the document may spell several ways (the first is the one the CRD's CEL rules name first)."""
    return Field(validation_alias=AliasChoices(*spellings), **kwargs)


def cel(*rules: dict[str, str]) -> dict[str, Any]:
    """A section's CEL rules (the CRD's ``x-kubernetes-validations``, besides the both-spellings rules)."""
    return {"cel": list(rules)}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        """``key: null`` is "not given" for a key with a default, an empty section for a section, and refused
        (naming the key) for a required value."""
        if not isinstance(data, dict):
            return data
        out = {}
        for key, value in data.items():
            name = next((n for n in cls.model_fields if key in spellings_of(cls, n)), None)
            info = cls.model_fields[name] if name is not None else None
            if value is None and info is not None and not _is_nullable(info.annotation):
                if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
                    value = {}
                elif not info.is_required() and get_origin(info.annotation) is not Literal:
                    continue  # (a choice given as null is refused, naming the choices)
            out[key] = value
        return out


def _is_nullable(annotation: Any) -> bool:
    return type(None) in getattr(annotation, "__args__", ())


def spellings_of(model: type[BaseModel], name: str) -> tuple[str, ...]:
    """Every spelling of field ``name`` in the document, the first as declared first."""
    alias = model.model_fields[name].validation_alias
    if isinstance(alias, AliasChoices):
        return tuple(str(c) for c in alias.choices)
    return (alias,) if isinstance(alias, str) else (name,)


class BackendDocument(_Section):
    model_config = ConfigDict(json_schema_extra=cel(
        {"rule": "self.type != 'python' || has(self.callable)", "fieldPath": ".callable",
         "message": "required for the python backend ('package.module:function')"},
        {"rule": "self.type == 'sglang' || !has(self.modelPath)", "fieldPath": ".modelPath",
         "message": "only the sglang backend takes a modelPath"},
    ))

    type: Literal["torch", "python", "sglang"]
    #: a path, a URI or a ref: which one, and whether it is sound, is the reader's (spec_rules) to say
    artifact: Annotated[Any, WithJsonSchema({
        "description": "torch: a path (sie apply -f uploads it), a URI with sha256, or {sha256, name, size, uri}.",
        **_ANY})] | None = None
    modules: Annotated[Any, WithJsonSchema({
        "description": "torch/python: {sha256, name, size, uri} of the spec's own package (sie apply builds it).",
        **_ANY})] | None = None
    format: Literal["torchscript", "export", "safetensors"] | None = None
    module_class: str = spelled("moduleClass", "module_class", default="", pattern=CALLABLE_RE.pattern)
    module_kwargs: AnyMapping = spelled("moduleKwargs", "module_kwargs", default_factory=dict)
    callable: str = Field("", pattern=CALLABLE_RE.pattern)
    model_path: str | None = spelled("modelPath", "model_path", default=None)
    config: AnyMapping = Field(default_factory=dict)
    device: str = Field("auto", pattern=DEVICE_RE.pattern)
    #: the digest of an artifact given as a URI (or a path, checked against the file)
    sha256: Sha256 = spelled("sha256", "artifactSha256", "artifact_sha256", default="")


class ResourcesDocument(_Section):
    gpu_memory_mb: int = spelled("gpuMemoryMb", "gpu_memory_mb", default=0, ge=0)
    gpus: int = Field(0, ge=0)
    cpu: float = Field(1.0, ge=0)
    memory_mb: int = spelled("memoryMb", "memory_mb", default=0, ge=0)
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        description="Kubernetes style: nvidia.com/gpu, memory, cpu are scheduled; others: warning.")
    requests: dict[str, Quantity] = Field(default_factory=dict, description="Read when there are no limits.")


class SchedulingDocument(_Section):
    node_selector: TextMap = spelled("nodeSelector", "node_selector", default_factory=dict)
    tier: str | None = None
    tolerations: Annotated[Any, WithJsonSchema({
        "type": "array", "maxItems": MAX_LIST, "items": {"type": "object", **_ANY},
        "description": "Accepted (warning): SIE places by nodeSelector and tier only."})] = None


def _replicas_rule() -> dict[str, str]:
    def get(spellings: tuple[str, ...], default: str) -> str:
        expr = default
        for spelling in reversed(spellings):
            expr = f"(has(self.{spelling}) ? self.{spelling} : {expr})"
        return expr

    lo, hi = ("min_replicas", "minReplicas"), ("max_replicas", "maxReplicas")
    # the reader defaults max to max(min, 1) when absent: only a given max can be below min
    given = " || ".join(f"has(self.{s})" for s in hi)
    return {"rule": f"!({given}) || {get(lo, '1')} <= {get(hi, '1')}",
            "fieldPath": ".min_replicas", "message": "min_replicas must be <= max_replicas"}


class SlaDocument(_Section):
    model_config = ConfigDict(json_schema_extra=cel(_replicas_rule()))

    p99_latency_ms: float | None = spelled("p99_latency_ms", "p99LatencyMs", default=None, gt=0)
    max_queue_time_ms: float | None = spelled("max_queue_time_ms", "maxQueueTimeMs", default=None, gt=0)
    min_qps: float | None = spelled("min_qps", "minQps", default=None, ge=0)
    min_replicas: int = spelled("min_replicas", "minReplicas", default=1, ge=0)
    max_replicas: int = spelled("max_replicas", "maxReplicas", default=1, ge=1)


class FieldDocument(_Section):
    model_config = ConfigDict(json_schema_extra=cel(
        {"rule": "!has(self.range) || self.range[0] <= self.range[1]", "fieldPath": ".range",
         "message": "must be [min, max] with min <= max"}))

    name: str = Field(pattern=FIELD_NAME_RE.pattern)
    type: Annotated[Literal[tuple(sorted(TYPE_ALIASES))],  # type: ignore[valid-type]
                    BeforeValidator(lambda v: v.lower() if isinstance(v, str) else v)] = Field(
        description="string, int, float, bool (or an alias)")
    required: bool = True
    nullable: bool = False
    max_length: int | None = spelled("max_length", "maxLength", default=None, ge=1)
    range: list[float] | None = Field(None, min_length=2, max_length=2)
    description: Text | None = None


class IOSchemaDocument(_Section):
    fields: list[FieldDocument] = Field(
        default_factory=list, max_length=MAX_FIELDS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    unknown_fields: Literal["reject", "ignore", "allow"] = spelled("unknown_fields", "unknownFields", default="reject")
    type: Literal["json"] = "json"


class TopicsDocument(_Section):
    requests: str = ""
    results: str = ""
    dead_letters: str = spelled("deadLetters", "dead_letters", default="")
    backfill: str = ""


class KafkaInputDocument(_Section):
    bootstrap_servers: str | None = spelled("bootstrap_servers", "bootstrapServers", default=None)
    topic: str | None = None
    group_id: str | None = spelled("group_id", "groupId", default=None)
    auto_offset_reset: Literal["earliest", "latest"] = spelled(
        "auto_offset_reset", "autoOffsetReset", default="earliest")
    value_deserializer: Literal["json"] = spelled("value_deserializer", "valueDeserializer", default="json")
    #: the article sets it; SIE commits inside its transaction (a warning when true)
    enable_auto_commit: Annotated[Any, WithJsonSchema({"type": "boolean"})] = spelled(
        "enable_auto_commit", "enableAutoCommit", default=False)


class RolloutGatesDocument(_Section):
    """``sie.schemas.rollout_policy`` reads and checks it; this is its shape for the CRD."""

    p99MaxMs: float | None = Field(None, ge=0)  # noqa: N815 - the document's spelling
    p99MaxRatio: float | None = Field(None, ge=0)  # noqa: N815
    p99SlackMs: float | None = None  # noqa: N815
    maxErrorRateIncrease: float | None = Field(None, ge=0)  # noqa: N815
    maxExpiryRateIncrease: float | None = Field(None, ge=0)  # noqa: N815
    minSamples: int = Field(20, ge=1)  # noqa: N815
    confidence: float = Field(0.95, ge=0.5, lt=1)
    inconclusiveIntervals: int = Field(0, ge=0)  # noqa: N815


class RolloutDocument(_Section):
    steps: list[Annotated[int, Field(ge=1, le=100)]] = Field(
        default_factory=list, max_length=MAX_LIST,
        description="Percent of requests on the new version per step: strictly rising, ending at 100.",
        json_schema_extra={"x-kubernetes-list-type": "set", "x-kubernetes-validations": [
            {"rule": "self.isSorted()", "message": "must be strictly rising percentages"},
            {"rule": "size(self) == 0 || self[size(self) - 1] == 100", "message": "the last step must be 100"},
        ]})
    intervalSeconds: float = Field(60, gt=0)  # noqa: N815
    surgeTimeoutSeconds: float = Field(600, gt=0)  # noqa: N815
    gates: RolloutGatesDocument = Field(default_factory=RolloutGatesDocument)


class ModelIdentityDocument(_Section):
    name: str = Field("", pattern=NAME_RE.pattern, description=(
        "The model name (names its Kafka topics); defaults to metadata.name, must equal it if given."))
    version: str = Field(pattern=VERSION_RE.pattern, description="The version (a string: quote 1.1).")
    image: Annotated[Any, WithJsonSchema({"type": "string", "description": "Accepted, not pulled (warning): the agent "
                                          "runs the backend from the artifact/model path."})] = None

    @model_validator(mode="before")
    @classmethod
    def _integer_version(cls, data: Any) -> Any:
        """``version: 7`` is the version "7" (a float such as 1.10 is not: YAML lost its digits)."""
        if isinstance(data, dict) and type(data.get("version")) is int:
            return {**data, "version": str(data["version"])}
        return data


class SpecDocument(_Section):
    """``spec`` of a Kubernetes-style document; the flat style's keys, reshaped (``ModelServiceDocument``)."""

    model_config = ConfigDict(json_schema_extra={"description": "The model SIE should serve: docs/contracts.md "
                                                                "lists every field."})

    priority_level: Literal["P0", "P1", "P2"] = spelled("priorityLevel", "priority_level", default="P1")
    service_type: str = spelled("serviceType", "service_type", default="scoring", pattern=SERVICE_TYPE_RE.pattern)
    backend: BackendDocument
    resources: ResourcesDocument = Field(default_factory=ResourcesDocument)
    scheduling: SchedulingDocument = Field(default_factory=SchedulingDocument)
    input_schema: IOSchemaDocument | None = spelled("inputSchema", "input_schema", default=None)
    output_schema: IOSchemaDocument | None = spelled("outputSchema", "output_schema", default=None)
    sla: SlaDocument = spelled("sla", "slas", default_factory=SlaDocument)
    max_concurrent_requests: int | None = spelled("maxConcurrentRequests", "max_concurrent_requests",
                                                  default=None, ge=1)
    topics: TopicsDocument = Field(default_factory=TopicsDocument)
    kafka_input: KafkaInputDocument | None = spelled("kafka_input", "kafkaInput", default=None)
    example_input: AnyMapping | None = spelled("exampleInput", "example_input", default=None)
    labels: TextMap = Field(default_factory=dict)
    rollout: RolloutDocument | None = Field(None, description="Canary steps, time per step, SLO gates: "
                                                              "docs/rollouts.md.")
    description: Text | None = None
    model: ModelIdentityDocument
    livenessProbe: Probe | None = None  # noqa: N815 - Kubernetes' spelling, accepted with a warning
    readinessProbe: Probe | None = None  # noqa: N815
    startupProbe: Probe | None = None  # noqa: N815


class MetadataDocument(_Section):
    """What SIE reads of ``metadata`` (the operator hands over only these)."""

    name: str | None = None
    namespace: Any = None
    labels: TextMap = Field(default_factory=dict)
    annotations: Any = None


#: keys of the flat article style that name the model rather than belong to ``spec``
_FLAT_MODEL_KEYS = ("name", "version", "image")


class ModelServiceDocument(_Section):
    api_version: Literal["sie.lmsys.org/v1"] = spelled("apiVersion", default=API_VERSION)
    kind: Literal["ModelService"] = KIND
    metadata: MetadataDocument = Field(default_factory=MetadataDocument)
    spec: SpecDocument

    @model_validator(mode="before")
    @classmethod
    def _flat_to_kubernetes(cls, data: Any) -> Any:
        """The flat article style (no apiVersion/kind): name/version/image become ``spec.model``, a bare
        ``backend: sglang`` a mapping, ``min_gpu_memory_mb`` ``resources.gpuMemoryMb``, the rest ``spec``."""
        if not isinstance(data, dict) or "apiVersion" in data or "kind" in data:
            return data
        spec = {k: v for k, v in data.items() if k not in _FLAT_MODEL_KEYS}
        spec["model"] = {k: data[k] for k in _FLAT_MODEL_KEYS if k in data}
        if isinstance(spec.get("backend"), str):
            spec["backend"] = {"type": spec["backend"]}
        for key in ("min_gpu_memory_mb", "minGpuMemoryMb"):
            resources = spec.get("resources")
            if key in spec:
                memory = spec.pop(key)
                if resources is None or isinstance(resources, dict):  # (else resources is the problem named)
                    spec["resources"] = {"gpuMemoryMb": memory, **(resources or {})}
        return {"spec": spec}


# ---------------------------------------------------------------- problems, as the reader words them

#: why a value was refused, by pydantic error type (``{...}`` from the error's context)
_REASONS = {
    "int_type": "must be an integer", "int_from_float": "must be an integer",
    "float_type": "must be a finite number", "finite_number": "must be a finite number",
    "bool_type": "must be true or false", "string_type": "must be a non-empty string",
    "dict_type": "must be a mapping", "model_type": "must be a mapping", "model_attributes_type": "must be a mapping",
    "list_type": "must be a list", "greater_than_equal": "must be >= {ge}", "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}", "less_than": "must be < {lt}", "too_long": "at most {max_length} items",
    "too_short": "at least {min_length} items",
}
#: a refusal worded for one field, by (field, pydantic error type); the reader's words where they exist
_FIELD_REASONS = {
    ("BackendDocument.type", "missing"): "required; one of torch, python, sglang",
    ("BackendDocument.type", "literal_error"): "unknown backend type; valid: torch, python, sglang",
    ("SpecDocument.backend", "missing"): "required (type: one of torch, python, sglang)",
    ("SpecDocument.priority_level", "literal_error"): "must be one of P0, P1, P2",
    ("SpecDocument.service_type", "string_pattern_mismatch"):
        "must be lowercase letters, digits, _ or - (a metrics label)",
    ("ModelIdentityDocument.version", "missing"): "required (e.g. 1.2.0)",
    ("ModelIdentityDocument.name", "string_pattern_mismatch"):
        "must be lowercase [a-z0-9._-], start with a letter or digit, at most 200 characters (it names Kafka topics)",
    ("ModelIdentityDocument.version", "string_pattern_mismatch"): "must be [A-Za-z0-9._+-], at most 64 characters",
    ("FieldDocument.name", "missing"): "required",
    ("FieldDocument.name", "string_pattern_mismatch"): "must be a field name (letters, digits, _ . -)",
    ("FieldDocument.type", "missing"): "required; one of string, int, float, bool",
    ("FieldDocument.type", "literal_error"):
        "unknown field type; valid: string, int, float, bool (aliases: "
        + ", ".join(sorted(set(TYPE_ALIASES) - {"string", "int", "float", "bool"})) + ")",
    ("IOSchemaDocument.unknown_fields", "literal_error"): "must be reject, ignore or allow",
    ("IOSchemaDocument.type", "literal_error"): "only 'json' is supported",
    ("KafkaInputDocument.auto_offset_reset", "literal_error"): "must be earliest or latest",
    ("KafkaInputDocument.value_deserializer", "literal_error"): "only json is supported (requests are JSON objects)",
    ("BackendDocument.device", "string_pattern_mismatch"): "must be auto, cpu, cuda or cuda:N",
    ("BackendDocument.module_class", "string_pattern_mismatch"): "must be 'package.module:Class'",
    ("BackendDocument.callable", "string_pattern_mismatch"): "must be 'package.module:function'",
    ("BackendDocument.format", "literal_error"): "must be torchscript, export or safetensors",
    ("ModelServiceDocument.api_version", "literal_error"): f"must be {API_VERSION}",
    ("ModelServiceDocument.kind", "literal_error"): f"unknown kind; expected {KIND}",
    ("IOSchemaDocument.fields", "list_type"): "must be a list of fields",
    ("BackendDocument.device", "string_type"): "must be auto, cpu, cuda or cuda:N",
    ("BackendDocument.module_class", "string_type"): "must be 'package.module:Class'",
    ("BackendDocument.callable", "string_type"): "must be 'package.module:function'",
    ("BackendDocument.sha256", "string_pattern_mismatch"): "must be 64 hex digits (sha256sum FILE)",
    ("BackendDocument.sha256", "string_type"): "must be 64 hex digits (sha256sum FILE)",
    ("SpecDocument.example_input", "dict_type"): "must be a mapping of input fields",
    ("SpecDocument.labels", "dict_type"): "must be a mapping of strings",
    ("SpecDocument.labels", "string_type"): "must be a string",
    ("MetadataDocument.labels", "dict_type"): "must be a mapping of strings",
    ("MetadataDocument.labels", "string_type"): "must be a string",
    ("SchedulingDocument.node_selector", "dict_type"): "must be a mapping of strings",
    ("SchedulingDocument.node_selector", "string_type"): "must be a string",
}
#: fields whose every problem is one problem of the whole value, worded so
_WHOLE_VALUE = {"FieldDocument.range": "must be [min, max] with two finite numbers",
                "FieldDocument.name": "must be a field name (letters, digits, _ . -)"}
#: problems the reader words itself (``sie.schemas.spec_rules``: the name may come from metadata.name)
_WORDED_BY_THE_READER = {("SpecDocument.model", "missing"), ("ModelIdentityDocument.name", "string_type"),
                         ("ModelIdentityDocument.version", "string_type"), ("MetadataDocument.name", "string_type"),
                         ("ModelIdentityDocument.name", "string_pattern_mismatch"),
                         ("ModelIdentityDocument.version", "string_pattern_mismatch")}
#: keys the flat article style takes besides ``spec``'s (``ModelServiceDocument._flat_to_kubernetes``)
_FLAT_ONLY_KEYS = (*_FLAT_MODEL_KEYS, "min_gpu_memory_mb", "minGpuMemoryMb")


def _got(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _unwrap(annotation: Any) -> Any:
    """The section model inside ``X | None``, ``list[X]``, ``Annotated[X, ...]`` (else None)."""
    while True:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return annotation
        args = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]
        if getattr(annotation, "__metadata__", None) is not None:
            annotation = annotation.__origin__
        elif len(args) == 1 or (args and getattr(annotation, "__origin__", None) is list):
            annotation = args[0]
        else:
            return None


def _field_named(model: type[BaseModel], key: str) -> str | None:
    for name in model.model_fields:
        if key in spellings_of(model, name):
            return name
    return None


def _walk(loc: tuple[Any, ...]) -> list[tuple[type[BaseModel], str | None]]:
    """(section model, field name) for each step of an error location (None once the models end)."""
    model: Any = ModelServiceDocument
    steps: list[tuple[type[BaseModel], str | None]] = []
    for key in loc:
        if model is None:
            break
        if isinstance(key, int):
            continue
        name = _field_named(model, str(key))
        steps.append((model, name))
        model = _unwrap(model.model_fields[name].annotation) if name is not None else None
    return steps


def _written_path(doc: dict[str, Any], loc: tuple[Any, ...]) -> str:
    """Where the document wrote what ``loc`` (a location in the Kubernetes layout) names."""
    parts = list(loc)
    if parts and parts[0] == "spec" and "apiVersion" not in doc and "kind" not in doc:  # the flat style
        parts = parts[1:]
        if parts[:1] == ["model"]:
            parts = parts[1:]
        elif parts[:2] == ["resources", "gpuMemoryMb"]:
            flat = [k for k in ("min_gpu_memory_mb", "minGpuMemoryMb") if k in doc]
            resources = doc.get("resources")
            if flat and not (isinstance(resources, dict) and "gpuMemoryMb" in resources):
                parts = [flat[0]]
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "document"


def _section_data(doc: dict[str, Any], loc: tuple[Any, ...]) -> Any:
    data: Any = ModelServiceDocument._flat_to_kubernetes(doc)  # type: ignore[operator]
    for key in loc:
        try:
            data = data[key]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def document_problems(doc: Any) -> list[str]:
    """Every shape problem of a document (either style), as ``<field path as written>: <reason> (got <value>)``.

    Shape only: types, bounds, patterns, enums, unknown keys and keys given twice.  What needs more than the
    document's shape (an artifact on this machine, the rollout policy, cross-section rules) is the reader's.
    """
    if not isinstance(doc, dict):
        return [f"document: must be a mapping (a ModelService), got {type(doc).__name__}"]
    if ("apiVersion" in doc or "kind" in doc) and doc.get("kind") != KIND:  # another resource: nothing else applies
        return [f"kind: unknown kind; expected {KIND} (got {_got(doc.get('kind'))})"]
    try:
        ModelServiceDocument.model_validate(doc)
    except ValidationError as exc:
        errors = exc.errors()
    else:
        return []
    problems: list[str] = []
    for error in errors:
        loc = tuple(error["loc"])
        steps = _walk(loc)
        model, name = steps[-1] if steps else (ModelServiceDocument, None)
        kind = error["type"]
        if (f"{model.__name__}.{name}", kind) in _WORDED_BY_THE_READER:
            continue
        whole = _WHOLE_VALUE.get(f"{model.__name__}.{name}")
        if whole is not None and kind != "missing":
            loc = loc[:max(i for i, k in enumerate(loc) if isinstance(k, str)) + 1]  # the field, not an item of it
            line = f"{_written_path(doc, loc)}: {whole} (got {_got(_section_data(doc, loc))})"
            if line not in problems:
                problems.append(line)
            continue
        flat = "apiVersion" not in doc and "kind" not in doc
        if kind == "extra_forbidden":
            section = _section_data(doc, loc[:-1])
            twin = next((s for f in model.model_fields for s in spellings_of(model, f)
                         if loc[-1] in spellings_of(model, f) and s != loc[-1] and isinstance(section, dict)
                         and s in section), None)
            if twin is not None:
                line = f"{_written_path(doc, loc[:-1] + (twin,))}: given twice (also as {loc[-1]!r}); keep one"
            else:
                known = sorted({s for f in model.model_fields for s in spellings_of(model, f)})
                if model is SpecDocument and loc[:1] == ("spec",) and flat:
                    known = sorted({*known, *_FLAT_ONLY_KEYS} - {"model"})
                elif model is ModelServiceDocument:
                    known = ["apiVersion", "kind", "metadata", "spec"]
                line = f"{_written_path(doc, loc)}: unknown key; known keys: {', '.join(known)}"
        else:
            reason = _FIELD_REASONS.get((f"{model.__name__}.{name}", kind)) or _REASONS.get(kind)
            if (model, name, kind) == (SpecDocument, "service_type", "string_pattern_mismatch") and not str(
                    error.get("input")).strip():
                reason = _REASONS["string_type"]
            if (model, name, kind, flat) == (SpecDocument, "backend", "missing", True):
                reason = "required; one of torch, python, sglang (or a mapping with type:)"
            if reason is None:
                reason = "required" if kind == "missing" else str(error["msg"])
            reason = reason.format(**{k: int(v) if isinstance(v, float) and v.is_integer() else v
                                      for k, v in error.get("ctx", {}).items()})
            written = _section_data(doc, loc)  # the value as written (a validator may have changed it)
            got = "" if kind == "missing" else f" (got {_got(error.get('input') if written is None else written)})"
            line = f"{_written_path(doc, loc)}: {reason}{got}"
        if line not in problems:
            problems.append(line)
    return problems
