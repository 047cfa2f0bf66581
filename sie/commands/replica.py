"""`sie replica reset NAME`: end a replica's cool-down after a fix, without waiting it out.

A replica that FAILED on a node (crashed ``--max-crashes`` times) is kept off that node for the control
plane's ``failure_cooldown_s`` (300 s).  A re-applied spec or a new version ends it by itself; this command
ends it by hand: it publishes a ``cooldown_reset_requested`` ControlEvent (key = model) on the events topic,
which every control-plane instance reads; the leader clears the cool-downs that began before it and the
replica is placed again on its next pass (``cooldown_cleared`` event).  NAME is a replica id
(``<model>-<index>``, see `sie get replicas`) or a model name (every replica of it).
"""

from __future__ import annotations

import getpass
import socket
import time

import click

from sie.kernel.errors import SieError
from sie.kernel.settings import Settings


def _describe_cooldowns(replica: dict) -> list[str]:
    now_ms = time.time() * 1000
    return [f"kept off {c['node']} for {max(0.0, (c['until_ms'] - now_ms) / 1000):.0f}s more: {c['reason']}"
            for c in replica.get("cooldowns") or ()]


@click.group("replica")
def command() -> None:
    """Operate on one replica of a model."""


@command.command("reset")
@click.argument("name")
@click.option("--timeout", type=float, default=20.0, show_default=True, help="Seconds to read Kafka.")
@click.pass_obj
def reset(settings: Settings, name: str, timeout: float) -> None:
    """End the cool-down of replica NAME (or of every replica of model NAME) so it is placed again now."""
    from sie.commands._runtime import require_kafka
    from sie.commands.cluster import statuses_json
    from sie.control.reconcile.records import COOLDOWN_RESET_KIND
    from sie.kernel.clients import KafkaClients, idempotent_producer_config
    from sie.schemas.avro_codec import encode

    require_kafka(settings)
    models, state = statuses_json(settings, None, timeout)
    replicas = {r["replica_id"]: r for m in models for r in m.get("replicas") or ()}
    if name in replicas:
        targets = [replicas[name]]
    else:
        targets = [r for r in replicas.values() if r["model"] == name]
    if not targets:
        known = ", ".join(sorted(replicas)) or "none"
        raise SieError(f"replica {name!r}: not a replica or model the control plane reports (replicas: {known}); "
                       f"`sie get replicas` lists them")
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    producer = KafkaClients().producer(idempotent_producer_config(settings, settings.names.cli_client_id("replica-reset")))
    topic = settings.names.system_topic("events")
    now_ms = int(time.time() * 1000)
    for r in targets:
        record = {"ts_ms": now_ms, "kind": COOLDOWN_RESET_KIND, "model": r["model"], "replica_id": r["replica_id"],
                  "node": None, "detail": f"cool-down reset of {r['replica_id']} requested by {who}"}
        producer.produce(topic, key=r["model"].encode(), value=encode("ControlEvent", record))
    if producer.flush(timeout):
        from sie.kernel.errors import KafkaUnavailable

        raise KafkaUnavailable(f"{topic}: the reset was not acknowledged within {timeout:g}s by "
                               f"{settings.bootstrap_servers}; retry")
    for r in targets:
        lines = _describe_cooldowns(r)
        click.echo(f"reset: {r['replica_id']}" + (f" ({'; '.join(lines)})" if lines else
                                                  " (no cool-down reported; the reset is recorded anyway)"))
    click.echo("the leading control plane places it again on its next pass (`sie describe model "
               f"{targets[0]['model']}` shows it)")
