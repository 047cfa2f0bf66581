"""The ModelService CRD is derived from the document models and must not drift from the normalised spec or the reader.

No API server needed here (tests/k8s/test_apiserver.py applies it to a real one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, Field, create_model

from sie.k8s import crd
from sie.schemas import spec_document
from sie.schemas.spec import InvalidSpec, load
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


def _sections_of(value: Any, schema: dict[str, Any], path: str) -> set[str]:
    """The CRD's sections (objects with properties) that a document reaches, at their paths in it."""
    if isinstance(value, list):
        return set().union(*(_sections_of(v, schema["items"], path + "[]") for v in value)) if value else set()
    if not isinstance(value, dict) or "properties" not in schema:
        return set()
    out = {path}
    for key, sub in value.items():
        out |= _sections_of(sub, schema["properties"][key], f"{path}.{key}")
    return out


def _props(schema: dict[str, Any], path: str) -> set[str]:
    """The property names of the CRD at a document path like ``spec.inputSchema.fields[]``."""
    node = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for part in path.split("."):
        if part.endswith("[]"):
            node = node["properties"][part[:-2]]["items"]
        else:
            node = node["properties"][part]
    return set(node["properties"])


def test_committed_crd_is_what_the_spec_model_generates():
    committed = crd.CRD_PATH.read_text(encoding="utf-8")
    assert committed == crd.render(), (
        f"{crd.CRD_PATH} differs from the spec model: run `python -m sie.k8s.crd --write` and commit it")


#: fields of the normalised spec that no document key sets, with why
NOT_IN_DOCUMENT = {
    "ModelService": {"name": "spec.model.name (or metadata.name)", "version": "spec.model.version",
                     "group_id": "derived: spec.kafka_input.group_id, else <prefix>.scorer.<name>",
                     "source": "where the spec was read from", "warnings": "what the reader could not honour",
                     "owner": "metadata.annotations[sie.lmsys.org/owner], set by the operator"},
    "BackendSpec": {"artifact_ref": "spec.backend.artifact given as a ref or URI",
                    "modules_path": "the agent's verified copy of spec.backend.modules"},
}
NORMALISED_TO_DOCUMENT = [
    (ModelService, spec_document.SpecDocument), (BackendSpec, spec_document.BackendDocument),
    (Resources, spec_document.ResourcesDocument), (Scheduling, spec_document.SchedulingDocument),
    (Sla, spec_document.SlaDocument), (IOSchema, spec_document.IOSchemaDocument),
    (FieldSpec, spec_document.FieldDocument), (SpecTopics, spec_document.TopicsDocument),
    (KafkaInput, spec_document.KafkaInputDocument),
]


def _undocumented(normalised: type[BaseModel], document: type[BaseModel]) -> set[str]:
    return set(normalised.model_fields) - set(document.model_fields) - set(NOT_IN_DOCUMENT.get(normalised.__name__, {}))


@pytest.mark.parametrize(("normalised", "document"), NORMALISED_TO_DOCUMENT, ids=lambda m: m.__name__)
def test_every_field_of_the_normalised_spec_has_a_document_key(normalised, document):
    assert _undocumented(normalised, document) == set(), (
        f"{normalised.__name__} has fields no {document.__name__} key sets: declare them in "
        "sie.schemas.spec_document (the CRD follows), or say why in NOT_IN_DOCUMENT")


def test_a_new_spec_field_without_a_document_key_is_caught():
    grown = create_model("Sla", __base__=Sla, burst_qps=(float | None, Field(None, ge=0)))
    assert _undocumented(grown, spec_document.SlaDocument) == {"burst_qps"}


def test_a_field_declared_in_the_document_is_in_the_crd_under_every_spelling():
    spec = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for path, model in (("sla", spec_document.SlaDocument), ("backend", spec_document.BackendDocument),
                        ("kafka_input", spec_document.KafkaInputDocument)):
        section = spec["properties"][path]
        for name in model.model_fields:
            for spelling in spec_document.spellings_of(model, name):
                assert spelling in section["properties"], f"spec.{path}.{spelling}"


