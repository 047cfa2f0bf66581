"""The ``ModelService`` CustomResourceDefinition, generated from the spec's own pydantic models.

WHY generated: ``sie validate``/``sie apply``, the control plane's ``POST /v1/models`` and the operator read a
ModelService through ONE parser (``sie.schemas.spec_parse``) into ONE normalised pydantic model
(``sie.schemas.spec_models``).  A hand-written CRD schema would drift from both the day someone adds a field.
So the CRD's structural OpenAPI schema is built here from those models, field by field::

    for every document section (spec, spec.sla, spec.backend, ...):
        for every field of its pydantic model:
            spellings  <- SECTIONS table (camelCase first, snake_case too: the parser takes both)
            schema     <- the field's annotation (str/int/float/bool/Literal/dict/tuple) + its constraints
                          (ge/gt -> minimum, pattern, max_length), unless the table overrides it (a document
                          shape the normalised model does not have: an artifact given as a path OR a ref)
        + the document-only keys SIE accepts with a warning (tolerations, probes, image, limits)
        + CEL rules for the cross-field checks that fit (min <= max replicas, rollout steps rising, ...)

and ``python -m sie.k8s.crd --write`` writes it to ``infra/helm/sie/crds/``.  Three things fail when the two
drift (``tests/k8s/test_crd.py``): a pydantic field that is neither mapped nor listed as not-in-the-document
stops this generator; the committed YAML must equal what this module generates; and the keys the parser
takes in every section (recorded while it reads a document that has them all) must be exactly the CRD's.

What the CRD does NOT do: it is the document's SHAPE (types, enums, bounds, unknown keys refused by the API
server's strict field validation) and the checks CEL can express.  Semantics that need SIE (the spec policy,
artifact on the cluster, schema compatibility, tier rules) stay in the parser and the control plane: the
operator reports their refusals as a condition and an Event naming the field.  Warnings (``image``,
``tolerations``, probes: SIE accepts them but does not act on them) are accepted by the CRD, as the article
writes them, and become the ``Warnings`` condition.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import annotated_types
import yaml
from pydantic import BaseModel

from sie.schemas import spec_parse
from sie.schemas.rollout_policy import _GATE_KEYS, _KEYS
from sie.schemas.spec_models import (
    BackendSpec,
    FieldSpec,
    IOSchema,
    KafkaInput,
    ModelService,
    Resources,
    Scheduling,
    Sla,
    SpecTopics,
)

GROUP = "sie.lmsys.org"
VERSION = "v1"
KIND = "ModelService"
PLURAL = "modelservices"
CRD_NAME = f"{PLURAL}.{GROUP}"
API_VERSION = f"{GROUP}/{VERSION}"
CRD_PATH = Path(__file__).resolve().parent.parent / "infra" / "helm" / "sie" / "crds" / f"{CRD_NAME}.yaml"

#: a list in a spec is bounded so every CEL rule's cost is bounded (the API server refuses unbounded rules)
MAX_FIELDS = 1000
MAX_LIST = 100

_ANY: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}
_QUANTITY: dict[str, Any] = {"x-kubernetes-int-or-string": True,
                             "anyOf": [{"type": "integer"}, {"type": "string"}],
                             "pattern": r"^[0-9]+(\.[0-9]+)?([eE][0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|K|M|G|T|P|E|m)?$"}


class DriftError(Exception):
    """The pydantic models and this table disagree: map the new field (or say why it is not in the document)."""


@dataclass(frozen=True)
class Section:
    """One mapping of the document and the pydantic model its keys normalise to.

    ``keys``: model field -> its spellings in the document (the parser's ``take(...)`` names, camelCase
    first).  ``not_in_document``: model fields a document never sets, with why.  ``override``: a field
    whose document shape differs from the normalised one.  ``extra``: document-only keys.
    """

    model: type[BaseModel] | None
    keys: dict[str, tuple[str, ...]]
    not_in_document: dict[str, str] = field(default_factory=dict)
    override: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: dict[str, dict[str, Any]] = field(default_factory=dict)
    rules: tuple[dict[str, str], ...] = ()
    description: str = ""


def _desc(text: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": text, **schema}


_PROBE = _desc("Accepted as the article writes it and not run (warning): SIE's readiness is a real inference "
               "on exampleInput and the agent watches the process.", {"type": "object", **_ANY})

_TYPE_ALIASES = sorted(spec_parse.TYPE_ALIASES)

SECTIONS: dict[str, Section] = {
    "spec": Section(
        ModelService,
        keys={
            "priority_level": ("priorityLevel", "priority_level"),
            "service_type": ("serviceType", "service_type"),
            "backend": ("backend",),
            "resources": ("resources",),
            "scheduling": ("scheduling",),
            "input_schema": ("inputSchema", "input_schema"),
            "output_schema": ("outputSchema", "output_schema"),
            "sla": ("sla", "slas"),
            "max_concurrent_requests": ("maxConcurrentRequests", "max_concurrent_requests"),
            "topics": ("topics",),
            "kafka_input": ("kafka_input", "kafkaInput"),
            "example_input": ("exampleInput", "example_input"),
            "labels": ("labels",),
            "rollout": ("rollout",),
            "description": ("description",),
        },
        not_in_document={
            "name": "spec.model.name (or metadata.name)",
            "version": "spec.model.version",
            "group_id": "derived: spec.kafka_input.group_id, else <prefix>.scorer.<name>",
            "source": "where the spec was read from (set by the reader)",
            "warnings": "what the parser could not honour (the Warnings condition)",
            "owner": "metadata.annotations[sie.lmsys.org/owner], set by the operator (never from the CR spec)",
        },
        override={
            "service_type": {"type": "string", "pattern": r"^[a-z][a-z0-9_-]*$"},
            "example_input": {"type": "object", **_ANY},
        },
        extra={
            "model": {"type": "object"},  # filled from the "spec.model" section below
            "livenessProbe": _PROBE, "readinessProbe": _PROBE, "startupProbe": _PROBE,
        },
        description="The model SIE should serve: docs/contracts.md lists every field.",
    ),
    "spec.model": Section(
        None,
        keys={},
        extra={
            "name": _desc("The model name (names its Kafka topics); defaults to metadata.name, must equal it if given.",
                          {"type": "string", "pattern": spec_parse.NAME_RE.pattern}),
            "version": _desc("The version (a string: quote 1.1).", {"type": "string", "pattern": spec_parse.VERSION_RE.pattern}),
            "image": _desc("Accepted, not pulled (warning): the agent runs the backend from the artifact/model path.",
                           {"type": "string"}),
        },
        rules=(),
    ),
    "spec.backend": Section(
        BackendSpec,
        keys={
            "type": ("type",),
            "artifact": ("artifact",),
            "modules": ("modules",),
            "format": ("format",),
            "module_class": ("moduleClass", "module_class"),
            "module_kwargs": ("moduleKwargs", "module_kwargs"),
            "callable": ("callable",),
            "model_path": ("modelPath", "model_path"),
            "config": ("config",),
            "device": ("device",),
        },
        not_in_document={
            "artifact_ref": "spec.backend.artifact given as {sha256, name, size, uri} or a URI",
            "modules_path": "the agent's verified copy of spec.backend.modules",
        },
        override={
            "artifact": _desc("torch: a path (sie apply -f uploads it), a URI with sha256, or {sha256, name, size, uri}.",
                              dict(_ANY)),
            "modules": _desc("torch/python: {sha256, name, size, uri} of the spec's own package (sie apply builds it).",
                             dict(_ANY)),
            "device": {"type": "string", "pattern": spec_parse.DEVICE_RE.pattern},
            "module_class": {"type": "string", "pattern": spec_parse.CALLABLE_RE.pattern},
            "callable": {"type": "string", "pattern": spec_parse.CALLABLE_RE.pattern},
        },
        extra={"sha256": {"type": "string", "pattern": "^[0-9a-fA-F]{64}$"},
               "artifactSha256": {"type": "string", "pattern": "^[0-9a-fA-F]{64}$"},
               "artifact_sha256": {"type": "string", "pattern": "^[0-9a-fA-F]{64}$"}},
        # (``artifact`` is a path OR a ref: an untyped field, which CEL cannot see; the parser checks it)
        rules=(
            {"rule": "self.type != 'python' || has(self.callable)", "fieldPath": ".callable",
             "message": "required for the python backend ('package.module:function')"},
            {"rule": "self.type == 'sglang' || !has(self.modelPath)", "fieldPath": ".modelPath",
             "message": "only the sglang backend takes a modelPath"},
        ),
    ),
    "spec.resources": Section(
        Resources,
        keys={"gpu_memory_mb": ("gpuMemoryMb", "gpu_memory_mb"), "gpus": ("gpus",), "cpu": ("cpu",),
              "memory_mb": ("memoryMb", "memory_mb")},
        extra={
            "limits": _desc("Kubernetes style: nvidia.com/gpu, memory, cpu are scheduled; others: warning.",
                            {"type": "object", "additionalProperties": _QUANTITY}),
            "requests": _desc("Read when there are no limits.", {"type": "object", "additionalProperties": _QUANTITY}),
        },
    ),
    "spec.scheduling": Section(
        Scheduling,
        keys={"node_selector": ("nodeSelector", "node_selector"), "tier": ("tier",)},
        extra={"tolerations": _desc("Accepted (warning): SIE places by nodeSelector and tier only.",
                                    {"type": "array", "maxItems": MAX_LIST, "items": {"type": "object", **_ANY}})},
    ),
    "spec.sla": Section(
        Sla,
        keys={"p99_latency_ms": ("p99_latency_ms", "p99LatencyMs"),
              "max_queue_time_ms": ("max_queue_time_ms", "maxQueueTimeMs"),
              "min_qps": ("min_qps", "minQps"),
              "min_replicas": ("min_replicas", "minReplicas"),
              "max_replicas": ("max_replicas", "maxReplicas")},
    ),
    "spec.inputSchema": Section(
        IOSchema,
        keys={"fields": ("fields",), "unknown_fields": ("unknown_fields", "unknownFields")},
        extra={"type": {"type": "string", "enum": ["json"]}},
    ),
    "spec.inputSchema.fields[]": Section(
        FieldSpec,
        keys={"name": ("name",), "type": ("type",), "required": ("required",), "nullable": ("nullable",),
              "max_length": ("max_length", "maxLength"), "range": ("range",), "description": ("description",)},
        override={
            "name": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_.-]*$"},
            "type": _desc("string, int, float, bool (or an alias)", {"type": "string", "enum": _TYPE_ALIASES}),
        },
        rules=({"rule": "!has(self.range) || self.range[0] <= self.range[1]", "fieldPath": ".range",
                "message": "must be [min, max] with min <= max"},),
    ),
    "spec.topics": Section(
        SpecTopics,
        keys={"requests": ("requests",), "results": ("results",), "dead_letters": ("deadLetters", "dead_letters"),
              "backfill": ("backfill",)},
    ),
    "spec.kafka_input": Section(
        KafkaInput,
        keys={"bootstrap_servers": ("bootstrap_servers", "bootstrapServers"), "topic": ("topic",),
              "group_id": ("group_id", "groupId"), "auto_offset_reset": ("auto_offset_reset", "autoOffsetReset"),
              "value_deserializer": ("value_deserializer", "valueDeserializer")},
        extra={"enable_auto_commit": {"type": "boolean"}, "enableAutoCommit": {"type": "boolean"}},
    ),
}
#: the output schema is read by the same reader as the input schema
SECTIONS["spec.outputSchema"] = SECTIONS["spec.inputSchema"]
SECTIONS["spec.outputSchema.fields[]"] = SECTIONS["spec.inputSchema.fields[]"]

#: ``spec.rollout`` is a dataclass policy (``sie.schemas.rollout_policy``), read from camelCase keys
ROLLOUT_GATES: dict[str, dict[str, Any]] = {
    "p99MaxMs": {"type": "number", "minimum": 0, "nullable": True},
    "p99MaxRatio": {"type": "number", "minimum": 0, "nullable": True},
    "p99SlackMs": {"type": "number", "nullable": True},
    "maxErrorRateIncrease": {"type": "number", "minimum": 0, "nullable": True},
    "maxExpiryRateIncrease": {"type": "number", "minimum": 0, "nullable": True},
    "minSamples": {"type": "integer", "minimum": 1},
    "confidence": {"type": "number", "minimum": 0.5, "maximum": 1, "exclusiveMaximum": True},
    "inconclusiveIntervals": {"type": "integer", "minimum": 0},
}
ROLLOUT: dict[str, dict[str, Any]] = {
    "steps": _desc("Percent of requests on the new version per step: strictly rising, ending at 100.",
                   {"type": "array", "maxItems": MAX_LIST, "x-kubernetes-list-type": "set",
                    "items": {"type": "integer", "minimum": 1, "maximum": 100},
                    "x-kubernetes-validations": [
                        {"rule": "self.isSorted()", "message": "must be strictly rising percentages"},
                        {"rule": "size(self) == 0 || self[size(self) - 1] == 100", "message": "the last step must be 100"},
                    ]}),
    "intervalSeconds": {"type": "number", "exclusiveMinimum": True, "minimum": 0},
    "surgeTimeoutSeconds": {"type": "number", "exclusiveMinimum": True, "minimum": 0},
    "gates": {"type": "object", "properties": ROLLOUT_GATES},
}


# ----------------------------------------------------------------------------------------------- schemas


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def annotation_schema(annotation: Any, where: str) -> dict[str, Any]:
    """The structural schema of one field's type; raises ``DriftError`` for a type it cannot express."""
    annotation, optional = _unwrap_optional(annotation)
    out: dict[str, Any]
    origin = typing.get_origin(annotation)
    if annotation is str or annotation is Path:
        out = {"type": "string"}
    elif annotation is bool:
        out = {"type": "boolean"}
    elif annotation is int:
        out = {"type": "integer"}
    elif annotation is float:
        out = {"type": "number"}
    elif origin is Literal:
        out = {"type": "string", "enum": list(typing.get_args(annotation))}
    elif origin is dict:
        _key, value = typing.get_args(annotation)
        out = {"type": "object", "additionalProperties": {"type": "string"}} if value is str else {"type": "object", **_ANY}
    elif origin is tuple:
        args = typing.get_args(annotation)
        if len(args) == 2 and args[1] is Ellipsis:
            out = {"type": "array", "maxItems": MAX_FIELDS, "items": annotation_schema(args[0], where + "[]")}
        else:
            out = {"type": "array", "minItems": len(args), "maxItems": len(args),
                   "items": annotation_schema(args[0], where + "[]")}
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        out = {"type": "object"}  # a nested section: its properties come from SECTIONS
    else:
        raise DriftError(f"{where}: no CRD schema for the type {annotation!r}; add an override in k8s/crd.py")
    if optional:
        out["nullable"] = True
    return out


