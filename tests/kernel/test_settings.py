"""One typed settings object: env overrides, security passthrough, and hand-over to child processes."""

from __future__ import annotations

import pytest

from sie.kernel.settings import Settings
from sie.workers.agent.launch import WorkerCommandBuilder
from sie.workers.replica import DesiredReplica


def test_env_overrides_and_security_passthrough(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIE_BOOTSTRAP_SERVERS", "kafka-1:9093")
    monkeypatch.setenv("SIE_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("SIE_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("SIE_KAFKA_EXTRA", '{"ssl.endpoint.identification.algorithm": "none"}')
    config = Settings().kafka_client_config(**{"group.id": "g"})
    assert config.pop("logger").name == "sie.kafka"  # librdkafka's log lines go through Python logging
    assert config == {"bootstrap.servers": "kafka-1:9093", "security.protocol": "SASL_SSL",
                      "sasl.mechanism": "SCRAM-SHA-512", "ssl.endpoint.identification.algorithm": "none",
                      "group.id": "g"}


def test_to_env_round_trips(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Settings(bootstrap_servers="10.0.0.1:9092", topic_prefix="blue", sasl_username="svc",
                        kafka_extra={"client.rack": "a"})
    for key, value in original.to_env().items():
        monkeypatch.setenv(key, value)
    assert Settings() == original


def test_workers_get_the_agents_settings_not_its_environment(tmp_path) -> None:
    """An agent started with --bootstrap-servers (or in-process settings) must hand them to its workers."""
    agent_settings = Settings(bootstrap_servers="127.0.0.1:29092", topic_prefix="blue")
    builder = WorkerCommandBuilder(tmp_path, base_env={"SIE_BOOTSTRAP_SERVERS": "127.0.0.1:9092"},
                                   settings=agent_settings)
    launch = builder(DesiredReplica(replica_id="m-0", model="m", version="1", spec_json="{}"))
    assert launch.env["SIE_BOOTSTRAP_SERVERS"] == "127.0.0.1:29092"
    assert launch.env["SIE_TOPIC_PREFIX"] == "blue"
