"""`sie dlq redrive --model M [--reason R] [--since T]`: dead letters back to the request topic, exactly once.

The library is ``sie.connectors.redrive`` (docstring: the per-(model, reason) group whose committed offsets
mark what was redriven, the ``sie.redrive.of`` header).  Run it after the fix is applied (a new version that
scores what the old one dead-lettered); it stops at the end the dead-letter topic had when it started.
Exit codes: 0 done; 3 stopped (SIGTERM/SIGINT) before the end, run it again to go on; 1 error.
"""

from __future__ import annotations

from pathlib import Path

import click

from sie.kernel.settings import Settings


@click.group("dlq")
def command() -> None:
    """A model's dead letters (`sie tail dlq` shows them)."""


@command.command("redrive")
@click.option("--model", help="Name of an applied model (its topics are read from its spec on the cluster).")
@click.option("--spec", "spec_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Take the topics from this spec file instead.")
@click.option("--reason", "reasons", multiple=True,
              help="Only dead letters of this reason (repeatable; default: every reason), e.g. output_violation.")
@click.option("--since", help="Only dead letters written at or after this time (ISO-8601 or epoch ms); older "
                              "ones of the chosen reasons are passed over for good.")
@click.option("--max-batch", type=click.IntRange(min=1), default=500, show_default=True,
              help="Dead letters per transaction.")
@click.pass_obj
def redrive(settings: Settings, model: str | None, spec_file: Path | None, reasons: tuple[str, ...],
            since: str | None, max_batch: int) -> None:
    """Send a model's dead letters back to its request topic to be scored again: each once, exactly once."""
    from sie.commands._runtime import EXIT_INTERRUPTED, require_kafka, stop_on_signals
    from sie.commands.produce import resolve_spec
    from sie.connectors.backfill_plan import BoundKind, parse_bound
    from sie.connectors.redrive import Redrive, RedriveConfig
    from sie.schemas.request import DLQ_REASONS

    since_ms = None
    if since is not None:
        bound = parse_bound(since, "--since")
        if bound.kind is not BoundKind.TIME:
            raise click.BadParameter("a time: ISO-8601 (2024-03-01T00:00:00Z) or epoch ms", param_hint="--since")
        since_ms = bound.value
    config_kwargs = {"reasons": tuple(dict.fromkeys(reasons)) or DLQ_REASONS, "since_ms": since_ms,
                     "max_batch": max_batch}
    if spec_file is None:
        require_kafka(settings)
    spec = resolve_spec(settings, model, spec_file)
    config = RedriveConfig.for_spec(settings, spec, **config_kwargs)
    require_kafka(settings)
    stop = stop_on_signals()
    report = Redrive(config).run(stop)
    for line in report.lines():
        click.echo(line)
    if not report.complete:
        click.get_current_context().exit(EXIT_INTERRUPTED)
