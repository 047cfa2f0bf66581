"""`sie validate` (no Kafka) and `sie apply / get models / delete model` against the real broker."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import pytest

from sie.cli import main
from sie.schemas.avro_codec import decode
from sie.schemas.spec_store import read_spec_snapshot, read_specs, specs_topic
from tests.schemas.test_spec import ARTICLE
from tests.support.helpers import consume_all

FLAT = ARTICLE / "model-spec.yaml"
K8S = ARTICLE / "qwen2-7b-scoring.yaml"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _spec_file(tmp_path: Path, name: str, version: str, extra_field: str = "", score_range: str = "[0.0, 1.0]") -> Path:
    path = tmp_path / f"{name}-{version}.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: {name}
        version: "{version}"
        backend: sglang
        min_gpu_memory_mb: 4096
        input_schema:
          type: json
          fields:
            - {{name: text, type: string, max_length: 4096}}{extra_field}
        output_schema:
          type: json
          fields:
            - {{name: score, type: float32, range: {score_range}}}
        """))
    return path


# ---------------------------------------------------------------- validate (no Kafka)


def test_validate_both_article_docs(capsys):
    code, out, err = _run(capsys, "validate", "-f", str(FLAT), "-f", str(K8S))
    assert code == 0, err
    assert out.count("ok: qwen2-7b-scoring 1.2.0 (sglang)") == 2
    assert "  warning: spec.model.image: SIE does not pull OCI images" in out
    assert "  warning: spec.livenessProbe:" in out
    assert "  warning: spec.scheduling.tolerations:" in out


