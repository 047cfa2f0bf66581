"""Operator commands against a real broker: describe (ready/desired, cool-downs, topics, traffic, lag),
replica reset, tail results|dlq, topics list under the prefix, delete --purge; and logs (no Kafka)."""

from __future__ import annotations

import json
import time

import orjson
import pytest
import yaml

from sie.cli import main
from sie.kernel.clients import KafkaClients
from sie.kernel.settings import Settings
from sie.schemas.avro_codec import encode
from tests.support.helpers import unique_topic, wait_until
from tests.support.scorer_fixtures import ALLOWED_MODULES, echo_spec_doc


@pytest.fixture()
def cluster(kafka_settings, monkeypatch, tmp_path):
    """A fresh SIE cluster (its own prefix) on the test broker, system topics made, one echo model applied."""
    prefix = unique_topic("op").replace(".", "")
    monkeypatch.setenv("SIE_TOPIC_PREFIX", prefix)
    monkeypatch.setenv("SIE_BOOTSTRAP_SERVERS", kafka_settings.bootstrap_servers)
    monkeypatch.setenv("SIE_ALLOWED_MODULES", ",".join(ALLOWED_MODULES))  # the echo model's module
    settings = Settings()
    assert main(["topics", "ensure"]) == 0
    doc = echo_spec_doc()
    path = tmp_path / "echo.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    assert main(["apply", "-f", str(path)]) == 0
    from sie.schemas.spec import load

    spec = load(path, topic_prefix=prefix)
    from sie.kernel.admin import ensure_model_topics

    t = spec.topics
    ensure_model_topics(settings, [t.requests, t.results, t.dead_letters], 2)
    return settings, spec, path


def _produce(settings, topic: str, values: list[bytes], headers=None) -> None:
    producer = KafkaClients().producer(settings.kafka_client_config(**{"acks": "all"}))
    for i, value in enumerate(values):
        producer.produce(topic, value, f"k{i}".encode(), headers=headers(i) if headers else None)
    assert producer.flush(30) == 0


def _status_with_cooldown(settings, spec) -> None:
    until = int(time.time() * 1000) + 250_000
    record = {"name": spec.name, "version": spec.version, "priority_level": "P1", "service_type": "scoring",
              "phase": "Unschedulable", "reason": "unschedulable: FAILED on node-a (cool-down)", "desired_replicas": 1,
              "ready_replicas": 0, "epoch": 1, "updated_at_ms": int(time.time() * 1000),
              "replicas": [{"replica_id": f"{spec.name}-0", "model": spec.name, "version": spec.version, "node": None,
                            "gpu_indices": [], "gpu_memory_mb": 0, "state": "UNSCHEDULABLE",
                            "reason": "unschedulable: FAILED on node-a (cool-down)", "restarts": 0,
                            "actual_version": None,
                            "cooldowns": [{"node": "node-a", "until_ms": until, "reason": "crashed 3 times"}]}]}
    producer = KafkaClients().producer(settings.kafka_client_config(**{"acks": "all"}))
    producer.produce(settings.names.system_topic("model-status"), encode("ModelStatus", record), spec.name.encode())
    assert producer.flush(30) == 0


def _dead_letter_headers(i: int):
    return [("sie.reason", b"output_violation"), ("sie.detail", f"model m 1: outputs.y: out of range ({i})".encode()),
            ("sie.source.topic", b"req"), ("sie.source.partition", b"0"), ("sie.source.offset", str(i).encode()),
            ("sie.model", b"m"), ("sie.version", b"1")]


def test_describe_shows_ready_desired_cooldown_topics_traffic_and_lag(cluster, capsys):
    settings, spec, _path = cluster
    _status_with_cooldown(settings, spec)
    _produce(settings, spec.topics.requests, [orjson.dumps({"id": f"r{i}", "inputs": {"x": 1.0}}) for i in range(12)])
    _produce(settings, spec.topics.results, [b"{}"] * 9)
    _produce(settings, spec.topics.dead_letters, [b"{}"] * 3, _dead_letter_headers)
    capsys.readouterr()
    assert main(["describe", "model", spec.name]) == 0
    out = capsys.readouterr().out
    assert "Ready:       0/1" in out
    assert "cool-down: kept off node-a for 2" in out and f"`sie replica reset {spec.name}-0` ends it" in out
    assert f"Topics:      requests {spec.topics.requests}, results {spec.topics.results}" in out
    assert "requests 0.20/s, results 0.15/s, dead letters 0.05/s (25.0% of outputs)" in out  # 12, 9, 3 in 60 s
    assert f"Lag:         12 request(s) not yet scored (group {spec.group_id}, 2 partitions)" in out


def test_replica_reset_publishes_the_request_the_control_plane_reads(cluster, capsys):
    settings, spec, _path = cluster
    _status_with_cooldown(settings, spec)
    assert main(["replica", "reset", f"{spec.name}-0"]) == 0
    out = capsys.readouterr().out
    assert f"reset: {spec.name}-0 (kept off node-a for" in out and "crashed 3 times" in out
    from sie.control.reconcile.feeder import StateFeeder
    from sie.control.reconcile.records import ClusterState

    state = ClusterState()
    feeder = StateFeeder(settings, state, topics=("events",)).start()
    try:
        wait_until(lambda: f"{spec.name}-0" in state.cooldown_resets, 20, message="the reset event")
    finally:
        feeder.stop()
    assert main(["replica", "reset", "no-such-0"]) == 1
    assert f"replicas: {spec.name}-0" in capsys.readouterr().err


