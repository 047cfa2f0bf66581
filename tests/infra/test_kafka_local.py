"""LocalKafka against real brokers on free loopback ports (never the shared one on 9092)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from sie.commands.kafka import command as kafka_cli
from sie.infra.kafka.fetch import ensure_jars
from sie.infra.kafka.layout import ClusterLayout
from sie.infra.kafka.local import ClusterState, LocalKafka, free_base_port, port_in_use
from sie.kernel.errors import ConfigError
from sie.kernel.settings import Settings
from tests.support.helpers import consume_all, create_topic, produce_json, unique_topic, wait_until


def test_three_broker_layout_pairs_ports_and_lists_all_voters(tmp_path: Path) -> None:
    layout = ClusterLayout(3, 30000, tmp_path)
    assert [(n.broker_port, n.controller_port) for n in layout.nodes] == [(30000, 30001), (30002, 30003), (30004, 30005)]
    assert layout.bootstrap_servers == "127.0.0.1:30000,127.0.0.1:30002,127.0.0.1:30004"
    props = layout.server_properties(layout.node(2))
    assert props["controller.quorum.voters"] == "1@127.0.0.1:30001,2@127.0.0.1:30003,3@127.0.0.1:30005"
    assert "controller.quorum.bootstrap.servers" not in props
    assert props["transaction.state.log.min.isr"] == "2" and props["offsets.topic.replication.factor"] == "3"
    assert props["group.initial.rebalance.delay.ms"] == "0"


def test_nodes_on_their_own_hosts_listen_on_advertise_and_vote_with_them(tmp_path: Path) -> None:
    """The partition campaign's brokers (tests/support/netns.py): each on its own address, recorded with the cluster."""
    layout = ClusterLayout(3, 30000, tmp_path, ("10.203.0.10", "10.203.0.11", "10.203.0.12"))
    assert layout.bootstrap_servers == "10.203.0.10:30000,10.203.0.11:30002,10.203.0.12:30004"
    props = layout.server_properties(layout.node(2))
    assert props["listeners"] == "PLAINTEXT://10.203.0.11:30002,CONTROLLER://10.203.0.11:30003"
    assert props["advertised.listeners"] == props["listeners"]
    assert props["controller.quorum.voters"] == "1@10.203.0.10:30001,2@10.203.0.11:30003,3@10.203.0.12:30005"
    with pytest.raises(ValueError, match="one address per broker"):
        ClusterLayout(3, 30000, tmp_path, ("10.203.0.10",))
    state = ClusterState(3, 30000, "id", "4.1.1", {1: 10}, hosts=layout.hosts)
    state.save(tmp_path / "cluster.json")
    loaded = ClusterState.load(tmp_path / "cluster.json")
    assert loaded == state and loaded.with_pid(2, 11).hosts == layout.hosts
    assert LocalKafka(Settings(), data_dir=tmp_path).bootstrap_servers == layout.bootstrap_servers


def test_single_broker_layout_is_combined_standalone(tmp_path: Path) -> None:
    props = ClusterLayout(1, 30000, tmp_path).server_properties(ClusterLayout(1, 30000, tmp_path).node(1))
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:30001"
    assert "controller.quorum.voters" not in props
    assert props["offsets.topic.replication.factor"] == "1"


@pytest.mark.parametrize(("jit", "c1_only"), [("quick", True), ("full", False)])
def test_a_local_broker_jvm_compiles_with_c1_only_unless_asked_for_full_jit(tmp_path: Path, jit: str,
                                                                             c1_only: bool) -> None:
    """Settings.kafka_jit: the test and quick-start brokers skip C2 (less CPU on 2 cores); benchmarks ask for full."""
    kafka = LocalKafka(Settings(kafka_jit=jit), brokers=1, data_dir=tmp_path)
    node = ClusterLayout(1, 30000, tmp_path).node(1)
    cmd = kafka._java_cmd(node, tmp_path, "java", "kafka.Kafka", "512m")
    assert ("-XX:TieredStopAtLevel=1" in cmd) is c1_only and cmd.index("-Xmx512m") < cmd.index("kafka.Kafka")


def test_unsupported_shape_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="brokers: must be 1 or 3"):
        LocalKafka(Settings(), brokers=2, data_dir=tmp_path)


def test_busy_port_names_the_port_and_the_fix(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"127\.0\.0\.1:{port} is already in use: run `sie kafka down` or pass --base-port"):
            LocalKafka(Settings(), base_port=port, data_dir=tmp_path).up(timeout=5)


def test_missing_java_names_it_and_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))
    # Jars already cached (the usual case): the launch itself needs java.
    with pytest.raises(ConfigError, match=r"`java` not found on PATH.*apt-get install openjdk-17-jre-headless maven"):
        LocalKafka(Settings(), base_port=free_base_port(2), data_dir=tmp_path / "run").up(timeout=5)
    # Nothing cached yet: the fetch fails before calling Maven, naming java too.
    with pytest.raises(ConfigError, match="`java` not found"):
        ensure_jars(Settings().with_overrides(kafka_cache_dir=tmp_path / "cache"), echo=lambda _: None)