#: the CRD as the hand-kept section table generated it (before the document models) and what changed since,
#: each reviewed: the document models declare null as "not given" where the reader always took it so, a
#: backend without type is refused by the API server as by the reader, and keys with several spellings
#: (the artifact digest, enable_auto_commit) refuse both spellings at once, as the reader does
CRD_BEFORE = Path(__file__).parent / "golden" / "crd-before.yaml"
_S = "/spec/versions[0]/schema/openAPIV3Schema/properties/spec/properties"
REVIEWED_CRD_CHANGES = {
    ("CHANGED", "/metadata/annotations/sie.lmsys.org/generated-by"),
    *(("ADDED", f"{_S}/{key}/nullable") for key in (
        "backend/properties/artifact", "backend/properties/modules", "exampleInput", "example_input",
        "inputSchema", "input_schema", "outputSchema", "output_schema",
        "livenessProbe", "readinessProbe", "startupProbe")),
    ("ADDED", f"{_S}/backend/required"),
    ("ADDED", f"{_S}/backend/x-kubernetes-validations !(has(self.sha256) && has(self.artifactSha256))"),
    ("ADDED", f"{_S}/backend/x-kubernetes-validations !(has(self.sha256) && has(self.artifact_sha256))"),
    ("ADDED", f"{_S}/kafkaInput/x-kubernetes-validations !(has(self.enable_auto_commit) && has(self.enableAutoCommit))"),
    ("ADDED", f"{_S}/kafka_input/x-kubernetes-validations !(has(self.enable_auto_commit) && has(self.enableAutoCommit))"),
}


def _crd_changes(before: Any, after: Any, path: str = "") -> set[tuple[str, str]]:
    """Structural differences: properties by name, CEL rules and required keys as sets, the rest by value."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: set[tuple[str, str]] = set()
        for key in set(before) | set(after):
            if key not in before:
                out.add(("ADDED", f"{path}/{key}"))
            elif key not in after:
                out.add(("REMOVED", f"{path}/{key}"))
            else:
                out |= _crd_changes(before[key], after[key], f"{path}/{key}")
        return out
    if isinstance(before, list) and isinstance(after, list) and path.endswith("x-kubernetes-validations"):
        rules_before = {r["rule"]: r for r in before}
        rules_after = {r["rule"]: r for r in after}
        return ({("REMOVED", f"{path} {r}") for r in rules_before.keys() - rules_after.keys()}
                | {("ADDED", f"{path} {r}") for r in rules_after.keys() - rules_before.keys()}
                | {("CHANGED", f"{path} {r}") for r in rules_before.keys() & rules_after.keys()
                   if rules_before[r] != rules_after[r]})
    if isinstance(before, list) and isinstance(after, list) and path.endswith("/required"):
        return set() if sorted(before) == sorted(after) else {("CHANGED", path)}
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return set().union(*(_crd_changes(b, a, f"{path}[{i}]") for i, (b, a) in enumerate(zip(before, after))))
    return set() if before == after else {("CHANGED", path)}


def test_the_derived_crd_is_the_hand_kept_one_but_for_reviewed_changes():
    before = yaml.safe_load(CRD_BEFORE.read_text(encoding="utf-8"))
    assert _crd_changes(before, crd.crd()) == REVIEWED_CRD_CHANGES


def test_constraints_come_from_the_model():
    spec = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    sla = spec["properties"]["sla"]["properties"]
    assert sla["min_replicas"] == {"type": "integer", "minimum": 0}
    assert sla["maxReplicas"] == {"type": "integer", "minimum": 1}
    assert sla["p99LatencyMs"]["exclusiveMinimum"] is True
    assert spec["properties"]["priorityLevel"]["enum"] == ["P0", "P1", "P2"]
    assert spec["properties"]["backend"]["properties"]["type"]["enum"] == ["torch", "python", "sglang"]
    assert spec["properties"]["kafka_input"]["properties"]["auto_offset_reset"]["enum"] == ["earliest", "latest"]


def _model_sections(model: type[BaseModel], schema: dict[str, Any], path: str) -> set[str]:
    """Check that every section of the CRD holds exactly the keys the reader's model takes; the paths walked."""
    spellings = {s for name in model.model_fields for s in spec_document.spellings_of(model, name)}
    assert set(schema["properties"]) == spellings, (
        f"{path}: the CRD has {sorted(set(schema['properties']) - spellings)} that the reader refuses, the reader "
        f"takes {sorted(spellings - set(schema['properties']))} that the CRD lacks")
    walked = {path}
    for name, info in model.model_fields.items():
        section = spec_document._unwrap(info.annotation)
        if section is None:
            continue
        for spelling in spec_document.spellings_of(model, name):
            sub = schema["properties"][spelling]
            if sub.get("type") == "array":
                walked |= _model_sections(section, sub["items"], f"{path}.{spelling}[]")
            else:
                walked |= _model_sections(section, sub, f"{path}.{spelling}")
    return walked


