"""`sie logs REPLICA`: the worker log of a replica run by an agent on THIS machine.

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


def find_worker_logs(work_dir: Path, replica: str, node: str | None) -> list[Path]:
    nodes = [work_dir / node] if node else sorted(p for p in work_dir.glob("*") if p.is_dir())
    return [n / replica / "worker.log" for n in nodes if (n / replica / "worker.log").is_file()]


@click.command("logs")
@click.argument("replica")
@click.option("--node", help="The agent's node name, when several agents ran it on this machine [default: the one "
                             "that wrote its log last].")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path),
              help="The agent's --work-dir [default: <SIE_CACHE_DIR>/agent].")
@click.option("-n", "--lines", "count", type=click.IntRange(min=0), default=100, show_default=True)
@click.option("-f", "--follow", is_flag=True, help="Keep printing what the worker appends until Ctrl-C.")
@click.pass_obj
def command(settings: Settings, replica: str, node: str | None, work_dir: Path | None, count: int,
            follow: bool) -> None:
    """Print the worker log of REPLICA (e.g. fraud-scorer-0) from an agent on this machine."""
    root = work_dir or settings.cache_dir / "agent"
    found = find_worker_logs(root, replica, node)
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
