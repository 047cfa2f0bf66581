"""The ModelService CRD is generated from the spec model and must not drift from it or from the parser.

No API server needed here (tests/k8s/test_apiserver.py applies it to a real one)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from pydantic import Field, create_model

from sie.k8s import crd
from sie.schemas import spec_parse
from sie.schemas.spec import InvalidSpec, parse_spec
from sie.schemas.spec_models import Sla


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


def test_a_new_spec_field_without_a_crd_mapping_stops_the_generator(monkeypatch):
    grown = create_model("Sla", __base__=Sla, burst_qps=(float | None, Field(None, ge=0)))
    section = crd.SECTIONS["spec.sla"]
    monkeypatch.setitem(crd.SECTIONS, "spec.sla", crd.Section(grown, section.keys))
    with pytest.raises(crd.DriftError, match=r"Sla\.burst_qps is in the spec model but not in the CRD"):
        crd.crd()


def test_constraints_come_from_the_model():
    spec = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    sla = spec["properties"]["sla"]["properties"]
    assert sla["min_replicas"] == {"type": "integer", "minimum": 0}
    assert sla["maxReplicas"] == {"type": "integer", "minimum": 1}
    assert sla["p99LatencyMs"]["exclusiveMinimum"] is True
    assert spec["properties"]["priorityLevel"]["enum"] == ["P0", "P1", "P2"]
    assert spec["properties"]["backend"]["properties"]["type"]["enum"] == ["torch", "python", "sglang"]
    assert spec["properties"]["kafka_input"]["properties"]["auto_offset_reset"]["enum"] == ["earliest", "latest"]


class _Recorder:
    """Which keys the parser asks for in which section (while it reads one document)."""

    def __init__(self) -> None:
        self.keys: dict[str, set[str]] = {}

    def note(self, section: Any, names: tuple[str, ...]) -> None:
        path = re.sub(r"\[\d+\]", "[]", section.path)
        self.keys.setdefault(path, set()).update(names)


def test_the_parser_and_the_crd_take_the_same_keys_in_every_section(monkeypatch):
    recorder = _Recorder()
    take, has = spec_parse._Section.take, spec_parse._Section.has

    def recording_take(self, *names):
        recorder.note(self, names)
        return take(self, *names)

    def recording_has(self, *names):
        recorder.note(self, names)
        return has(self, *names)

    monkeypatch.setattr(spec_parse._Section, "take", recording_take)
    monkeypatch.setattr(spec_parse._Section, "has", recording_has)
    field = {"name": "x", "type": "string"}
    doc = {"apiVersion": "sie.lmsys.org/v1", "kind": "ModelService", "metadata": {"name": "m"},
           "spec": {"model": {"name": "m", "version": "1"}, "backend": {"type": "python", "callable": "a.b:c"},
                    "scheduling": {}, "resources": {}, "sla": {}, "topics": {}, "kafka_input": {},
                    "inputSchema": {"fields": [field]}, "outputSchema": {"fields": [field]}}}
    parse_spec(doc)
    sections = {path: keys for path, keys in recorder.keys.items() if path.startswith("spec")}
    # every section the CRD describes was read (a reader that stopped taking keys would go unnoticed)
    described = {p for p in crd.SECTIONS} | {"spec.model"}
    assert described <= set(sections), f"sections the parser did not read: {described - set(sections)}"
    for path, keys in sections.items():
        schema_keys = _props({}, path)
        if path == "spec.resources":
            schema_keys -= {"limits", "requests"}  # maps of resource names, read key by key
            keys = keys - {"limits", "requests"}
        assert keys == schema_keys, (
            f"{path}: the parser takes {sorted(keys - schema_keys)} that the CRD lacks, the CRD has "
            f"{sorted(schema_keys - keys)} that the parser refuses")


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
        parse_spec({**doc, "spec": {**doc["spec"], "sla": {"min_replicas": 3, "max_replicas": 2}}})
