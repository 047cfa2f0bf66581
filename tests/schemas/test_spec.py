"""The ModelService spec: both article documents as written, extensions, and every error case."""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

import pydantic
import pytest
import yaml

from sie.kernel.errors import SpecError
from sie.schemas.spec import InvalidSpec, ModelService, load, parse_quantity
from tests.support.helpers import REPO_ROOT

ARTICLE = REPO_ROOT / "examples" / "article"
#: sha256 of each document exactly as the article gives it: the copies in examples/article/ stay verbatim
ARTICLE_SHA256 = {
    "model-spec.yaml": "faa9f8e721a005c13fa6af754399f64cbb9e8ba06def3a97d9572e5cd56c4896",
    "qwen2-7b-scoring.yaml": "b296a10aeaebf11fb5e2b9dff42cee486fe70b01fb6f78ebbdfece509f6abd38",
    "control-plane-config.yaml": "2442ffffd4e0a779adc193b1aad480483d32dc53fbd32a6d42981a2387c736bf",
}


def _write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _problems(exc: pytest.ExceptionInfo) -> tuple[str, ...]:
    return exc.value.problems


@pytest.fixture()
def torch_doc(tmp_path: Path) -> dict:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "fraud.pt").write_bytes(b"not really torchscript")
    return {
        "apiVersion": "sie.lmsys.org/v1",
        "kind": "ModelService",
        "metadata": {"name": "fraud-scorer"},
        "spec": {
            "model": {"name": "fraud-scorer", "version": "1.0.0"},
            "priorityLevel": "P0",
            "serviceType": "scoring",
            "backend": {"type": "torch", "artifact": "models/fraud.pt"},
            "resources": {"gpuMemoryMb": 0, "cpu": 1},
            "inputSchema": {
                "type": "json",
                "fields": [
                    {"name": "amount", "type": "float", "range": [0, 1000000]},
                    {"name": "country", "type": "string", "max_length": 2},
                ],
            },
            "outputSchema": {"type": "json", "fields": [{"name": "fraud_probability", "type": "float", "range": [0, 1]}]},
            "sla": {"p99_latency_ms": 50, "max_queue_time_ms": 30000, "min_replicas": 1, "max_replicas": 2},
            "exampleInput": {"amount": 12.5, "country": "DE"},
        },
    }


# ---------------------------------------------------------------- article documents, as written


def test_article_copies_are_verbatim():
    """The repository's copies are byte for byte the article's (an edit that "fixes" one fails here)."""
    assert sorted(p.name for p in ARTICLE.glob("*.yaml")) == sorted(ARTICLE_SHA256)
    for name, sha256 in ARTICLE_SHA256.items():
        assert hashlib.sha256((ARTICLE / name).read_bytes()).hexdigest() == sha256, f"examples/article/{name} changed"


def test_flat_article_spec_maps_every_field():
    spec = load(ARTICLE / "model-spec.yaml")
    assert spec.model_id == "qwen2-7b-scoring:1.2.0"
    assert spec.backend.type == "sglang"
    assert spec.resources.gpu_memory_mb == 12288
    assert spec.max_concurrent_requests == 128
    assert spec.sla.p99_latency_ms == 350 and spec.sla.max_queue_time_ms == 100
    (text,) = spec.input_schema.fields
    assert (text.name, text.type, text.max_length, text.required) == ("text", "string", 4096, True)
    (score,) = spec.output_schema.fields
    assert (score.name, score.type, score.range) == ("score", "float", (0.0, 1.0))
    assert spec.topics.requests == "sie.model.qwen2-7b-scoring.requests"
    assert spec.group_id == "sie.scorer.qwen2-7b-scoring"
    assert spec.priority_level == "P1" and spec.service_type == "scoring"