def test_the_reader_and_the_crd_take_the_same_keys_in_every_section():
    spec = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    walked = _model_sections(spec_document.SpecDocument, spec, "spec")
    # every section of the CRD was compared (a section the walk missed would go unnoticed)
    described = _sections_of(_every_section(spec), spec, "spec")
    assert described <= walked, f"sections not compared: {described - walked}"


def _every_section(schema: dict[str, Any]) -> Any:
    """A document that has every section of ``schema`` (values only where a section needs them)."""
    if schema.get("type") == "array":
        return [_every_section(schema["items"])] if "properties" in schema.get("items", {}) else []
    if "properties" not in schema:
        return None
    return {k: v for k, sub in schema["properties"].items() if (v := _every_section(sub)) is not None}


GOLDEN_DOCS = Path(__file__).resolve().parents[1] / "schemas" / "golden" / "docs"


@pytest.mark.parametrize("path", [crd.CRD_PATH.parents[4] / "examples" / "fraud-scorer.yaml",
                                  GOLDEN_DOCS / "k8s-python-every-section.yaml",
                                  GOLDEN_DOCS / "k8s-torch-artifact-uri.yaml"], ids=lambda p: p.name)
def test_a_document_the_reader_accepts_fits_the_crd_shape(path):
    root = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]

    def walk(value: Any, schema: dict[str, Any], where: str) -> None:
        if schema.get("x-kubernetes-preserve-unknown-fields") or not isinstance(value, dict):
            if isinstance(value, list) and "properties" in schema.get("items", {}):
                for i, item in enumerate(value):
                    walk(item, schema["items"], f"{where}[{i}]")
            return
        if "properties" not in schema:
            return
        for key, sub in value.items():
            assert key in schema["properties"], f"{where}.{key} is not in the CRD"
            walk(sub, schema["properties"][key], f"{where}.{key}")

    for doc in yaml.safe_load_all(path.read_text()):
        load(doc, base_dir=path.parent)
        walk(doc["spec"], root["properties"]["spec"], "spec")


@pytest.mark.parametrize("name", ["qwen2-7b-scoring.yaml"])
def test_the_article_document_fits_the_crd_shape(name):
    """Every key of the article's ModelService is a CRD property (the API server applies the rest)."""
    doc = yaml.safe_load((crd.CRD_PATH.parents[4] / "examples" / "article" / name).read_text())
    root = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]

    def walk(value: Any, schema: dict[str, Any], path: str) -> None:
        if schema.get("x-kubernetes-preserve-unknown-fields") or not isinstance(value, dict):
            return
        if "properties" not in schema:
            return
        for key, sub in value.items():
            assert key in schema["properties"], f"{path}.{key} is not in the CRD"
            walk(sub, schema["properties"][key], f"{path}.{key}")

    walk(doc["spec"], root["properties"]["spec"], "spec")
    with pytest.raises(InvalidSpec):  # and the parser still refuses what the CRD cannot (sanity of the fixture)
        load({**doc, "spec": {**doc["spec"], "sla": {"min_replicas": 3, "max_replicas": 2}}})
