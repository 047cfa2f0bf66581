"""The ``ModelService`` CustomResourceDefinition, derived from the document's own pydantic models.

WHY derived: ``sie validate``/``sie apply``, the control plane's ``POST /v1/models`` and the operator read the
same document, whose shape is declared once (``sie.schemas.spec_document``: every section, both spellings,
types, bounds, the keys SIE accepts with a warning, the CEL rules of each section).  The CRD's structural
OpenAPI schema is that declaration's ``model_json_schema()``, rewritten into what the API server takes::

    for every section (a $ref to a document model):
        properties <- each field under EVERY spelling (AliasChoices), its schema made structural:
                      anyOf [X, null] -> X + nullable; exclusiveMinimum n -> minimum n + exclusiveMinimum;
                      const -> enum; an untyped mapping -> x-kubernetes-preserve-unknown-fields
        rules      <- "not both spellings" for every spelled field + the section's own CEL rules
    + the root: apiVersion, kind, metadata, status, and the rule spec.model.name == metadata.name

and ``python -m sie.k8s.crd --write`` writes it to ``infra/helm/sie/crds/``; ``tests/k8s/test_crd.py`` fails
when the committed YAML is not what this module generates.

What the CRD does NOT do: it is the document's SHAPE and the checks CEL can express.  Semantics that need
SIE (the spec policy, artifact on the cluster, schema compatibility, tier rules) stay in the reader and the
control plane: the operator reports their refusals as a condition and an Event naming the field.  Warnings
(``image``, ``tolerations``, probes: SIE accepts them but does not act on them) are accepted by the CRD, as
the article writes them, and become the ``Warnings`` condition.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from sie.schemas import spec_document
from sie.schemas.spec_document import SpecDocument, spellings_of

GROUP = "sie.lmsys.org"
VERSION = "v1"
KIND = "ModelService"
PLURAL = "modelservices"
CRD_NAME = f"{PLURAL}.{GROUP}"
API_VERSION = f"{GROUP}/{VERSION}"
CRD_PATH = Path(__file__).resolve().parent.parent / "infra" / "helm" / "sie" / "crds" / f"{CRD_NAME}.yaml"

#: JSON-schema keys the API server's structural schema has no use for (a default would be APPLIED by it)
_DROPPED = {"title", "default", "additionalProperties", "cel"}


def _document_models() -> dict[str, type[BaseModel]]:
    return {name: obj for name, obj in vars(spec_document).items()
            if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == spec_document.__name__}


def _explicit_description(model: type[BaseModel]) -> str | None:
    """A section's description only where declared for the CRD (a docstring is for readers of the code)."""
    extra = model.model_config.get("json_schema_extra")
    return extra.get("description") if isinstance(extra, dict) else None  # type: ignore[return-value]


def _section(model: type[BaseModel], schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = {}
    rules: list[dict[str, str]] = []
    required = set(schema.get("required", ()))
    required_out: list[str] = []
    for name in model.model_fields:
        spellings = spellings_of(model, name)
        key = next(k for k in (*spellings, name) if k in schema["properties"])
        field_schema = _structural(schema["properties"][key], defs)
        for spelling in spellings:
            props[spelling] = field_schema
        if key in required:
            required_out.append(spellings[0])
        rules += [{"rule": f"!(has(self.{spellings[0]}) && has(self.{other}))",
                   "message": f"{spellings[0]} and {other} are the same field; keep one"} for other in spellings[1:]]
    out: dict[str, Any] = {"type": "object", "properties": props}
    if (description := _explicit_description(model)) is not None:
        out["description"] = description
    if required_out:
        out["required"] = required_out
    rules += [{k: r[k] for k in ("rule", "fieldPath", "message") if k in r} for r in schema.get("cel", [])]
    if rules:
        out["x-kubernetes-validations"] = rules
    return out


def _structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One JSON-schema node (pydantic's) as an OpenAPI v3 structural-schema node (the API server's)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        out = _section(_document_models()[name], defs[name], defs)
        out.update({k: v for k, v in schema.items() if k not in _DROPPED and k != "$ref"})
        return out
    if "anyOf" in schema and not schema.get("x-kubernetes-int-or-string"):
        options = [o for o in schema["anyOf"] if o != {"type": "null"}]
        if len(options) != 1:
            raise ValueError(f"no structural schema for a union of {options}: declare one (WithJsonSchema)")
        out = _structural(options[0], defs)
        out.update({k: v for k, v in schema.items() if k not in _DROPPED and k != "anyOf"})
        if len(options) < len(schema["anyOf"]):
            out["nullable"] = True
        return out
    out = {k: v for k, v in schema.items() if k not in _DROPPED}
    if "const" in out:
        out["enum"] = [out.pop("const")]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in out and out[bound] is not True:
            out[plain], out[bound] = out[bound], True
    if out.get("type") == "array" and "items" in out:
        out["items"] = _structural(out["items"], defs)
    if "x-kubernetes-validations" in out:
        out["x-kubernetes-validations"] = [{k: r[k] for k in ("rule", "fieldPath", "message") if k in r}
                                           for r in out["x-kubernetes-validations"]]
    if out.get("type") == "object" and "properties" not in out and "x-kubernetes-preserve-unknown-fields" not in out:
        values = schema.get("additionalProperties")
        if isinstance(values, dict):
            out["additionalProperties"] = _structural(values, defs)
        else:
            out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def spec_schema() -> dict[str, Any]:
    """``spec`` of the CRD: the document model's JSON schema, made structural."""
    schema = SpecDocument.model_json_schema(by_alias=True, mode="validation")
    defs = schema.pop("$defs", {})
    return _section(SpecDocument, schema, defs)


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
    spec = spec_schema()
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
                     "annotations": {"sie.lmsys.org/generated-by": "python -m sie.k8s.crd --write (from sie.schemas.spec_document)"}},
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
    header = ("# GENERATED by `python -m sie.k8s.crd --write` from sie.schemas.spec_document: do not edit.\n"
              "# tests/k8s/test_crd.py fails when this file and the document model drift apart.\n")
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