def test_k8s_article_spec_maps_every_field_and_warns():
    spec = load(ARTICLE / "qwen2-7b-scoring.yaml")
    assert spec.model_id == "qwen2-7b-scoring:1.2.0"
    assert spec.scheduling.node_selector == {"nvidia.com/gpu.product": "A100-80gb"}
    assert spec.resources.memory_mb == 32 * 1024
    # tp_size 2 needs two GPUs even though limits ask one: kept as written, warned, reserved as 2
    assert spec.resources.gpus == 2
    assert spec.resources.gpu_memory_mb > 0
    assert spec.backend.config == {"tp_size": 2, "max_seq_len": 8192, "enable_flashinfer": True}
    assert (spec.sla.min_replicas, spec.sla.max_replicas) == (2, 4)
    assert spec.topics.requests == "scoring-requests"
    assert spec.topics.results == "sie.model.qwen2-7b-scoring.results"
    assert spec.group_id == "sie-qwen2-group"
    assert spec.kafka_input is not None and spec.kafka_input.auto_offset_reset == "latest"
    assert spec.kafka_input.bootstrap_servers == "kafka-01:9092,kafka-02:9092"
    warned = {w.split(":")[0] for w in spec.warnings}
    assert {
        "spec.model.image",
        "spec.scheduling.tolerations",
        "spec.livenessProbe",
        "spec.kafka_input.bootstrap_servers",
        "spec.inputSchema",
        "spec.outputSchema",
        "spec.resources.gpuMemoryMb",
        "spec.backend.config.tp_size",
    } <= warned
    assert (
        "spec.model.image: SIE does not pull OCI images; the agent runs the backend from the local artifact/model path"
        in spec.warnings
    )
    # no schema given: inputs pass through rather than being rejected
    assert spec.input_schema.fields == () and spec.input_schema.unknown_fields == "allow"


def test_sglang_gpu_memory_derived_from_parameter_count():
    doc = yaml.safe_load((ARTICLE / "qwen2-7b-scoring.yaml").read_text())
    # 7B params * 2 bytes / tp 2 * 1.5 = 10.5 GiB, rounded up to 11 GiB
    assert load(doc).resources.gpu_memory_mb == 11 * 1024
    doc["spec"]["resources"]["gpuMemoryMb"] = 20000
    spec = load(doc)
    assert spec.resources.gpu_memory_mb == 20000
    assert not any(w.startswith("spec.resources.gpuMemoryMb") for w in spec.warnings)


def test_roundtrip_through_document(torch_doc, tmp_path):
    for spec in (load(ARTICLE / "model-spec.yaml"), load(ARTICLE / "qwen2-7b-scoring.yaml"),
                 load(torch_doc, base_dir=tmp_path)):
        doc = spec.to_document()
        assert ModelService.from_document(doc) == spec
        import json

        assert ModelService.from_document(json.loads(json.dumps(doc))) == spec


def test_spec_is_frozen(torch_doc, tmp_path):
    spec = load(torch_doc, base_dir=tmp_path)
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        spec.name = "other"  # type: ignore[misc]


# ---------------------------------------------------------------- SIE extensions


def test_torch_extension_fields(torch_doc, tmp_path):
    spec = load(torch_doc, base_dir=tmp_path)
    assert spec.backend.artifact == (tmp_path / "models" / "fraud.pt").resolve()
    assert spec.backend.format == "torchscript"
    assert spec.priority_level == "P0"
    assert spec.resources.gpu_memory_mb == 0 and spec.resources.cpu == 1.0
    assert spec.input_schema.names == ("amount", "country")
    assert spec.example_input == {"amount": 12.5, "country": "DE"}
    assert spec.warnings == ()


def test_snake_case_aliases_and_topic_overrides(torch_doc, tmp_path):
    s = torch_doc["spec"]
    s["priority_level"] = s.pop("priorityLevel")
    s["input_schema"] = s.pop("inputSchema")
    s["topics"] = {"requests": "a.req", "results": "a.res", "deadLetters": "a.dlq", "backfill": "a.bf"}
    s["scheduling"] = {"node_selector": {"zone": "eu"}, "tier": "tier-0"}
    spec = load(torch_doc, base_dir=tmp_path, topic_prefix="t1")
    assert spec.priority_level == "P0"
    assert (spec.topics.requests, spec.topics.results, spec.topics.dead_letters, spec.topics.backfill) == (
        "a.req", "a.res", "a.dlq", "a.bf")
    assert spec.scheduling.tier == "tier-0" and spec.scheduling.node_selector == {"zone": "eu"}
    assert spec.group_id == "t1.scorer.fraud-scorer"