def _constraints(metadata: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            out["minimum"] = item.ge
        elif isinstance(item, annotated_types.Gt):
            out["minimum"], out["exclusiveMinimum"] = item.gt, True
        elif isinstance(item, annotated_types.Le):
            out["maximum"] = item.le
        elif isinstance(item, annotated_types.MaxLen):
            out["maxLength"] = item.max_length
        elif getattr(item, "pattern", None):
            out["pattern"] = item.pattern
    return out


def _alias_rules(section: Section) -> list[dict[str, str]]:
    rules = []
    for spellings in section.keys.values():
        for other in spellings[1:]:
            rules.append({"rule": f"!(has(self.{spellings[0]}) && has(self.{other}))",
                          "message": f"{spellings[0]} and {other} are the same field; keep one"})
    return rules


def section_schema(path: str) -> dict[str, Any]:
    """The schema of one document section, its nested sections included."""
    section = SECTIONS[path]
    props: dict[str, Any] = {}
    if section.model is not None:
        fields = section.model.model_fields
        unmapped = set(fields) - set(section.keys) - set(section.not_in_document)
        if unmapped:
            raise DriftError(f"{section.model.__name__}.{sorted(unmapped)[0]} is in the spec model but not in the CRD: "
                             f"map it in k8s/crd.py SECTIONS[{path!r}] (or say why it is not in the document), "
                             "then run python -m sie.k8s.crd --write")
        stale = set(section.keys) - set(fields)
        if stale:
            raise DriftError(f"k8s/crd.py SECTIONS[{path!r}] maps {sorted(stale)[0]}, which "
                             f"{section.model.__name__} no longer has")
        for name, spellings in section.keys.items():
            info = fields[name]
            schema = dict(section.override.get(name) or {**annotation_schema(info.annotation, f"{path}.{name}"),
                                                         **_constraints(info.metadata)})
            if info.description and "description" not in schema:
                schema["description"] = info.description
            for spelling in spellings:
                props[spelling] = _nested(path, spelling, schema)
    for key, schema in section.extra.items():
        props[key] = _nested(path, key, schema)
    out: dict[str, Any] = {"type": "object", "properties": props}
    if section.description:
        out["description"] = section.description
    rules = [*_alias_rules(section), *section.rules]
    if path == "spec.sla":
        rules.append(_replicas_rule())
    if rules:
        out["x-kubernetes-validations"] = rules
    return out


def _nested(path: str, key: str, schema: dict[str, Any]) -> dict[str, Any]:
    """Fill a key that is a section of its own (by its canonical path) or a list of sections."""
    canonical = {"inputSchema": "inputSchema", "input_schema": "inputSchema", "outputSchema": "outputSchema",
                 "output_schema": "outputSchema", "sla": "sla", "slas": "sla", "kafka_input": "kafka_input",
                 "kafkaInput": "kafka_input"}.get(key, key)
    child = f"{path}.{canonical}"
    if child in SECTIONS:
        nested = section_schema(child)
        if "nullable" in schema:
            nested["nullable"] = schema["nullable"]
        return nested
    if f"{child}[]" in SECTIONS:
        items = section_schema(f"{child}[]")
        items["required"] = ["name", "type"]
        return {**schema, "items": items, "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}
    if child == "spec.rollout":
        if set(ROLLOUT) != _KEYS or set(ROLLOUT_GATES) != _GATE_KEYS:
            raise DriftError("spec.rollout: the rollout policy's keys changed (sie.schemas.rollout_policy); "
                             "update ROLLOUT/ROLLOUT_GATES in k8s/crd.py")
        return {"type": "object", "nullable": True, "properties": ROLLOUT,
                "description": "Canary steps, time per step, SLO gates: docs/rollouts.md."}
    return schema


def _replicas_rule() -> dict[str, str]:
    def get(spellings: tuple[str, ...], default: str) -> str:
        expr = default
        for spelling in reversed(spellings):
            expr = f"(has(self.{spelling}) ? self.{spelling} : {expr})"
        return expr

    lo, hi = SECTIONS["spec.sla"].keys["min_replicas"], SECTIONS["spec.sla"].keys["max_replicas"]
    # the parser defaults max to max(min, 1) when absent: only a given max can be below min
    given = " || ".join(f"has(self.{s})" for s in hi)
    return {"rule": f"!({given}) || {get(lo, '1')} <= {get(hi, '1')}",
            "fieldPath": ".min_replicas", "message": "min_replicas must be <= max_replicas"}


CONDITION = {
    "type": "object",
    "required": ["type", "status", "lastTransitionTime", "reason", "message"],
    "properties": {
        "type": {"type": "string", "maxLength": 316},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "reason": {"type": "string", "maxLength": 1024},
        "message": {"type": "string", "maxLength": 32768},
    },
}

STATUS: dict[str, Any] = {
    "type": "object",
    "description": "Written by the SIE operator from the control plane's view (docs/kubernetes.md).",
    "properties": {
        "phase": {"type": "string", "description": "Ready, Progressing, Degraded, Unschedulable, Invalid, Pending, "
                                                   "Refused, Deleting"},
        "ready": {"type": "string", "description": "ready/desired replicas, e.g. 2/2"},
        "readyReplicas": {"type": "integer"},
        "desiredReplicas": {"type": "integer"},
        "version": {"type": "string", "description": "the version the cluster serves"},
        "reason": {"type": "string"},
        "specDigest": {"type": "string", "description": "digest of the normalised spec last accepted by SIE"},
        "observedGeneration": {"type": "integer", "format": "int64"},
        "rollout": {"type": "object", "properties": {
            "phase": {"type": "string"}, "step": {"type": "integer"}, "weightPercent": {"type": "number"},
            "canaryVersion": {"type": "string"}, "stableVersion": {"type": "string"}, "reason": {"type": "string"}}},
        "lastEvent": {"type": "string"},
        "warnings": {"type": "array", "items": {"type": "string"}},
        "conditions": {"type": "array", "items": CONDITION, "x-kubernetes-list-type": "map",
                       "x-kubernetes-list-map-keys": ["type"]},
    },
}


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition as a dict (what ``--write`` dumps)."""
    spec = section_schema("spec")
    spec["required"] = ["model", "backend"]
    spec["properties"]["model"]["required"] = ["version"]
    root = {
        "type": "object",
        "required": ["spec"],
        "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                       "metadata": {"type": "object"}, "spec": spec, "status": STATUS},
        "x-kubernetes-validations": [
            {"rule": "!has(self.spec.model.name) || self.spec.model.name == self.metadata.name",
             "fieldPath": ".spec.model.name", "message": "must equal metadata.name (the model name keys the specs topic)"},
        ],
    }
    printer = [
        {"name": "Ready", "type": "string", "jsonPath": ".status.ready"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        # the version the cluster serves, and the one asked for: they differ during a rollout and after a refused
        # update (an invalid or schema-breaking spec keeps the served version)
        {"name": "Version", "type": "string", "jsonPath": ".status.version"},
        {"name": "Requested", "type": "string", "jsonPath": ".spec.model.version"},
        {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/part-of": "sie"},
                     "annotations": {"sie.lmsys.org/generated-by": "python -m sie.k8s.crd --write (from sie.schemas.spec_models)"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": "modelservice",
                      "shortNames": ["ms"], "categories": ["sie"]},
            "versions": [{"name": VERSION, "served": True, "storage": True, "schema": {"openAPIV3Schema": root},
                          "subresources": {"status": {}}, "additionalPrinterColumns": printer}],
        },
    }


def render() -> str:
    header = ("# GENERATED by `python -m sie.k8s.crd --write` from sie.schemas.spec_models: do not edit.\n"
              "# tests/k8s/test_crd.py fails when this file and the spec model drift apart.\n")
    return header + yaml.dump(crd(), Dumper=_NoAliases, sort_keys=False, width=120)


class _NoAliases(yaml.SafeDumper):
    """Every shared sub-schema written out in full: anchors are legal YAML, but unreadable in a CRD."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def main(argv: list[str] | None = None) -> int:
    import sys

    args = sys.argv[1:] if argv is None else argv
    if args == ["--write"]:
        CRD_PATH.parent.mkdir(parents=True, exist_ok=True)
        CRD_PATH.write_text(render(), encoding="utf-8")
        print(f"wrote {CRD_PATH}")
        return 0
    if args:
        print("usage: python -m sie.k8s.crd [--write]", file=sys.stderr)
        return 2
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

