"""``sie rollout status|pause|resume|promote|abort MODEL`` and ``sie get rollouts``: a model's rollout.

Reads (``status``, ``get rollouts``) go through the control API with ``--control-url`` (``SIE_CONTROL_URL``),
else straight to the compacted rollouts topic.  Writes always go through the control API: the leading
control plane is the one writer of rollout state (a standby answers 503 naming the leader).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import click

from sie.commands._runtime import require_kafka
from sie.commands.spec import get
from sie.kernel.errors import SieError
from sie.kernel.settings import Settings

_URL = click.option("--control-url", default=None, envvar="SIE_CONTROL_URL",
                    help="The control plane's HTTP API (token: SIE_API_TOKEN); needed for pause/resume/promote/abort.")
_TIMEOUT = click.option("--timeout", type=float, default=30.0, show_default=True)


def _rollouts(settings: Settings, control_url: str | None, timeout: float) -> list[dict[str, Any]]:
    if control_url:
        from sie.commands._api import ControlApi

        return list(ControlApi(settings, control_url, timeout=timeout).get("/v1/rollouts")["rollouts"])
    from sie.control.rollout.driver import Entry, read_rollouts
    from sie.control.rollout.service import describe

    require_kafka(settings)
    return [describe(Entry.from_record(r)) for r in read_rollouts(settings, timeout_s=timeout)]


def _table(rows: list[dict[str, Any]]) -> None:
    table = [("MODEL", "FROM", "TO", "PHASE", "CANARY", "EPOCH", "REASON")]
    for r in rows:
        table.append((r["model"], r["stable_version"], r["canary_version"], r["label"], f"{r['weight_percent']:g}%",
                      str(r["epoch"]), r["reason"][:80]))
    widths = [max(len(str(row[i])) for row in table) for i in range(len(table[0]))]
    for row in table:
        click.echo("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    if not rows:
        click.echo("(no rollouts)")


@get.command("rollouts")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@_TIMEOUT
@_URL
@click.pass_obj
def get_rollouts(settings: Settings, output: str, timeout: float, control_url: str | None) -> None:
    """Every model's rollout: versions, phase, canary weight, epoch."""
    rows = _rollouts(settings, control_url, timeout)
    if output == "json":
        click.echo(json.dumps(rows, indent=2))
    else:
        _table(rows)


@click.group("rollout")
def rollout() -> None:
    """A model's rollout (started by applying a new version whose spec has a ``rollout`` block)."""


@rollout.command("status")
@click.argument("model")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@_TIMEOUT
@_URL
@click.pass_obj
def status(settings: Settings, model: str, output: str, timeout: float, control_url: str | None) -> None:
    """The rollout's phase, weight and its step-by-step timeline."""
    found = [r for r in _rollouts(settings, control_url, timeout) if r["model"] == model]
    if not found:
        raise SieError(f"model {model!r} has no rollout (sie get rollouts lists them)")
    r = found[0]
    if output == "json":
        click.echo(json.dumps(r, indent=2))
        return
    for line in status_lines(r, time.time()):
        click.echo(line)


def utc_iso(ms: int) -> str:
    """Epoch milliseconds as UTC ISO-8601 to the millisecond: ``2026-12-01T10:00:31.750Z``."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def status_lines(r: dict[str, Any], now: float) -> list[str]:
    """``sie rollout status`` for one rollout (``describe``'s document): a header, when it started and how
    long ago (``now``: epoch seconds), then the timeline, each transition at its UTC time and seconds after
    the start (the ``-o json`` form keeps the epoch milliseconds)."""
    started = r.get("started_ms") or (r["events"][0]["at_ms"] if r["events"] else None)
    lines = [f"{r['model']}: {r['stable_version']} -> {r['canary_version']}  {r['label']}  "
             f"canary {r['weight_percent']:g}%  epoch {r['epoch']}"]
    if started:
        lines.append(f"  started {utc_iso(started)} ({max(0.0, now - started / 1000):.0f}s ago)")
    for e in r["events"]:
        since = f"+{(e['at_ms'] - started) / 1000:.1f}s" if started else ""
        lines.append(f"  {utc_iso(e['at_ms'])} {since:>9}  {e['from']:>11} -> {e['to']:<11} "
                     f"{e['weight_bp'] / 100:>5g}%  {e['reason']}")
    return lines


def _action(name: str, doc: str) -> click.Command:
    @click.argument("model")
    @_TIMEOUT
    @_URL
    @click.pass_obj
    def run(settings: Settings, model: str, timeout: float, control_url: str | None) -> None:
        if not control_url:
            raise SieError(f"sie rollout {name} goes through the leading control plane: pass --control-url "
                           "(or set SIE_CONTROL_URL)")
        from sie.commands._api import ControlApi

        body = ControlApi(settings, control_url, timeout=timeout).request(
            "POST", f"/v1/rollouts/{quote(model, safe='')}/{name}")
        click.echo(f"{model}: {body['label']} (canary {body['weight_percent']:g}%, epoch {body['epoch']})")

    run.__doc__ = doc
    return rollout.command(name)(run)


for _name, _doc in (("pause", "Hold the rollout at its current weight (time stops counting)."),
                    ("resume", "Continue a paused rollout (the step's interval starts again)."),
                    ("promote", "Skip the remaining steps: all traffic to the new version now."),
                    ("abort", "All traffic back to the stable version now; the new version is stopped.")):
    _action(_name, _doc)

command = rollout
commands = (rollout,)