def test_topic_prefix_changes_defaults():
    spec = load(ARTICLE / "model-spec.yaml", topic_prefix="test-abc")
    assert spec.topics.requests == "test-abc.model.qwen2-7b-scoring.requests"
    assert spec.topics.dead_letters == "test-abc.model.qwen2-7b-scoring.dlq"


@pytest.mark.parametrize(
    ("suffix", "fmt"), [(".pt", "torchscript"), (".ts", "torchscript"), (".pt2", "export"), (".safetensors", "safetensors")]
)
def test_torch_format_inferred_from_suffix(tmp_path, torch_doc, suffix, fmt):
    (tmp_path / f"m{suffix}").write_bytes(b"x")
    torch_doc["spec"]["backend"] = {"type": "torch", "artifact": f"m{suffix}", "moduleClass": "pkg.mod:Net"}
    assert load(torch_doc, base_dir=tmp_path).backend.format == fmt


def test_python_backend(torch_doc, tmp_path):
    torch_doc["spec"]["backend"] = {"type": "python", "callable": "models.rules:score", "device": "cpu"}
    spec = load(torch_doc, base_dir=tmp_path)
    assert spec.backend.callable == "models.rules:score" and spec.backend.device == "cpu"


def test_missing_example_input_warns_for_torch(torch_doc, tmp_path):
    del torch_doc["spec"]["exampleInput"]
    spec = load(torch_doc, base_dir=tmp_path)
    assert any(w.startswith("spec.exampleInput: absent") for w in spec.warnings)


def test_kubernetes_quantities():
    assert parse_quantity("32Gi") == 32 * 2**30
    assert parse_quantity("512Mi") == 512 * 2**20
    assert parse_quantity("1G") == 1e9
    assert parse_quantity("500m") == 0.5
    assert parse_quantity(2) == 2.0
    with pytest.raises(ValueError):
        parse_quantity("12Qi")


def test_multi_document_file(tmp_path):
    text = (ARTICLE / "model-spec.yaml").read_text()
    path = _write(tmp_path, text + "\n---\n" + text.replace("qwen2-7b-scoring", "other-model"))
    assert [s.name for s in load(path, many=True)] == ["qwen2-7b-scoring", "other-model"]
    with pytest.raises(SpecError, match="expected one ModelService"):
        load(path)


# ---------------------------------------------------------------- errors: every problem, with its path


def test_invalid_yaml_names_the_line(tmp_path):
    path = _write(tmp_path, "name: a\nversion: [1\nbackend: torch\n")
    with pytest.raises(SpecError, match=r"line \d+"):
        load(path)


def test_duplicate_yaml_key_is_an_error(tmp_path):
    path = _write(tmp_path, "name: a\nname: b\nversion: '1'\nbackend: sglang\n")
    with pytest.raises(SpecError, match=r"duplicate key 'name'.*line"):
        load(path)


@pytest.mark.parametrize("key", ["? - name: score\n  : 1\n", "? {a: 1}\n  : 1\n"])
def test_a_list_or_mapping_as_a_yaml_key_is_an_error_naming_the_line(tmp_path, key):
    """Found by the fuzz test: ``? - name: score`` (a ``?`` before a list item) made the duplicate-key check
    raise TypeError (unhashable list), not a spec error."""
    path = _write(tmp_path, "name: a\nversion: '1'\nbackend: sglang\nslas:\n  " + key)
    with pytest.raises(SpecError, match=r"line 5.*a key must be a plain name"):
        load(path)


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        load(tmp_path / "nope.yaml")


def test_unknown_kind():
    with pytest.raises(SpecError, match=r"kind: unknown kind; expected ModelService \(got 'Deployment'\)"):
        load({"apiVersion": "apps/v1", "kind": "Deployment"})