def test_tail_results_and_dead_letters(cluster, capsys):
    settings, spec, _path = cluster
    _produce(settings, spec.topics.results, [orjson.dumps({"id": f"r{i}", "status": "ok"}) for i in range(5)])
    _produce(settings, spec.topics.dead_letters, [b'{"inputs": {"x": 9}}'] * 2, _dead_letter_headers)
    capsys.readouterr()
    assert main(["tail", "results", "--model", spec.name, "-n", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(json.loads(line)["status"] == "ok" for line in lines)
    assert main(["tail", "dlq", "--model", spec.name, "-o", "json"]) == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [d["reason"] for d in docs] == ["output_violation"] * 2
    assert docs[0]["source"]["topic"] == "req" and docs[0]["value"] == '{"inputs": {"x": 9}}'
    assert main(["tail", "dlq", "--model", spec.name]) == 0
    assert "output_violation  req:0:" in capsys.readouterr().out


def test_topics_list_shows_this_clusters_prefix_only(cluster, capsys):
    settings, spec, _path = cluster
    capsys.readouterr()
    assert main(["topics", "list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert spec.topics.requests in names and all(n.startswith(settings.topic_prefix + ".") for n in names)
    assert main(["topics", "list", "--all"]) == 0
    assert "__consumer_offsets" in capsys.readouterr().out


def test_delete_purge_removes_topics_and_groups_after_the_model(cluster, capsys, monkeypatch):
    settings, spec, _path = cluster
    from confluent_kafka import TopicPartition

    consumer = KafkaClients().consumer(settings.kafka_client_config(**{"group.id": spec.group_id}))
    consumer.commit(offsets=[TopicPartition(spec.topics.requests, 0, 0)], asynchronous=False)
    consumer.close()
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    assert main(["delete", "model", spec.name, "--purge"]) == 2  # no terminal to confirm at, no --yes
    assert "pass --yes" in capsys.readouterr().err
    assert main(["delete", "model", spec.name, "--purge", "--yes"]) == 0
    out = capsys.readouterr().out
    assert f"group {spec.group_id}" in out and f"deleted: {spec.name}" in out
    assert f"deleted topic {spec.topics.requests}" in out and f"deleted group {spec.group_id}" in out
    from sie.kernel.admin import admin_client

    admin = admin_client(settings)
    wait_until(lambda: spec.topics.results not in admin.list_topics(timeout=10).topics, 20,
               message="the topics gone")
    assert main(["get", "models"]) == 0 and "(no models applied)" in capsys.readouterr().out


def test_logs_prints_the_agents_worker_log_for_a_replica(tmp_path, capsys):
    log = tmp_path / "node-1" / "fraud-0" / "worker.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"line {i}\n" for i in range(50)))
    assert main(["logs", "fraud-0", "--work-dir", str(tmp_path), "-n", "3"]) == 0
    assert capsys.readouterr().out.splitlines() == ["line 47", "line 48", "line 49"]
    assert main(["logs", "fraud-9", "--work-dir", str(tmp_path)]) == 1
    assert "replicas with logs here: fraud-0" in capsys.readouterr().err


def test_logs_of_a_replica_that_moved_between_nodes_shows_the_current_one_and_says_so(tmp_path, capsys):
    """Issue 28.5: `sie logs churn-torch-0` refused with 'ran under several nodes here (nu1-a, nu1-b): pass
    --node'. The log written last is the node that runs it now; the others stay one --node away."""
    import os

    for node, last in (("nu1-a", "old"), ("nu1-b", "new"), ("nu1-c", "older")):
        log = tmp_path / node / "churn-torch-0" / "worker.log"
        log.parent.mkdir(parents=True)
        log.write_text(f"{node} first\n{node} {last}\n")
    now = os.stat(tmp_path / "nu1-b" / "churn-torch-0" / "worker.log").st_mtime
    for node, age in (("nu1-a", 60), ("nu1-b", 0), ("nu1-c", 600)):  # nu1-b runs it now (written last)
        os.utime(tmp_path / node / "churn-torch-0" / "worker.log", (now - age, now - age))
    assert main(["logs", "churn-torch-0", "--work-dir", str(tmp_path), "-n", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["nu1-b new"]
    assert captured.err.startswith("(node nu1-b: the log written last") and "also nu1-a, nu1-c: --node NAME" in captured.err
    assert main(["logs", "churn-torch-0", "--work-dir", str(tmp_path), "-n", "1", "--node", "nu1-a"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["nu1-a old"] and captured.err == ""


def test_applying_an_unchanged_spec_again_ends_its_replicas_cooldown(cluster, capsys):
    settings, spec, path = cluster
    from sie.schemas.spec_store import read_spec_snapshot

    capsys.readouterr()
    assert main(["apply", "-f", str(path)]) == 0
    assert f"unchanged: {spec.name}" in capsys.readouterr().out  # nothing cooling down: nothing published
    before = read_spec_snapshot(settings).applied_at_ms[spec.name]
    _status_with_cooldown(settings, spec)
    assert main(["apply", "-f", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"re-applied: {spec.name}" in out and f"cool-down ended for {spec.name}-0" in out
    assert read_spec_snapshot(settings).applied_at_ms[spec.name] > before  # the control plane's signal
