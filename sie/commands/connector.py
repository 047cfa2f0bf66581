"""`sie connector apply|get|describe|pause|resume|delete`: CDC connectors run by the cluster's agents.

Through a control plane's HTTP API (``--control-url`` / ``SIE_CONTROL_URL``, default the local one on
port 8470, token ``SIE_API_TOKEN``): the control plane validates the connector, stores it on the
compacted connectors topic, places one CPU-only replica for it, and an agent runs its exactly-once CDC
stage (``sie.connectors.worker``).  ``pause`` drains that replica (its stage commits its batch; the
committed offsets stay), ``resume`` starts it again from them.  ``sie cdc run`` still runs a stage by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click

from sie.kernel.settings import Settings

_URL = click.option("--control-url", default="http://127.0.0.1:8470", show_default=True, envvar="SIE_CONTROL_URL",
                    help="The control plane's HTTP API (token: SIE_API_TOKEN).")
_OUT = click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
_TIMEOUT = click.option("--timeout", type=float, default=20.0, show_default=True, help="Seconds to wait for the API.")


def _api(settings: Settings, url: str, timeout: float) -> Any:
    from sie.commands._api import ControlApi

    return ControlApi(settings, url, timeout=timeout)


def _path(name: str, action: str = "") -> str:
    return f"/v1/connectors/{quote(name, safe='')}" + (f"/{action}" if action else "")


@click.group("connector")
def command() -> None:
    """CDC connectors run by the cluster (apply, get, describe, pause, resume, delete)."""


@command.command("apply")
@click.option("-f", "--file", "file", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="CDC connector spec (YAML; kind: CdcConnector or the flat form of `sie cdc run`).")
@_URL
@_TIMEOUT
@click.pass_obj
def apply(settings: Settings, file: Path, control_url: str, timeout: float) -> None:
    """Apply a connector: validated by the control plane, then run by an agent (a paused one stays paused)."""
    from sie.commands._api import ApiRefused
    from sie.connectors.cdc import load_connector_spec
    from sie.kernel.errors import SpecError

    load_connector_spec(file)  # the file's own problems, named here before anything is sent
    try:
        answer = _api(settings, control_url, timeout).request("POST", "/v1/connectors", file.read_text("utf-8"))
    except ApiRefused as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        details = [f"  {e.get('field')}: {e.get('reason')}" for e in body.get("errors", [])]
        raise SpecError("\n".join([str(exc), *details])) from None
    click.echo(f"applied: connector {answer['name']}" + (" (paused)" if answer.get("paused") else "")
               + f" via {control_url}")


@command.command("get")
@_OUT
@_URL
@_TIMEOUT
@click.pass_obj
def get(settings: Settings, output: str, control_url: str, timeout: float) -> None:
    """Every connector with its phase and where its replica runs."""
    items = _api(settings, control_url, timeout).get("/v1/connectors")["connectors"]
    if output == "json":
        click.echo(json.dumps(items, indent=2))
        return
    rows = [("NAME", "FORMAT", "SOURCE", "MODEL", "PHASE", "NODE", "REASON")]
    for c in items:
        spec = c.get("spec") or {}
        nodes = ",".join(r["node"] for r in c.get("replicas", []) if r.get("node")) or "-"
        rows.append((c["name"], spec.get("format", "-"), spec.get("source_topic", "-"), spec.get("model", "-"),
                     c.get("phase", "-"), nodes, (c.get("reason") or "")[:80]))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip())
    if not items:
        click.echo("(no connectors applied)")


@command.command("describe")
@click.argument("name")
@_OUT
@_URL
@_TIMEOUT
@click.pass_obj
def describe(settings: Settings, name: str, output: str, control_url: str, timeout: float) -> None:
    """One connector: phase, replica, source offsets committed and lag per partition."""
    c = _api(settings, control_url, timeout).get(_path(name))
    if output == "json":
        click.echo(json.dumps(c, indent=2))
        return
    spec = c.get("spec") or {}
    click.echo(f"Connector: {c['name']}")
    click.echo(f"Phase:     {c.get('phase')}" + (f" ({c['reason']})" if c.get("reason") else ""))
    click.echo(f"Paused:    {'yes' if c.get('paused') else 'no'}")
    click.echo(f"Source:    {spec.get('format')} {spec.get('source_topic')} (tables {', '.join(spec.get('tables', []))})")
    click.echo(f"Model:     {spec.get('model')}" + (f" (requests {spec['request_topic']})" if spec.get("request_topic") else ""))
    for r in c.get("replicas", []):
        click.echo(f"Replica:   {r['replica_id']} on {r.get('node') or '-'}: {r['state']}"
                   + (f" ({r['reason']})" if r.get("reason") else "") + f", restarts {r.get('restarts', 0)}")
    offsets = c.get("offsets") or {}
    if offsets.get("error"):
        click.echo(f"Offsets:   {offsets['error']}")
    elif offsets:
        click.echo(f"Offsets:   group {offsets.get('group')}, lag {offsets.get('lag')}")
        for p in offsets.get("partitions", []):
            committed = "-" if p.get("committed") is None else p["committed"]
            click.echo(f"  partition {p['partition']}: committed {committed}, end {p['end']}, lag {p['lag']}")


def _action(settings: Settings, name: str, control_url: str, timeout: float, action: str) -> None:
    _api(settings, control_url, timeout).request("POST", _path(name, action))
    click.echo(f"{action}d: connector {name} via {control_url}")


@command.command("pause")
@click.argument("name")
@_URL
@_TIMEOUT
@click.pass_obj
def pause(settings: Settings, name: str, control_url: str, timeout: float) -> None:
    """Pause: the replica drains (its stage commits its batch); offsets stay committed."""
    _action(settings, name, control_url, timeout, "pause")


@command.command("resume")
@click.argument("name")
@_URL
@_TIMEOUT
@click.pass_obj
def resume(settings: Settings, name: str, control_url: str, timeout: float) -> None:
    """Resume a paused connector from its committed offsets."""
    _action(settings, name, control_url, timeout, "resume")


@command.command("delete")
@click.argument("name")
@_URL
@_TIMEOUT
@click.pass_obj
def delete(settings: Settings, name: str, control_url: str, timeout: float) -> None:
    """Delete a connector (its replica drains; its group's offsets stay on Kafka)."""
    _api(settings, control_url, timeout).request("DELETE", _path(name))
    click.echo(f"deleted: connector {name} via {control_url}")