def test_wrong_api_version(torch_doc, tmp_path):
    torch_doc["apiVersion"] = "sie.lmsys.org/v2"
    with pytest.raises(SpecError) as exc:
        load(torch_doc, base_dir=tmp_path)
    assert _problems(exc) == ("apiVersion: must be sie.lmsys.org/v1 (got 'sie.lmsys.org/v2')",)


def test_missing_name_and_version_flat():
    with pytest.raises(InvalidSpec) as exc:
        load({"backend": "sglang", "min_gpu_memory_mb": 1})
    assert "name: required (the model name)" in _problems(exc)
    assert "version: required (e.g. 1.2.0)" in _problems(exc)


def test_negative_gpu_memory(torch_doc, tmp_path):
    torch_doc["spec"]["resources"]["gpuMemoryMb"] = -5
    with pytest.raises(InvalidSpec) as exc:
        load(torch_doc, base_dir=tmp_path)
    assert "spec.resources.gpuMemoryMb: must be >= 0 (got -5)" in _problems(exc)
    assert "spec.resources.gpuMemoryMb: must be >= 0 (got -5)" in str(exc.value)


def test_negative_flat_memory():
    with pytest.raises(InvalidSpec) as exc:
        load({"name": "a", "version": "1", "backend": "sglang", "min_gpu_memory_mb": -1})
    assert _problems(exc) == ("min_gpu_memory_mb: must be >= 0 (got -1)",)


def test_unknown_backend_lists_valid_ones(torch_doc, tmp_path):
    torch_doc["spec"]["backend"] = {"type": "tensorrt"}
    with pytest.raises(InvalidSpec) as exc:
        load(torch_doc, base_dir=tmp_path)
    assert "spec.backend.type: unknown backend type; valid: torch, python, sglang (got 'tensorrt')" in _problems(exc)


def test_range_min_greater_than_max(torch_doc, tmp_path):
    torch_doc["spec"]["inputSchema"]["fields"][0]["range"] = [10, 1]
    with pytest.raises(InvalidSpec) as exc:
        load(torch_doc, base_dir=tmp_path)
    assert "spec.inputSchema.fields[0].range: min 10 > max 1 (got [10, 1])" in _problems(exc)


def test_unknown_field_type(torch_doc, tmp_path):
    torch_doc["spec"]["inputSchema"]["fields"][1]["type"] = "complex"
    with pytest.raises(InvalidSpec) as exc:
        load(torch_doc, base_dir=tmp_path)
    (problem,) = _problems(exc)
    assert problem.startswith("spec.inputSchema.fields[1].type: unknown field type; valid: string, int, float, bool")
    assert problem.endswith("(got 'complex')")


def test_duplicate_field_names(torch_doc, tmp_path):
    torch_doc["spec"]["inputSchema"]["fields"].append({"name": "amount", "type": "int"})
    with pytest.raises(InvalidSpec) as exc:
        load(torch_doc, base_dir=tmp_path)
    assert any(p.startswith("spec.inputSchema.fields[2].name: duplicate field name") for p in _problems(exc))


def test_torch_without_artifact(torch_doc, tmp_path):
    del torch_doc["spec"]["backend"]["artifact"]
    with pytest.raises(InvalidSpec) as exc:
        load(torch_doc, base_dir=tmp_path)
    assert any(p.startswith("spec.backend.artifact: required for the torch backend") for p in _problems(exc))


def test_python_without_callable(torch_doc, tmp_path):
    torch_doc["spec"]["backend"] = {"type": "python"}
    with pytest.raises(InvalidSpec) as exc:
        load(torch_doc, base_dir=tmp_path)
    assert any(p.startswith("spec.backend.callable: required for the python backend") for p in _problems(exc))


def test_missing_artifact_file_shows_path(torch_doc, tmp_path):
    torch_doc["spec"]["backend"]["artifact"] = "models/missing.pt"
    with pytest.raises(InvalidSpec) as exc:
        load(torch_doc, base_dir=tmp_path)
    (problem,) = _problems(exc)
    assert problem.startswith(f"spec.backend.artifact: file not found: {tmp_path.resolve() / 'models' / 'missing.pt'}")


