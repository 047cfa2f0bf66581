"""`sie node forget NODE`: remove a node that will not come back from inventory, status and alerts.

A node whose agent stopped stays registered (the compacted ``nodes`` topic keeps its registration): `sie get nodes`
lists it offline and ``SieNodeOffline`` stays pending.  ``forget`` asks the leading control plane to forget it: a
``node_forget_requested`` event; the leader's next pass, if the node is still offline and holds no replica,
tombstones its registration and assignment and publishes ``node_forgotten`` (``Controller._forget_nodes``).  The
control plane also forgets a node by itself after ``control.node_forget_after_s`` offline (default one day).  An
agent started on that node again registers anew.

With ``--control-url`` (``SIE_CONTROL_URL``) the request goes through the API (``POST /v1/nodes/{name}/forget``,
operator role, audited) and the command waits until the node is gone from ``GET /v1/nodes``; without it, it reads
the node's liveness from Kafka and writes the event itself (write access to the events topic).
"""

from __future__ import annotations

import getpass
import socket
import time
from urllib.parse import quote

import click

from sie.kernel.errors import SieError
from sie.kernel.settings import Settings


@click.group("node")
def command() -> None:
    """Operate on a registered node."""


@command.command("forget")
@click.argument("node")
@click.option("--timeout", type=float, default=30.0, show_default=True,
              help="Seconds to wait for Kafka, the API, and (through the API) for the node to be gone.")
@click.option("--control-url", default=None, envvar="SIE_CONTROL_URL",
              help="Go through this control plane's HTTP API instead of Kafka (token: SIE_API_TOKEN).")
@click.pass_obj
def forget(settings: Settings, node: str, timeout: float, control_url: str | None) -> None:
    """Forget NODE (it must be offline): gone from `sie get nodes`, the status and the SieNodeOffline alert."""
    if control_url:
        from sie.commands._api import ControlApi

        api = ControlApi(settings, control_url, timeout=timeout)
        api.request("POST", f"/v1/nodes/{quote(node, safe='')}/forget", "")
        deadline = time.monotonic() + timeout
        while any(n["name"] == node for n in api.get("/v1/nodes")["nodes"]):
            if time.monotonic() > deadline:
                raise SieError(f"node {node!r}: the forget was accepted but the node is still listed after {timeout:g}s; "
                               "is a control plane leading? (`sie describe`, GET /healthz)")
            time.sleep(0.25)
        click.echo(f"forgotten: {node} via {control_url}")
        return

    from sie.commands._runtime import require_kafka
    from sie.commands.cluster import NODE_TIMEOUT_S, nodes_json
    from sie.control.reconcile.records import NODE_FORGET_KIND
    from sie.kernel.clients import KafkaClients, idempotent_producer_config
    from sie.kernel.errors import KafkaUnavailable
    from sie.schemas.avro_codec import encode

    require_kafka(settings)
    views = {n["name"]: n for n in nodes_json(settings, None, timeout)}
    view = views.get(node)
    if view is None:
        raise SieError(f"node {node!r} is not registered on {settings.bootstrap_servers} "
                       f"(nodes: {', '.join(sorted(views)) or 'none'}); `sie get nodes` lists them")
    if view["status"] == "online":
        raise SieError(f"node {node!r} is online (a heartbeat within {NODE_TIMEOUT_S:g}s): stop its agent first; "
                       "only an offline node can be forgotten")
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    topic = settings.names.system_topic("events")
    record = {"ts_ms": int(time.time() * 1000), "kind": NODE_FORGET_KIND, "model": None, "replica_id": None,
              "node": node, "detail": f"forget node {node} requested by {who}"}
    producer = KafkaClients().producer(idempotent_producer_config(settings, settings.names.cli_client_id("node-forget")))
    producer.produce(topic, key=node.encode(), value=encode("ControlEvent", record))
    if producer.flush(timeout):
        raise KafkaUnavailable(f"{topic}: the request was not acknowledged within {timeout:g}s by "
                               f"{settings.bootstrap_servers}; retry")
    click.echo(f"forget requested: {node} (offline); the leading control plane forgets it on its next pass "
               "(`sie get nodes` no longer lists it then)")
