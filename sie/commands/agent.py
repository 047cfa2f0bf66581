"""`sie agent --node NAME`: run the node agent in the foreground.

Registers this node's inventory, follows the node's assignment on Kafka, runs
one worker process per assigned replica (each the same exactly-once scorer as
`sie score`), heartbeats, and drains every worker on SIGTERM/SIGINT.
"""

from __future__ import annotations

from pathlib import Path

import click

from sie.commands._runtime import configure_logging, require_kafka, stop_on_signals
from sie.kernel.settings import Settings


def _parse_labels(text: str | None) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not key=value (e.g. --labels zone=a,gpu=a100)", param_hint="--labels")
        labels[key.strip()] = value.strip()
    return labels


@click.command("agent")
@click.option("--node", required=True, help="Node name: the key of this node's records on Kafka (stable across restarts).")
@click.option("--labels", help="Node labels for spec.scheduling.nodeSelector, e.g. zone=a,disk=ssd.")
@click.option("--tier", help="Node pool tier, e.g. tier-0 (only P0 models are placed there).")
@click.option("--simulate-gpus", help="Pretend to have these GPUs, e.g. 2xA100-80GB (marked simulated).")
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535),
              help="Serve Prometheus /metrics here (0 = any free port; the log line at start names the one bound).")
@click.option("--wait-for-kafka", is_flag=True, envvar="SIE_WAIT_FOR_KAFKA",
              help="Kafka does not answer at start: wait for it (bounded backoff, /readyz says so) instead of exiting "
                   "with one line. Missing topics are always waited for. The Helm chart sets it.")
@click.option("--health-port", type=click.IntRange(min=0, max=65535), default=None,
              help="Serve /readyz (503 with what the agent waits for, until it follows its assignments) and /livez "
                   "here, on SIE_METRICS_BIND (Kubernetes probes).")
@click.option("--worker-metrics-ports", default="0", show_default=True,
              help="Prometheus /metrics ports of the workers: 0 = any free port, A-B = one of that range, off = none. "
                   "Each is advertised in the heartbeat (the control plane's /v1/prometheus/targets lists them).")
@click.option("--heartbeat-s", type=click.FloatRange(min=0.1), default=2.0, show_default=True, help="Heartbeat interval.")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where worker specs and logs go, in <dir>/<node>/ [default: <SIE_CACHE_DIR>/agent, i.e. ~/.cache/sie/agent].")
@click.option("--max-crashes", type=click.IntRange(min=1), default=3, show_default=True,
              help="Crashes within --crash-window-s that mark a replica FAILED.")
@click.option("--crash-window-s", type=click.FloatRange(min=1), default=300.0, show_default=True)
@click.option("--backoff-max-s", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Cap of the restart backoff (1 s, 2 s, 4 s, ...).")
@click.option("--startup-timeout-s", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="Time a worker gets to pass its readiness inference.")
@click.option("--liveness-timeout-s", type=click.FloatRange(min=1), default=30.0, show_default=True,
              help="A READY worker silent this long is hung: killed and restarted.")
@click.option("--drain-grace-s", type=click.FloatRange(min=0), default=15.0, show_default=True,
              help="SIGTERM -> SIGKILL escalation when a worker is drained.")
@click.option("--warm-pool", type=click.IntRange(min=0), default=0, show_default=True,
              help="Workers kept started with the runtime imported; a replica start takes one (docs/elasticity.md).")
@click.option("--worker-uid", type=click.IntRange(min=1),
              help="Run the workers as this unprivileged uid (SIE_WORKER_UID): model code cannot read the agent's "
                   "files, its Kafka password among them (needs CAP_SETUID, CAP_SETGID, CAP_CHOWN; docs/security.md).")
@click.option("--worker-gid", type=click.IntRange(min=1), help="The workers' gid with --worker-uid [default: the uid].")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info", show_default=True)
@click.pass_obj
def command(settings: Settings, node: str, labels: str | None, tier: str | None, simulate_gpus: str | None,
            metrics_port: int | None, wait_for_kafka: bool, health_port: int | None, worker_metrics_ports: str, heartbeat_s: float, work_dir: Path | None, max_crashes: int,
            crash_window_s: float, backoff_max_s: float, startup_timeout_s: float, liveness_timeout_s: float,
            drain_grace_s: float, warm_pool: int, worker_uid: int | None, worker_gid: int | None,
            log_level: str) -> None:
    """Run the node agent for NODE until SIGTERM/SIGINT (which drains its workers).

    Killing the agent with SIGKILL kills its workers too (PR_SET_PDEATHSIG): that
    is how a lost node looks; a restarted agent starts them again from the assignment.
    """
    from sie.workers.agent import Agent, AgentConfig
    from sie.workers.gpu import parse_simulated_gpus
    from sie.workers.supervisor import SupervisorPolicy

    settings = settings.with_overrides(worker_uid=worker_uid, worker_gid=worker_gid)
    from sie.workers.worker_user import WorkerUser, check_can_switch

    user = WorkerUser.from_settings(settings)
    if user is not None:
        check_can_switch(user)  # ConfigError now (one line naming the capabilities), not after Kafka answers
    if simulate_gpus:
        parse_simulated_gpus(simulate_gpus, node=node)  # ConfigError now, not in the loop
    from sie.workers.agent.launch import MetricsPorts

    MetricsPorts(worker_metrics_ports)  # ConfigError now, not at the first launch
    policy = SupervisorPolicy(
        backoff_max_s=backoff_max_s, max_crashes=max_crashes, crash_window_s=crash_window_s,
        startup_timeout_s=startup_timeout_s, liveness_timeout_s=liveness_timeout_s, drain_grace_s=drain_grace_s,
    )
    config = AgentConfig(
        node=node, labels=_parse_labels(labels), tier=tier, simulate_gpus=simulate_gpus, heartbeat_s=heartbeat_s,
        metrics_port=metrics_port, worker_metrics_ports=worker_metrics_ports, policy=policy, warm_pool=warm_pool,
        work_dir=work_dir,
    )
    if not wait_for_kafka:
        require_kafka(settings)  # one line within seconds, not a KafkaException traceback (logs start after it)
    # topics not there yet (every pod of a release starts at once; `sie topics ensure` runs in a Job): the
    # agent waits for them with bounded backoff and says what it waits for (log, /readyz) instead of exiting
    configure_logging(log_level)
    stop = stop_on_signals("draining workers")
    agent = Agent(config, settings)
    if health_port is not None:
        from sie.kernel.startup import serve_readiness

        bound = serve_readiness(agent.readiness, settings.metrics_bind, health_port)
        click.echo(f"agent {node}: /readyz and /livez on {settings.metrics_bind}:{bound}", err=True)
    agent.run(stop)
    click.echo(f"agent {node} stopped")