def test_safetensors_needs_module_class(torch_doc, tmp_path):
    (tmp_path / "w.safetensors").write_bytes(b"x")
    torch_doc["spec"]["backend"] = {"type": "torch", "artifact": "w.safetensors"}
    with pytest.raises(InvalidSpec) as exc:
        load(torch_doc, base_dir=tmp_path)
    assert any(p.startswith("spec.backend.moduleClass: required with a safetensors artifact") for p in _problems(exc))


@pytest.mark.parametrize("name", ["Fraud", "fraud scorer", "-x", "a/b", ""])
def test_model_name_must_be_topic_safe(name):
    with pytest.raises(InvalidSpec) as exc:
        load({"name": name, "version": "1", "backend": "sglang", "min_gpu_memory_mb": 1})
    assert _problems(exc)[0].startswith("name: must be lowercase [a-z0-9._-]")


def test_float_version_must_be_quoted():
    with pytest.raises(InvalidSpec, match=r"version: must be a string; quote it"):
        load({"name": "a", "version": 1.1, "backend": "sglang"})


def test_unknown_keys_are_errors_at_every_level(torch_doc, tmp_path):
    torch_doc["statuss"] = {}
    torch_doc["spec"]["replicas"] = 3
    torch_doc["spec"]["sla"]["p95_latency_ms"] = 3
    with pytest.raises(InvalidSpec) as exc:
        load(torch_doc, base_dir=tmp_path)
    paths = {p.split(":")[0] for p in _problems(exc)}
    assert paths == {"statuss", "spec.replicas", "spec.sla.p95_latency_ms"}


def test_kafka_input_rules(torch_doc, tmp_path):
    torch_doc["spec"]["kafka_input"] = {"topic": "in", "auto_offset_reset": "smallest", "value_deserializer": "avro"}
    with pytest.raises(InvalidSpec) as exc:
        load(torch_doc, base_dir=tmp_path)
    assert set(_problems(exc)) == {
        "spec.kafka_input.auto_offset_reset: must be earliest or latest (got 'smallest')",
        "spec.kafka_input.value_deserializer: only json is supported (requests are JSON objects) (got 'avro')",
    }


def test_example_input_must_match_input_schema(torch_doc, tmp_path):
    torch_doc["spec"]["exampleInput"] = {"amount": "lots", "country": "DE"}
    with pytest.raises(InvalidSpec) as exc:
        load(torch_doc, base_dir=tmp_path)
    assert _problems(exc) == (
        "spec.exampleInput: does not match inputSchema: inputs.amount: must be a number (got 'lots')",
    )


def test_all_problems_reported_together(torch_doc, tmp_path):
    torch_doc["spec"]["resources"]["gpuMemoryMb"] = -5
    torch_doc["spec"]["priorityLevel"] = "P9"
    torch_doc["spec"]["sla"]["min_replicas"] = 5
    with pytest.raises(InvalidSpec) as exc:
        load(torch_doc, origin="fraud.yaml", base_dir=tmp_path)
    lines = str(exc.value).splitlines()
    assert lines[0] == "fraud.yaml: invalid ModelService spec (3 problems)"
    assert set(lines[1:]) == {
        "spec.resources.gpuMemoryMb: must be >= 0 (got -5)",
        "spec.priorityLevel: must be one of P0, P1, P2 (got 'P9')",
        "spec.sla.min_replicas: must be <= max_replicas 2 (got 5)",
    }


def test_metadata_name_must_match_model_name(torch_doc, tmp_path):
    torch_doc["metadata"]["name"] = "other"
    with pytest.raises(InvalidSpec, match=r"metadata.name: must equal spec.model.name"):
        load(torch_doc, base_dir=tmp_path)


def test_non_mapping_document():
    with pytest.raises(InvalidSpec, match="must be a mapping"):
        load(["a"])  # type: ignore[arg-type]
