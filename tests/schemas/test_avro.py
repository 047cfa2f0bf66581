"""Avro system records: round trips, single-object framing, evolution by fingerprint, corrupt input."""

from __future__ import annotations

import copy
import io
import json

import pytest
from fastavro import parse_schema, schemaless_writer

from sie.schemas import avro_codec
from sie.schemas.avro_codec import HISTORY_DIR, MAGIC, RECORDS, AvroCodecError, Codec, crc64_avro, decode, encode

GPU = {
    "index": 0, "uuid": "GPU-1234", "product": "NVIDIA A100-SXM4-80GB", "memory_total_mb": 81920,
    "memory_used_mb": 1024, "memory_free_mb": 80896, "utilization_pct": 12.5, "temperature_c": 41.0,
    "simulated": False, "healthy": True,
}
SAMPLES: dict[str, dict] = {
    "ModelSpecRecord": {"name": "fraud-scorer", "version": "1.0.0", "spec_json": json.dumps({"name": "fraud-scorer"}),
                        "applied_at_ms": 1_700_000_000_000, "deleted": False},
    "NodeRegistration": {"node": "node-a", "labels": {"tier": "tier-0", "zone": "eu"}, "tier": "tier-0", "cpu_count": 16,
                         "memory_mb": 131072, "gpus": [GPU, {**GPU, "index": 1, "uuid": "GPU-5678"}], "simulated": False,
                         "agent_version": "0.1.0", "started_at_ms": 1},
    "Heartbeat": {"node": "node-a", "ts_ms": 2, "seq": 7, "gpus": [GPU],
                  "replicas": [{"replica_id": "fraud-scorer-1.0.0-0", "model": "fraud-scorer", "version": "1.0.0",
                                "state": "READY", "pid": 4242, "restarts": 1, "reason": None,
                                "metrics_address": "node-a:40123", "lag": 17, "p99_ms": 12.5,
                                # records/inference_rps: their defaults, which is what an older writer's
                                # records read as
                                "records": 0, "inference_rps": None, "process": "pid-4242",
                                "versions": [{"version": "1.1.0", "state": "loading", "detail": None}],
                                "outage": "backend fails on a known-good row too (ConnectionError: refused)",
                                "outage_since_ms": 1796153631750}],
                  "metrics_address": "node-a:9400", "warm_workers": 2, "reserved_memory_mb": 640,
                  "memory_total_mb": 131072, "memory_available_mb": 90112, "shared_process_slots": 0},
    "Assignment": {"node": "node-a", "epoch": 3, "issued_at_ms": 4,
                   "replicas": [{"replica_id": "r1", "model": "m", "version": "1", "gpu_indices": [0, 1],
                                 "gpu_memory_mb": 12288, "spec_json": "{}", "companions": ['{"version": "2"}'],
                                 "template_hash": "0123456789abcdef"}]},
    "ReplicaStatus": {"replica_id": "r1", "node": "node-a", "model": "m", "version": "1", "state": "CRASHED",
                      "reason": "OOM killed", "exit_code": None, "signal": 9, "restarts": 2, "ts_ms": 5},
    "ControlEvent": {"ts_ms": 6, "kind": "unschedulable", "model": "m", "replica_id": None, "node": None,
                     "detail": "no node with 12288 MB free GPU memory"},
    "LeaderEpoch": {"instance_id": "cp-1", "epoch": 9, "ts_ms": 7},
    "ModelStatus": {"name": "m", "version": "1", "priority_level": "P0", "service_type": "scoring", "phase": "Ready",
                    "reason": None, "desired_replicas": 1, "ready_replicas": 1,
                    "replicas": [{"replica_id": "r1", "model": "m", "version": "1", "node": "node-a", "gpu_indices": [0],
                                  "gpu_memory_mb": 0, "state": "READY", "reason": None, "restarts": 0,
                                  "actual_version": "1", "process": "pid-4242", "other_version": "1.1.0 ready",
                                  "cooldowns": []}],
                    "epoch": 3, "updated_at_ms": 8,
                    "autoscale": {"desired": 3, "action": "up", "reason": "1 -> 3: 3 needed", "decided_at_ms": 9,
                                  "last_scale_at_ms": 9, "capacity_per_replica": 120.5, "blocked_until_ms": None,
                                  "woke_at_ms": None, "first_result_ms": None, "lag": 5000, "arrival_rate": 10.0,
                                  "drain_rate": 120.5, "drain_time_s": 45.2, "budget_s": 30.0, "p99_ms": 12.0,
                                  "needed": 3},
                    "director": {"floor": 3, "node": "node-b", "replica": "m-0", "since_ms": 7, "cool_since_ms": None}},
    "ArtifactManifest": {"sha256": "ab" * 32, "name": "fraud.safetensors", "size": 1_234_567, "chunk_size": 524288,
                         "chunks": 3, "chunk_partition": 1, "first_offset": 10, "last_offset": 12, "created_ms": 9},
    "ConnectorRecord": {"name": "orders-to-fraud", "spec_json": "{}", "applied_at_ms": 10, "paused": True,
                        "deleted": False},
    "Rollout": {"model": "m", "stable_version": "1.0.0", "canary_version": "1.1.0", "phase": "Canary", "step": 1,
                "weight_bp": 2000, "epoch": 2, "started_ms": 9, "phase_since_ms": 10, "paused_from": None,
                "reason": "gates passed at 10%", "policy_json": json.dumps({"steps": [10, 20, 50, 100]}),
                "events": [{"at_ms": 9, "from_phase": "Pending", "to_phase": "Surging", "step": -1, "weight_bp": 0,
                            "reason": "starting 1.1.0"}],
                "stable_spec_json": "{}", "canary_spec_json": "{}", "updated_at_ms": 11},
}


