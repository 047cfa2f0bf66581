"""`sie logs REPLICA`: a replica's worker log, from anywhere through the control API, or on the agent's machine.

With ``--control-url`` (``SIE_CONTROL_URL``) the control plane proxies it from the agent of the replica's node
(``GET /v1/replicas/{id}/log``; the agent serves it on its ``--metrics-port`` behind an API token,
``sie.workers.agent.http``), like ``kubectl logs``: no shell on that node, no access to its files.  ``--previous``:
the log of the process before the replica's last (re)start.

Without it, the log is read on THIS machine:

The agent writes each replica's worker output to ``<work dir>/<node>/<replica>/worker.log`` (``sie agent
--work-dir``, default ``<SIE_CACHE_DIR>/agent``), next to the spec file it ran with.  This prints its last
lines (``--follow``: and what is appended, until Ctrl-C).

A replica the control plane moved between nodes of this machine (several agents, e.g. the demo's) has a
log under each: the one written last is the node that runs it now (or ran it last), and it is shown, with a
line on stderr naming that node and the others (``--node`` picks one).
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path

import click

from sie.kernel.errors import SieError
from sie.kernel.settings import Settings


def find_worker_logs(work_dir: Path, replica: str, node: str | None, name: str = "worker.log") -> list[Path]:
    nodes = [work_dir / node] if node else sorted(p for p in work_dir.glob("*") if p.is_dir())
    return [n / replica / name for n in nodes if (n / replica / name).is_file()]


def _through_api(settings: Settings, url: str, replica: str, count: int, follow: bool, previous: bool) -> None:
    """Stream ``GET /v1/replicas/{id}/log`` to stdout (the same token rules as every API call, ``ControlApi``)."""
    from urllib.parse import quote

    import httpx

    from sie.commands._api import ControlApi

    api = ControlApi(settings, url)  # SieError before anything is sent where the token must not go
    verify, extensions = api.client_options()
    params = {"lines": str(count), "follow": str(follow).lower(), "previous": str(previous).lower()}
    path = f"/v1/replicas/{quote(replica, safe='')}/log"
    try:
        with httpx.Client(verify=verify, timeout=httpx.Timeout(20.0, read=None if follow else 60.0),
                          follow_redirects=False) as client, \
                client.stream("GET", api.url + path, params=params, headers=api._headers(),
                              extensions=extensions) as response:
            if response.status_code != 200:
                response.read()
                try:
                    reason = response.json().get("error")
                except ValueError:
                    reason = response.text[:200]
                raise SieError(f"control plane {api.url}: GET {path} -> {response.status_code}: {reason}")
            for text in response.iter_text():
                click.echo(text, nl=False)
    except httpx.HTTPError as exc:
        raise SieError(f"control plane {api.url} did not answer GET {path} ({type(exc).__name__}: {exc}); check "
                       "--control-url / SIE_CONTROL_URL") from None
    except KeyboardInterrupt:
        return


@click.command("logs")
@click.argument("replica")
@click.option("--node", help="The agent's node name, when several agents ran it on this machine [default: the one "
                             "that wrote its log last].")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path),
              help="The agent's --work-dir [default: <SIE_CACHE_DIR>/agent].")
@click.option("-n", "--lines", "count", type=click.IntRange(min=0), default=100, show_default=True)
@click.option("-f", "--follow", is_flag=True, help="Keep printing what the worker appends until Ctrl-C.")
@click.option("-p", "--previous", is_flag=True, help="The log of the process before the replica's last (re)start.")
@click.option("--control-url", default=None, envvar="SIE_CONTROL_URL",
              help="Read it through this control plane's API, from the agent of the replica's node (token: "
                   "SIE_API_TOKEN).")
@click.pass_obj
def command(settings: Settings, replica: str, node: str | None, work_dir: Path | None, count: int,
            follow: bool, previous: bool, control_url: str | None) -> None:
    """Print the worker log of REPLICA (e.g. fraud-scorer-0): through the control API (--control-url) from its
    node's agent, or from an agent on this machine."""
    if control_url:
        if node or work_dir:
            raise click.UsageError("--node and --work-dir read this machine's files; the API finds the node itself")
        _through_api(settings, control_url, replica, count, follow, previous)
        return
    root = work_dir or settings.cache_dir / "agent"
    found = find_worker_logs(root, replica, node, "worker.previous.log" if previous else "worker.log")
    if not found:
        here = sorted({p.parent.name for p in root.glob("*/*/worker.log")}) if root.is_dir() else []
        raise SieError(f"no worker log of replica {replica!r} under {root}" + (f" (node {node})" if node else "")
                       + f"; replicas with logs here: {', '.join(here) or 'none'} (a replica's log is on the "
                         f"machine of the agent that ran it: `sie get replicas` shows the node)")
    path = max(found, key=lambda p: p.stat().st_mtime)  # the node that runs it now, or ran it last
    if len(found) > 1:
        others = ", ".join(sorted(p.parent.parent.name for p in found if p != path))
        ago = max(0.0, time.time() - path.stat().st_mtime)
        click.echo(f"(node {path.parent.parent.name}: the log written last, {ago:.0f}s ago, of the nodes that ran "
                   f"{replica} here; also {others}: --node NAME)", err=True)
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        for line in deque(fh, maxlen=count) if count else ():
            click.echo(line.rstrip("\n"))
        if not follow:
            return
        try:
            while True:
                line = fh.readline()
                if line:
                    click.echo(line.rstrip("\n"))
                else:
                    time.sleep(0.5)  # tail -f pacing, not synchronisation
        except KeyboardInterrupt:
            return