def test_validate_invalid_doc_names_field_on_stderr(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(K8S.read_text().replace("  resources:\n    limits:", "  resources:\n    gpuMemoryMb: -5\n    limits:")
                   .replace("type: sglang", "type: tensorrt"))
    code, out, err = _run(capsys, "validate", "-f", str(FLAT), "-f", str(bad))
    assert code != 0
    assert "spec.backend.type: unknown backend type; valid: torch, python, sglang (got 'tensorrt')" in err
    assert "spec.resources.gpuMemoryMb: must be >= 0 (got -5)" in err
    assert out == ""  # nothing is reported ok when any file fails


def test_validate_every_file_error_reported(capsys, tmp_path):
    a = tmp_path / "a.yaml"
    a.write_text("name: a\nversion: '1'\nbackend: sglang\nmin_gpu_memory_mb: -5\n")
    b = tmp_path / "b.yaml"
    b.write_text("kind: Deployment\n")
    code, _, err = _run(capsys, "validate", "-f", str(a), "-f", str(b))
    assert code == 1
    assert "min_gpu_memory_mb: must be >= 0 (got -5)" in err
    assert "kind: unknown kind; expected ModelService (got 'Deployment')" in err


def test_validate_invalid_yaml(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: a\n  version: 1\n")
    code, _, err = _run(capsys, "validate", "-f", str(bad))
    assert code == 1 and "line 2" in err


# ---------------------------------------------------------------- apply / get / delete on the broker


def _end_offset(settings, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(settings.kafka_client_config(**{"group.id": f"wm-{uuid.uuid4().hex[:8]}"}))
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        consumer.close()


@pytest.fixture()
def cluster_env(kafka_settings, monkeypatch):
    prefix = f"test-{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("SIE_BOOTSTRAP_SERVERS", kafka_settings.bootstrap_servers)
    monkeypatch.setenv("SIE_TOPIC_PREFIX", prefix)
    return kafka_settings.with_overrides(topic_prefix=prefix)


def test_apply_get_delete(capsys, cluster_env, tmp_path):
    settings = cluster_env
    code, out, err = _run(capsys, "apply", "-f", str(FLAT), "-f", str(K8S.parent / "qwen2-7b-scoring.yaml"))
    # both article docs describe the same model name: the second re-configures the first
    assert code == 0, err
    assert "applied: qwen2-7b-scoring 1.2.0 (sglang)" in out
    assert "configured: qwen2-7b-scoring 1.2.0 (sglang)" in out

    records = consume_all(settings, specs_topic(settings), expected=2)
    assert [r.key for r in records] == [b"qwen2-7b-scoring"] * 2
    assert decode(records[-1].value, expected="ModelSpecRecord")["deleted"] is False

    specs = read_specs(settings)
    assert list(specs) == ["qwen2-7b-scoring"]
    assert specs["qwen2-7b-scoring"].topics.requests == "scoring-requests"  # the K8s doc won (latest per key)

    code, out, _ = _run(capsys, "apply", "-f", str(K8S))
    assert code == 0 and "unchanged: qwen2-7b-scoring 1.2.0" in out
    assert _end_offset(settings, specs_topic(settings)) == 2  # nothing published

    other = _spec_file(tmp_path, "other-model", "1.0.0")
    assert _run(capsys, "apply", "-f", str(other))[0] == 0
    code, out, _ = _run(capsys, "get", "models")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "VERSION", "BACKEND", "PRIORITY", "GPU-MEM", "REPLICAS"]
    assert lines[1].split() == ["other-model", "1.0.0", "sglang", "P1", "4096MB", "1-1"]
    assert lines[2].split() == ["qwen2-7b-scoring", "1.2.0", "sglang", "P1", "11264MB", "x2", "2-4"]

    code, out, _ = _run(capsys, "delete", "model", "other-model")
    assert code == 0 and "deleted: other-model 1.0.0" in out
    snapshot = read_spec_snapshot(settings)
    assert set(snapshot.specs) == {"qwen2-7b-scoring"} and "other-model" in snapshot.deleted
    tail = consume_all(settings, specs_topic(settings), expected=5)
    assert decode(tail[-2].value)["deleted"] is True and tail[-1].value is None  # deleted record, then tombstone

    code, _, err = _run(capsys, "delete", "model", "other-model")
    assert code == 1 and "'other-model' is not applied" in err


def test_apply_refuses_breaking_new_version(capsys, cluster_env, tmp_path):
    assert _run(capsys, "apply", "-f", str(_spec_file(tmp_path, "m1", "1.0.0")))[0] == 0
    compatible = _spec_file(tmp_path, "m1", "1.1.0", extra_field="\n            - {name: lang, type: string, required: false}")
    code, out, err = _run(capsys, "apply", "-f", str(compatible))
    assert code == 0, err
    breaking = _spec_file(tmp_path, "m1", "2.0.0", extra_field="\n            - {name: lang, type: string}", score_range="[0, 100]")
    code, out, err = _run(capsys, "apply", "-f", str(breaking))
    assert code == 1
    assert "schema_incompatible" in err
    assert "inputs.lang: optional field became required" in err and "outputs.score: range widened [0, 1] -> [0, 100]" in err
    assert read_specs(cluster_env)["m1"].version == "1.1.0"
    code, out, err = _run(capsys, "apply", "--allow-breaking", "-f", str(breaking))
    assert code == 0, err
    assert read_specs(cluster_env)["m1"].version == "2.0.0"


def test_get_models_on_empty_cluster(capsys, cluster_env):
    code, out, _ = _run(capsys, "get", "models")
    assert code == 0 and "(no models applied)" in out


def test_unreadable_record_is_reported_not_applied(cluster_env, capsys, tmp_path):
    from confluent_kafka import Producer

    from sie.schemas.spec_store import ensure_specs_topic

    ensure_specs_topic(cluster_env)
    producer = Producer(cluster_env.kafka_client_config())
    producer.produce(specs_topic(cluster_env), key=b"junk", value=b'{"not": "avro"}')
    assert producer.flush(10) == 0
    snapshot = read_spec_snapshot(cluster_env)
    assert snapshot.specs == {}
    assert len(snapshot.problems) == 1 and "key 'junk': unreadable spec record: not an SIE Avro record" in snapshot.problems[0]
    code, _, err = _run(capsys, "get", "models")
    assert code == 0 and "warning:" in err and "junk" in err