def test_samples_cover_every_record():
    assert set(SAMPLES) == set(RECORDS)


@pytest.mark.parametrize("name", RECORDS)
def test_round_trip(name):
    data = encode(name, SAMPLES[name])
    assert data[:2] == MAGIC
    assert data[2:10] == avro_codec.default_codec().fingerprint(name)
    assert decode(data) == SAMPLES[name]
    assert decode(data, expected=name) == SAMPLES[name]
    assert decode(data, expected=f"sie.v1.{name}") == SAMPLES[name]


def test_defaults_fill_omitted_fields():
    record = {"replica_id": "r", "node": "n", "model": "m", "version": "1", "state": "READY", "ts_ms": 1}
    assert decode(encode("ReplicaStatus", record)) == {**record, "reason": None, "exit_code": None, "signal": None,
                                                       "restarts": 0}


def test_schemas_are_namespaced_and_self_contained():
    for name in RECORDS:
        s = avro_codec.schema(name)
        assert s["namespace"] == "sie.v1" and s["name"] == name
        parse_schema(copy.deepcopy(s))  # parses without the shared named types: they are inlined


def test_crc64_avro_matches_spec_vector():
    # Known value: fingerprint of the canonical form of the primitive schema "int"
    assert crc64_avro(b'"int"').hex() == "8f5c393f1ad57572"


def test_wrong_record_type_expected():
    with pytest.raises(AvroCodecError, match="expected a Heartbeat record, got LeaderEpoch"):
        decode(encode("LeaderEpoch", SAMPLES["LeaderEpoch"]), expected="Heartbeat")


def test_unknown_record_name():
    with pytest.raises(AvroCodecError, match="unknown record 'Bogus'"):
        encode("Bogus", {})


def test_encode_errors_name_the_field():
    with pytest.raises(AvroCodecError, match=r"cannot encode LeaderEpoch: .*epoch"):
        encode("LeaderEpoch", {"instance_id": "a", "epoch": "three", "ts_ms": 1})
    with pytest.raises(AvroCodecError, match=r"no value and no default for epoch"):
        encode("LeaderEpoch", {"instance_id": "a", "ts_ms": 1})


# ---------------------------------------------------------------- corrupt input


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        (b"", "not an SIE Avro record"),
        (b'{"json": true}', "not an SIE Avro record"),
        (MAGIC + b"\x00" * 8 + b"\x02", "unknown writer schema fingerprint 0000000000000000"),
    ],
)
def test_corrupt_headers(data, pattern):
    with pytest.raises(AvroCodecError, match=pattern):
        decode(data)


def test_truncated_body():
    data = encode("Heartbeat", SAMPLES["Heartbeat"])
    with pytest.raises(AvroCodecError, match=r"corrupt Heartbeat record"):
        decode(data[:-5])


def test_trailing_bytes():
    data = encode("LeaderEpoch", SAMPLES["LeaderEpoch"])
    with pytest.raises(AvroCodecError, match=r"trailing bytes"):
        decode(data + b"\x00\x01")


def test_garbage_body():
    header = encode("ModelSpecRecord", SAMPLES["ModelSpecRecord"])[:10]
    with pytest.raises(AvroCodecError, match=r"corrupt ModelSpecRecord record"):
        decode(header + b"\xff" * 40)


def test_not_bytes():
    with pytest.raises(AvroCodecError, match="expected bytes"):
        decode("text")  # type: ignore[arg-type]


# ---------------------------------------------------------------- evolution


def _encode_with(schema: dict, record: dict) -> bytes:
    buf = io.BytesIO()
    buf.write(MAGIC + avro_codec.fingerprint(schema))
    schemaless_writer(buf, parse_schema(copy.deepcopy(schema)), record)
    return buf.getvalue()


