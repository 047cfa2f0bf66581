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
    launch = builder(DesiredReplica(replica_id="m-0", model="m", version="1", template_json="{}"))
    assert launch.env["SIE_BOOTSTRAP_SERVERS"] == "127.0.0.1:29092"
    assert launch.env["SIE_TOPIC_PREFIX"] == "blue"


def test_secrets_are_never_shown_but_reach_clients_and_children(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    password_file = tmp_path / "pw"
    password_file.write_text("from-the-file\n")
    settings = Settings(sasl_username="svc", sasl_password="hunter2-secret", api_token="sie_tok-secret",
                        kafka_secrets={"sasl.oauthbearer.client.secret": "oidc-secret"})
    shown = repr(settings) + str(settings) + str(settings.model_dump())
    for secret in ("hunter2-secret", "sie_tok-secret", "oidc-secret"):
        assert secret not in shown
    config = settings.kafka_client_config()
    assert config["sasl.password"] == "hunter2-secret" and config["sasl.oauthbearer.client.secret"] == "oidc-secret"
    assert settings.with_overrides(sasl_password_file=password_file).kafka_client_config()["sasl.password"] == "from-the-file"
    for key, value in settings.to_env().items():  # an agent's workers get them
        monkeypatch.setenv(key, value)
    assert Settings() == settings
    monkeypatch.setenv("SIE_KAFKA_SECRETS", '{"x": ["not-a-string-secret"]}')
    with pytest.raises(ValueError) as info:
        Settings()
    assert "not-a-string-secret" not in str(info.value)


def test_workers_may_run_as_their_own_principal() -> None:
    agent = Settings(sasl_username="sie-agent", sasl_password="a", worker_sasl_username="sie-scorer",
                     worker_sasl_password="s")
    worker = agent.worker_settings()
    assert worker.kafka_client_config()["sasl.username"] == "sie-scorer"
    assert worker.kafka_client_config()["sasl.password"] == "s"
    assert worker.worker_sasl_username is None
    assert Settings(sasl_username="x").worker_settings().sasl_username == "x"


def test_metrics_bind_loopback_by_default_and_advertised_where_it_listens(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    for name in ("SIE_METRICS_BIND", "SIE_ADVERTISE_HOST"):
        monkeypatch.delenv(name, raising=False)
    default = Settings()
    assert default.metrics_bind == "127.0.0.1" and default.metrics_host == "127.0.0.1"
    assert Settings(metrics_bind="0.0.0.0").metrics_host == socket.gethostname()
    assert Settings(metrics_bind="10.0.0.7").metrics_host == "10.0.0.7"
    assert Settings(metrics_bind="0.0.0.0", advertise_host="node-a.example").metrics_host == "node-a.example"
    monkeypatch.setenv("SIE_METRICS_BIND", "0.0.0.0")
    assert Settings().metrics_bind == "0.0.0.0"


def test_metrics_servers_listen_on_loopback_by_default() -> None:
    import socket

    from sie.streams.scorer.metrics import ScorerMetrics

    metrics = ScorerMetrics("m", "scoring", "P1")
    port = metrics.serve(0)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        assert metrics._server is not None and metrics._server.server_address[0] == "127.0.0.1"
    finally:
        metrics.close()