def test_status_of_an_empty_data_dir_exits_non_zero(tmp_path: Path) -> None:
    result = CliRunner().invoke(kafka_cli, ["status", "--data-dir", str(tmp_path)], obj=Settings())
    assert result.exit_code != 0
    assert "no local cluster" in str(result.exception)


@pytest.mark.kafka  # it starts a broker of its own
def test_up_status_noop_down(tmp_path: Path) -> None:
    kafka = LocalKafka(Settings(), base_port=free_base_port(2), data_dir=tmp_path, detach=False)
    try:
        bootstrap = kafka.up(timeout=90)
        status = kafka.status()
        assert status["running"] and status["bootstrap_servers"] == bootstrap
        [node] = status["nodes"]
        assert node["alive"] and node["answers"] and node["pid"] > 0
        # Same shape again: nothing restarted.
        assert kafka.up(timeout=30) == bootstrap
        assert kafka.status()["nodes"][0]["pid"] == node["pid"]
        # A different shape in the same dir is refused while it runs.
        with pytest.raises(ConfigError, match="already runs"):
            LocalKafka(Settings(), brokers=3, base_port=kafka.layout.base_port, data_dir=tmp_path).up(timeout=5)
        result = CliRunner().invoke(kafka_cli, ["status", "--data-dir", str(tmp_path)], obj=Settings())
        assert result.exit_code == 0, result.output
        assert f"bootstrap servers: {bootstrap}" in result.output and "answers" in result.output
    finally:
        assert kafka.down() == [1]
    assert not kafka.status()["running"]
    assert not port_in_use(kafka.layout.base_port)


def test_killed_broker_restarts_with_its_data(private_kafka: LocalKafka) -> None:
    settings = private_kafka.settings_for_clients()
    topic = create_topic(settings, unique_topic("restart"), partitions=2)
    produce_json(settings, topic, [{"n": i} for i in range(20)], key_fn=lambda r: str(r["n"]))

    private_kafka.kill_broker(1)
    assert not private_kafka.status(timeout=1)["nodes"][0]["alive"]
    private_kafka.start_broker(1)

    assert private_kafka.status()["running"]
    records = consume_all(settings, topic, expected=20, timeout=30)
    assert sorted(r.json()["n"] for r in records) == list(range(20))


def test_stopped_broker_comes_back(private_kafka: LocalKafka) -> None:
    private_kafka.stop_broker(1)
    wait_until(lambda: not port_in_use(private_kafka.layout.base_port), timeout=10, message="port released")
    private_kafka.start_broker(1)
    assert private_kafka.status()["nodes"][0]["answers"]


def _san(pem: Path) -> list[str]:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(pem.read_bytes().split(b"-----END PRIVATE KEY-----")[-1].lstrip())
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return sorted([f"IP:{a}" for a in ext.get_values_for_type(x509.IPAddress)]
                  + [f"DNS:{n}" for n in ext.get_values_for_type(x509.DNSName)])


def test_a_secured_broker_on_another_address_is_named_in_its_certificate_and_keeps_its_controller_on_loopback(
        tmp_path: Path) -> None:
    """The one-node Kubernetes cluster's pods reach a secured broker on the node's address (tests/k8s/
    test_pods_secured.py): its certificate must name that address (librdkafka verifies it), and the controller
    listener, PLAINTEXT with ANONYMOUS a super user, must not be on it (a pod could create topics and ACLs)."""
    from sie.infra.kafka.security import SecurityFiles, secure_server_properties

    files = SecurityFiles(tmp_path / "secrets").ensure(["10.217.0.1"])
    assert _san(files.broker_pem) == ["DNS:localhost", "IP:10.217.0.1", "IP:127.0.0.1"]
    ca = files.ca_cert.read_bytes()
    props = secure_server_properties(files, 30000, 30001, "10.217.0.1")
    assert props["listeners"] == "SASL_SSL://10.217.0.1:30000,CONTROLLER://127.0.0.1:30001"
    assert props["advertised.listeners"] == props["listeners"]
    # on loopback again: the broker certificate is issued anew by the same CA (clients keep trusting it)
    files.ensure()
    assert _san(files.broker_pem) == ["DNS:localhost", "IP:127.0.0.1"] and files.ca_cert.read_bytes() == ca
    # three brokers on their own addresses cannot vote over loopback: refused before anything starts
    with pytest.raises(ConfigError, match="controller listener .* on loopback"):
        LocalKafka(Settings(), brokers=3, base_port=30000, data_dir=tmp_path / "three", secure=True,
                   hosts=["10.203.0.10", "10.203.0.11", "10.203.0.12"]).up(timeout=5)
    assert not (tmp_path / "three" / "cluster.json").exists()