def test_old_writer_new_reader_gets_default_for_added_field():
    codec = Codec()
    old = copy.deepcopy(codec.schema("ControlEvent"))
    old["fields"] = [f for f in old["fields"] if f["name"] != "node"]  # "node" was added later, with a default
    old_record = {k: v for k, v in SAMPLES["ControlEvent"].items() if k != "node"}
    data = _encode_with(old, old_record)
    with pytest.raises(AvroCodecError, match="unknown writer schema fingerprint"):
        codec.decode(data)  # not known yet: clear error, not garbage
    codec.register_writer(old)
    assert codec.decode(data, expected="ControlEvent") == {**old_record, "node": None}


def test_history_directory_is_loaded(tmp_path):
    old = copy.deepcopy(Codec().schema("ReplicaStatus"))
    old["fields"] = [f for f in old["fields"] if f["name"] not in ("signal", "exit_code")]
    (tmp_path / "ReplicaStatus.v0.avsc").write_text(json.dumps(old))
    codec = Codec(history_dir=tmp_path)
    record = {k: v for k, v in SAMPLES["ReplicaStatus"].items() if k not in ("signal", "exit_code")}
    assert codec.decode(_encode_with(old, record)) == {**record, "signal": None, "exit_code": None}


def test_new_enum_symbol_reads_as_unknown():
    codec = Codec()
    newer = copy.deepcopy(codec.schema("ReplicaStatus"))
    state = next(f for f in newer["fields"] if f["name"] == "state")
    state["type"]["symbols"].append("HIBERNATING")
    codec.register_writer(newer)
    record = {**SAMPLES["ReplicaStatus"], "state": "HIBERNATING"}
    assert codec.decode(_encode_with(newer, record))["state"] == "UNKNOWN"


def test_removed_field_without_default_is_not_readable():
    """Why the rules forbid it: a reader field with no default cannot be filled from an old record."""
    codec = Codec()
    old = copy.deepcopy(codec.schema("LeaderEpoch"))
    old["fields"] = [f for f in old["fields"] if f["name"] != "epoch"]
    codec.register_writer(old)
    with pytest.raises(AvroCodecError, match="cannot read this LeaderEpoch .* with the current schema"):
        codec.decode(_encode_with(old, {"instance_id": "a", "ts_ms": 1}))


def test_heartbeat_of_an_agent_before_host_memory_reads_as_unknown():
    """An agent older than Heartbeat.v4 sends no host memory and no process: they read as null/0, which the
    control plane treats as "not reported" (placement counts no process overhead on that node)."""
    old = json.loads((HISTORY_DIR / "Heartbeat.v3.avsc").read_text())
    record = _known_to(old, SAMPLES["Heartbeat"])
    decoded = Codec().decode(_encode_with(old, record), expected="Heartbeat")
    assert (decoded["memory_total_mb"], decoded["memory_available_mb"], decoded["shared_process_slots"]) == (None, None, 0)
    assert decoded["replicas"][0]["process"] is None


def test_heartbeat_of_an_agent_before_outage_reports_reads_as_no_outage():
    """An agent older than Heartbeat.v6 reports no backend outage: its replicas read as scoring (null)."""
    old = json.loads((HISTORY_DIR / "Heartbeat.v5.avsc").read_text())
    decoded = Codec().decode(_encode_with(old, _known_to(old, SAMPLES["Heartbeat"])), expected="Heartbeat")
    assert (decoded["replicas"][0]["outage"], decoded["replicas"][0]["outage_since_ms"]) == (None, None)


def test_current_schemas_are_frozen_in_history():
    """Changing a .avsc without `python -m sie.schemas.avro_codec --freeze` fails here."""
    assert Codec().unfrozen() == []


def _known_to(schema, value):
    """``value`` with only what ``schema`` (an expanded writer schema) has, nested records included."""
    if isinstance(schema, dict) and schema.get("type") == "record" and isinstance(value, dict):
        fields = {f["name"]: f["type"] for f in schema["fields"]}
        return {k: _known_to(fields[k], v) for k, v in value.items() if k in fields}
    if isinstance(schema, dict) and schema.get("type") == "array" and isinstance(value, list):
        return [_known_to(schema["items"], v) for v in value]
    return value


@pytest.mark.parametrize("path", sorted(HISTORY_DIR.glob("*.avsc")), ids=lambda p: p.name)
def test_every_historic_writer_is_readable_now(path):
    old = json.loads(path.read_text())
    name = old["name"]
    record = _known_to(old, SAMPLES[name])
    decoded = Codec().decode(_encode_with(old, record), expected=name)
    assert _known_to(old, decoded) == record  # (fields added since read as their defaults)
