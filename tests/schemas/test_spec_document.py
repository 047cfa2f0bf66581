"""The document models (``sie.schemas.spec_document``): they accept every document the hand-written reader
accepted (the golden set: the article's, every example, both spellings of every key) and word the shape problems
they find as it did, at the path the document wrote (flat or Kubernetes style).  golden/shape_problems.json holds
the lines the hand-written reader gave for each case (recorded from it before it was replaced)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sie.schemas.spec import InvalidSpec, load
from sie.schemas.spec_document import ModelServiceDocument, document_problems
from tests.schemas.golden.record import SOURCES, golden_path

REPO_ROOT = Path(__file__).resolve().parents[2]
K8S: dict[str, Any] = {
    "apiVersion": "sie.lmsys.org/v1", "kind": "ModelService", "metadata": {"name": "m"},
    "spec": {"model": {"name": "m", "version": "1.0"}, "backend": {"type": "python", "callable": "a.b:c"},
             "inputSchema": {"fields": [{"name": "x", "type": "float"}]},
             "outputSchema": {"fields": [{"name": "y", "type": "float"}]}, "exampleInput": {"x": 1.0}}}
FLAT: dict[str, Any] = {
    "name": "f", "version": "1.0", "backend": "sglang", "min_gpu_memory_mb": 1024,
    "input_schema": {"fields": [{"name": "t", "type": "string"}]},
    "output_schema": {"fields": [{"name": "s", "type": "float32"}]}, "slas": {"p99_latency_ms": 350}}
S = ("spec",)
#: (document, where, value): one shape problem each, in both styles
SHAPE_PROBLEMS = [
    (K8S, S + ("sla",), {"minReplicas": -1}), (K8S, S + ("sla",), {"max_replicas": "x"}),
    (K8S, S + ("sla",), {"bogus": 1}), (K8S, S + ("sla",), {"min_replicas": 1, "minReplicas": 1}),
    (K8S, S + ("sla",), {"p99LatencyMs": 0}), (K8S, S + ("sla",), {"min_qps": -1}),
    (K8S, S + ("resources",), {"gpuMemoryMb": -5}), (K8S, S + ("resources",), {"cpu": "lots"}),
    (K8S, S + ("resources",), {"gpus": True}), (K8S, S + ("backend", "type"), "tensorrt"),
    (K8S, S + ("priorityLevel",), "P9"), (K8S, S + ("serviceType",), "Bad Type"),
    (K8S, S + ("maxConcurrentRequests",), 0), (K8S, S + ("inputSchema", "fields", 0, "type"), "weird"),
    (K8S, S + ("inputSchema", "fields", 0, "maxLength"), 0), (K8S, S + ("inputSchema", "unknownFields"), "drop"),
    (K8S, S + ("inputSchema", "type"), "avro"), (K8S, S + ("inputSchema", "fields", 0, "required"), "yes"),
    (K8S, S + ("inputSchema", "fields", 0, "name"), "bad name"),
    (K8S, S + ("kafkaInput",), {"autoOffsetReset": "middle"}), (K8S, S + ("backend", "device"), "tpu"),
    (K8S, S + ("backend", "callable"), "nocolon"), (K8S, S + ("bogus",), 1), (K8S, ("bogus",), 1),
    (K8S, ("apiVersion",), "sie.lmsys.org/v2"), (K8S, ("kind",), "Deployment"),
    (K8S, S + ("model", "version"), "bad version!"), (K8S, S + ("scheduling",), {"tier": 5}),
    (K8S, S + ("topics",), {"bogus": "x"}),
    (FLAT, ("min_gpu_memory_mb",), -1), (FLAT, ("slas",), {"p99_latency_ms": "fast"}),
    (FLAT, ("backend",), "tensorrt"), (FLAT, ("bogus",), 1), (FLAT, ("priority_level",), "P7"),
    (FLAT, ("name",), "Bad_Name"), (FLAT, ("input_schema", "fields", 0, "max_length"), -3),
    (FLAT, ("max_concurrent_requests",), "many"),
]


def _with(doc: dict[str, Any], where: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node: Any = out
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    return out


def _reader_problems(doc: dict[str, Any]) -> list[str]:
    try:
        load(doc)
    except InvalidSpec as exc:
        return list(exc.problems)
    return []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_the_models_accept_what_the_reader_accepts(path: Path):
    docs = yaml.safe_load_all(path.read_text(encoding="utf-8"))
    refused_before = "invalid" in json.loads(golden_path(path).read_text())
    problems = [p for doc in docs for p in document_problems(doc)]
    assert bool(problems) == refused_before, problems
    if not refused_before:
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            ModelServiceDocument.model_validate(doc)


def _case_id(doc: dict[str, Any], where: tuple[Any, ...], value: Any) -> str:
    return f"{'flat' if doc is FLAT else 'k8s'}:{'.'.join(map(str, where))}={value!r}"


RECORDED = json.loads((Path(__file__).parent / "golden" / "shape_problems.json").read_text())


@pytest.mark.parametrize(("doc", "where", "value"), SHAPE_PROBLEMS, ids=[_case_id(*c) for c in SHAPE_PROBLEMS])
def test_a_shape_problem_is_worded_as_the_hand_written_reader_worded_it(doc, where, value):
    bad = _with(doc, where, value)
    recorded = RECORDED[_case_id(doc, where, value)]
    got = document_problems(bad)  # (the name and version are the reader's to word: they may come from metadata)
    assert recorded and set(got) <= set(recorded), f"models: {got}\nrecorded: {recorded}"
    assert _reader_problems(bad) == recorded  # and the reader adds nothing to it, nor loses anything


def test_the_flat_style_is_reshaped_into_the_kubernetes_layout():
    flat = ModelServiceDocument.model_validate(FLAT)
    assert flat.spec.model.name == "f" and flat.spec.backend.type == "sglang"
    assert flat.spec.resources.gpu_memory_mb == 1024
    assert flat.spec.sla.p99_latency_ms == 350
