"""`sie backfill`: re-score a bounded range of a model's request topic with a chosen version, exactly once.

The command wires settings, spec, backend and signals; the job is ``sie.connectors.backfill.BackfillJob``.
Exit codes: 0 = the range is complete; 3 = stopped (SIGTERM/SIGINT) before the end, resumable with the
same ``--job-id``; 1 = an error (one line).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import click

from sie.commands._runtime import EXIT_INTERRUPTED, configure_logging, require_kafka, stop_on_signals
from sie.kernel.settings import Settings


@click.command("backfill")
@click.option("--model", help="Name of an applied model (its spec is read from the cluster).")
@click.option("--spec", "spec_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The model spec of the version to score with (instead of the applied one).")
@click.option("--from", "range_from", help="Start (inclusive): ISO-8601 time, epoch ms, offset, P:OFF,... or "
                                           "'earliest'. Required for a new job.")
@click.option("--to", "range_to", help="End (exclusive): ISO-8601 time, epoch ms, offset, P:OFF,... or 'now' "
                                       "(the end offsets when the job starts). Required for a new job.")
@click.option("--source-topic", help="Topic to replay (default: the model's request topic).")
@click.option("--version", help="Model version to score with; must be the version of the spec used.")
@click.option("--output-topic", help="Where results go (default: the model's backfill topic, spec.topics.backfill).")
@click.option("--dead-letter-topic", help="Where unscorable records go (default: <output topic>-dlq).")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), help="At most N records per second.")
@click.option("--max-live-lag", type=click.IntRange(min=0), default=1000, show_default=True,
              help="Pause while the live scorer group lags more than N records on the topic (0 = never pause).")
@click.option("--job-id", help="Stable job name: consumer group and transactional.id sie.backfill.<job-id>. "
                               "Re-run with the same id to resume. Default: <model>-<version>-<random>.")
@click.option("--max-batch", type=click.IntRange(min=1), default=500, show_default=True,
              help="Records per transaction (and per backend.infer call).")
@click.option("--progress-interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between progress lines on stderr.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="warning",
              show_default=True)
@click.pass_context
def command(ctx: click.Context, model: str | None, spec_file: Path | None, range_from: str | None,
            range_to: str | None, source_topic: str | None, version: str | None, output_topic: str | None,
            dead_letter_topic: str | None, rate: float | None, max_live_lag: int, job_id: str | None,
            max_batch: int, progress_interval: float, log_level: str) -> None:
    """Re-score the records of [--from, --to) with one model version into the backfill topic.

    Results are keyed <request id>:<version> (a re-run upserts), written with the source offsets in
    one transaction per batch; live consumer offsets are never touched. Progress per partition goes
    to stderr, a report to stdout.
    """
    from sie.commands.produce import resolve_spec
    from sie.connectors.backfill import BackfillConfig, BackfillJob, check_job_id
    from sie.kernel.authz import needs_role

    needs_role("sie backfill", "backfill", (f"--model {model}" if model else "--spec FILE")
               + (f" --job {job_id}" if job_id else ""))
    from sie.connectors.backfill_plan import parse_bound
    from sie.kernel.errors import ConfigError
    from sie.schemas.spec_policy import SpecPolicy
    from sie.workers.backends import backend_config_from_spec, create_backend

    settings: Settings = ctx.obj
    if spec_file is None:
        require_kafka(settings)  # the spec comes from the cluster
    spec = resolve_spec(settings, model, spec_file)
    if model is not None and spec.name != model:
        raise click.UsageError(f"--spec {spec_file} is model {spec.name!r}, not --model {model!r}")
    if version is not None and version != spec.version:
        where = f"--spec {spec_file}" if spec_file else f"the spec applied on {settings.bootstrap_servers}"
        raise ConfigError(f"--version {version}: {where} is version {spec.version}; pass --spec FILE of version "
                          f"{version}")
    if job_id is None:
        if range_from is None or range_to is None:
            raise click.UsageError("a new backfill needs --from and --to (or --job-id ID to resume a job)")
        job_id = f"{spec.name}-{spec.version}-{uuid.uuid4().hex[:8]}"
    check_job_id(job_id)
    config = BackfillConfig(
        settings=settings, spec=spec, job_id=job_id,
        start=parse_bound(range_from, "--from") if range_from is not None else None,
        end=parse_bound(range_to, "--to") if range_to is not None else None,
        source_topic=source_topic, output_topic=output_topic, dead_letter_topic=dead_letter_topic, rate=rate,
        max_live_lag=max_live_lag or None, max_batch=max_batch, progress_interval_s=progress_interval)

    require_kafka(settings)  # one line within seconds if Kafka does not answer (logs start after it)
    configure_logging(log_level)
    job = BackfillJob(config)
    plan = job.plan()  # before loading the model: a bad range fails fast
    ranges = ", ".join(f"p{r.partition} [{r.start}, {r.end})" for r in plan.ranges) or "none"
    click.echo(f"backfill {job_id}: {plan.total} offsets of {plan.source_topic} ({ranges}) -> {plan.output_topic} "
               f"with {spec.name} {spec.version}", err=True)

    # the node's rules for model code and files; a spec file read here also makes its own folder a model root
    policy = SpecPolicy.from_settings(settings, extra_roots=[spec_file.resolve().parent] if spec_file else [])
    backend = create_backend(backend_config_from_spec(policy.enforce(spec), policy))
    backend.load()

    stop = stop_on_signals()
    try:
        report = job.run(stop, backend)
    finally:
        close = getattr(backend, "close", None)
        if close:
            close()
    for line in report.lines():
        click.echo(line)
    if not report.complete:
        ctx.exit(EXIT_INTERRUPTED)
