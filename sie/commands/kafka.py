"""``sie kafka up|down|status``: a real Kafka cluster on 127.0.0.1 for development and tests."""

from __future__ import annotations

from pathlib import Path

import click

from sie.kernel.errors import KafkaUnavailable
from sie.kernel.settings import Settings

_DATA_DIR = click.option(
    "--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Broker data, logs and state file [default: SIE_KAFKA_DATA_DIR, else <SIE_CACHE_DIR>/kafka-run, i.e. ~/.cache/sie/kafka-run].",
)


def _local(settings: Settings, data_dir: Path | None, **kwargs: object):  # noqa: ANN202 - lazy import
    from sie.infra.kafka.local import LocalKafka

    return LocalKafka(settings, data_dir=data_dir, echo=click.echo, **kwargs)  # type: ignore[arg-type]


@click.group("kafka")
def command() -> None:
    """Run Apache Kafka (KRaft) locally from Maven Central jars (Java 17 + Maven needed once)."""


@command.command("fetch")
@click.pass_obj
def fetch(settings: Settings) -> None:
    """Download the broker jars from Maven Central (once per machine; skipped when present)."""
    from sie.infra.kafka.fetch import ensure_jars, jars_present

    if jars_present(settings):
        click.echo(f"Apache Kafka {settings.kafka_version} already fetched")
    lib = ensure_jars(settings, echo=click.echo)
    click.echo(f"jars: {lib}")


@command.command("up")
@click.option("--brokers", type=click.Choice(["1", "3"]), default="1", show_default=True,
              help="1 combined node, or 3 nodes (rf 3 / min ISR 2 internal topics).")
@click.option("--base-port", type=int, default=9092, show_default=True,
              help="Node i listens on base+2(i-1) (clients) and base+2(i-1)+1 (controller).")
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Seconds to wait for the cluster.")
@click.option("--secure", is_flag=True,
              help="SASL_SSL (SCRAM-SHA-512) + TLS with a local CA, ACLs enforced (StandardAuthorizer, nothing allowed "
                   "without an ACL), and one SCRAM user per SIE role; see docs/security.md.")
@_DATA_DIR
@click.pass_obj
def up(settings: Settings, brokers: str, base_port: int, timeout: float, secure: bool, data_dir: Path | None) -> None:
    """Start the cluster in the background (no-op if it already runs); print the bootstrap servers."""
    kafka = _local(settings, data_dir, brokers=int(brokers), base_port=base_port, secure=secure)
    bootstrap = kafka.up(timeout=timeout)
    click.echo(f"bootstrap servers: {bootstrap}")
    if kafka.secure:
        _print_secure_usage(kafka)


def _print_secure_usage(kafka) -> None:  # noqa: ANN001 - LocalKafka, imported lazily
    """How to connect as the admin or as a role (paths only: no password is ever printed)."""
    from sie.infra.kafka.security import ADMIN, USERS

    click.echo(f"secured: SASL_SSL, SCRAM-SHA-512, ACLs enforced; CA {kafka.security.ca_cert}")
    click.echo("connect as the admin (super user):")
    # the bootstrap first: without it a pasted block talks to the default 127.0.0.1:9092 (a dev broker?)
    for key, value in {"SIE_BOOTSTRAP_SERVERS": kafka.bootstrap_servers, **kafka.security.client_env(ADMIN)}.items():
        click.echo(f"  export {key}={value}")
    click.echo(f"other users ({', '.join(u for u in USERS if u != ADMIN)}): the same with SIE_SASL_USERNAME and "
               f"SIE_SASL_PASSWORD_FILE={kafka.security.password_file('<user>')}; grant their ACLs with "
               "`sie acls apply --role ROLE --principal USER` as the admin")


@command.command("down")
@click.option("--wipe", is_flag=True, help="Also delete the data dir (topics, offsets, logs).")
@_DATA_DIR
@click.pass_obj
def down(settings: Settings, wipe: bool, data_dir: Path | None) -> None:
    """Stop every broker of the cluster in the data dir."""
    kafka = _local(settings, data_dir)
    stopped = kafka.down(wipe=wipe)
    click.echo(f"stopped node(s) {stopped}" if stopped else f"no broker was running in {kafka.data_dir}")
    if wipe:
        click.echo(f"deleted {kafka.data_dir}")


@command.command("status")
@_DATA_DIR
@click.pass_obj
def status(settings: Settings, data_dir: Path | None) -> None:
    """Print bootstrap servers, pids and whether each broker answers; exit 1 if not all answer."""
    report = _local(settings, data_dir).status()
    if not report["nodes"]:
        raise KafkaUnavailable(f"no local cluster in {report['data_dir']}: run `sie kafka up`")
    click.echo(f"bootstrap servers: {report['bootstrap_servers']}")
    click.echo(f"data dir: {report['data_dir']}  kafka {report['kafka_version']}  cluster id {report['cluster_id']}")
    if report.get("secure"):
        click.echo(f"secured: SASL_SSL + SCRAM-SHA-512, ACLs enforced; credentials in {report['secrets_dir']} (mode 0600)")
    for node in report["nodes"]:
        state = "answers" if node["answers"] else ("running, not answering" if node["alive"] else "down")
        click.echo(f"  node {node['node_id']}  port {node['port']}  pid {node['pid'] or '-'}  {state}")
    if not report["running"]:
        raise KafkaUnavailable(f"cluster {report['bootstrap_servers']} is not fully up: run `sie kafka up`")
