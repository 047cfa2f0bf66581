"""`sie control`: run a control-plane instance in the foreground (leader or standby).

Start several on different machines for high availability: they join one consumer group, the member
holding partition 0 of ``control-leader`` leads, the others keep a warm copy of the state and answer
the HTTP API.  SIGTERM/SIGINT stop cleanly: the instance leaves the group so a standby takes over at
once.  docs/control-plane.md describes the loop, leadership and timings; docs/security.md the API's
tokens, roles and TLS.

The API listens on 127.0.0.1 unless ``--http-host`` says otherwise (an explicit choice: anyone who
can reach the port can try tokens; use TLS, ``SIE_API_TLS_CERT``/``SIE_API_TLS_KEY``, off loopback).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import click

from sie.commands._runtime import configure_logging, require_kafka, stop_on_signals
from sie.kernel.settings import Settings


def awaited_topics(settings: Settings) -> list[str]:
    """The system topics ``sie control --no-ensure-topics`` waits for: the ones it reads (``CONTROL_READS``), which
    are exactly what its principal may describe on a cluster with ACLs.  Not every system topic: ``backfill-plans``
    belongs to backfill jobs, and a control principal holding ``sie acls plan --role control`` never sees it, so
    the chart's control pod waited for it forever on a secured broker."""
    from sie.kernel.acls import CONTROL_READS

    return [settings.names.system_topic(s) for s in CONTROL_READS]


@click.command("control")
@click.option("--http-port", type=int, default=8470, show_default=True, help="HTTP API port (0 = any free port).")
@click.option("--http-host", default="127.0.0.1", show_default=True,
              help="Interface the HTTP API listens on (another address than loopback is an explicit choice).")
@click.option("--instance", "instance_id", default=None, help="Instance id (default: <hostname>-<random>).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="control-plane-config.yaml (scheduling.strategy, control.node_timeout_s ...).")
@click.option("--node-timeout", type=float, default=None, help="Seconds without heartbeat before a node is offline (default 6).")
@click.option("--failure-cooldown", type=float, default=None, help="Seconds a FAILED replica is kept off its node (default 300).")
@click.option("--session-timeout-ms", type=int, default=6000, show_default=True, help="Leader group session timeout.")
@click.option("--no-ensure-topics", is_flag=True,
              help="Do not create missing system topics at start: wait for them (e.g. a Kubernetes Job creates them).")
@click.option("--wait-for-kafka", is_flag=True, envvar="SIE_WAIT_FOR_KAFKA",
              help="Kafka does not answer at start: wait for it (bounded backoff, /readyz says so) instead of exiting "
                   "with one line. The Helm chart sets it.")
@click.option("--health-port", type=click.IntRange(min=0, max=65535), default=None,
              help="Serve /readyz (503 with what it waits for, until its state caught up) and /livez here, on "
                   "SIE_METRICS_BIND, without a token (Kubernetes probes).")
@click.pass_obj
def control(settings: Settings, http_port: int, http_host: str, instance_id: str | None, config_path: Path | None,
            node_timeout: float | None, failure_cooldown: float | None, session_timeout_ms: int,
            no_ensure_topics: bool, wait_for_kafka: bool, health_port: int | None) -> None:
    """Run the control plane: reconcile specs into per-node assignments over Kafka."""
    from sie.control.reconcile.config import ControlConfig
    from sie.control.service import ControlService
    from sie.kernel.admin import ensure_topics
    from sie.kernel.startup import Readiness, serve_readiness
    from sie.kernel.startup import wait_for_kafka as wait_for
    from sie.kernel.topics import system_topics

    if not wait_for_kafka:
        require_kafka(settings)  # one line within seconds if Kafka does not answer (logs start after it)
    configure_logging("info")
    readiness = Readiness("control")
    service: ControlService | None = None

    def _ready() -> tuple[bool, str]:
        if service is None or not service.feeder.caught_up.is_set():
            return False, "the state feeder to read the control topics to their end"
        return True, f"serving ({'leader' if service.elector.is_leader else 'standby'})"

    if health_port is not None:
        bound = serve_readiness(readiness, settings.metrics_bind, health_port, check=_ready)
        click.echo(f"sie control: /readyz and /livez on {settings.metrics_bind}:{bound}", err=True)
    # started before Kafka or its topics (every pod of a release starts at once): wait with bounded backoff,
    # saying what for (log, /readyz), instead of exiting
    stopped = stop_on_signals("stopping")
    topics = [] if not no_ensure_topics else awaited_topics(settings)
    if not wait_for(settings, topics, readiness, stopped):
        return
    overrides: dict[str, Any] = {"node_timeout_s": node_timeout, "failure_cooldown_s": failure_cooldown}
    if config_path is not None:
        config = ControlConfig.from_yaml(config_path, **overrides)
    else:
        config = ControlConfig(**{k: v for k, v in overrides.items() if v is not None})
    if not no_ensure_topics:
        ensure_topics(settings, system_topics(settings.topic_prefix))
    service = running = ControlService(settings, config, instance_id=instance_id, http_port=http_port,
                                       http_host=http_host, session_timeout_ms=session_timeout_ms)
    readiness.set_ready()  # from here /readyz asks _ready(): has the state caught up?

    def _stop(signum: int, _frame: object) -> None:
        running._stop.set()  # noqa: SLF001 - wake wait(); stop() runs below on the main thread

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if stopped.is_set():  # a signal while the service was being built
        return
    import ipaddress

    try:
        loopback = ipaddress.ip_address(http_host).is_loopback
    except ValueError:
        loopback = http_host == "localhost"
    if not loopback and settings.api_tls_cert is None:
        click.echo(f"warning: the control API listens on {http_host} without TLS: bearer tokens cross the network "
                   "in clear text; set SIE_API_TLS_CERT and SIE_API_TLS_KEY", err=True)
    service.start()
    scheme = service.http.scheme if service.http is not None else "http"
    click.echo(f"sie control {service.instance_id}: {scheme} on {http_host}:{service.http_port}, "
               f"group {settings.names.control_group}", err=True)
    if settings.api_token_file.is_file():
        click.echo(f"  local operator token: {settings.api_token_file} (the CLI reads it when SIE_API_TOKEN is unset)",
                   err=True)
    try:
        service.wait()
    finally:
        service.stop()


command = control
