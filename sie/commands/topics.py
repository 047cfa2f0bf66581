"""``sie topics ensure|list``: SIE's system topics on the configured cluster."""

from __future__ import annotations

from pathlib import Path

import click

from sie.kernel.settings import Settings


@click.group("topics")
def command() -> None:
    """Create and inspect SIE's topics (names and policies from sie/kernel/topics.py)."""


@command.command("ensure")
@click.option("--replication-factor", type=int, default=None,
              help="Default: SIE_REPLICATION_FACTOR, else 3 on >= 3 brokers, else 1.")
@click.option("--prefix", default=None, help="System topic prefix [default: SIE_TOPIC_PREFIX, i.e. sie].")
@click.option("-f", "--spec", "specs", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Also a model's data-path topics (requests, results, dead letters, backfill + its dead letters): "
                   "on a cluster with ACLs the scorer may not create them, so an administrator does.")
@click.option("--partitions", type=int, default=None, help="Partitions of model topics [default: SIE_REQUEST_PARTITIONS].")
@click.pass_obj
def ensure(settings: Settings, replication_factor: int | None, prefix: str | None, specs: tuple[Path, ...],
           partitions: int | None) -> None:
    """Create missing system topics, fix cleanup.policy drift, report partition mismatches (idempotent)."""
    from sie.commands._runtime import require_kafka
    from sie.kernel.admin import check_data_topics, ensure_topics, model_topic_specs
    from sie.kernel.names import Names
    from sie.kernel.topics import system_topics
    from sie.schemas.spec import load

    topics = system_topics(prefix or settings.topic_prefix)
    for path in specs:
        for spec in load(path, many=True, topic_prefix=prefix or settings.topic_prefix):
            t = spec.topics
            names = [t.requests, t.results, t.dead_letters, t.backfill, settings.names.backfill_dead_letter_topic(t.backfill)]
            check_data_topics(Names(prefix or settings.topic_prefix), names)  # never a system topic as a data topic
            topics.extend(model_topic_specs(names, partitions or settings.request_partitions, settings.max_record_bytes))
    require_kafka(settings)
    report = ensure_topics(settings, topics, replication_factor)
    click.echo(report.table())
    click.echo(f"{len(report.created)} created, {len(report.fixed)} fixed, {len(report.existing)} existing "
               f"on {settings.bootstrap_servers}")


@command.command("list")
@click.option("--all", "show_all", is_flag=True,
              help="Every topic of the cluster, Kafka's internal ones (__consumer_offsets, ...) included.")
@click.pass_obj
def list_topics(settings: Settings, show_all: bool) -> None:
    """List this SIE cluster's topics (names under SIE_TOPIC_PREFIX) with partitions and replication."""
    from sie.kernel.admin import require_cluster

    md = require_cluster(settings)
    prefix = settings.topic_prefix + "."
    click.echo(f"{len(md.brokers)} broker(s) at {settings.bootstrap_servers}"
               + ("" if show_all else f"; topics {prefix}* (--all: every topic)"))
    for name in sorted(md.topics):
        if not show_all and not name.startswith(prefix):
            continue
        parts = md.topics[name].partitions
        rf = len(next(iter(parts.values())).replicas) if parts else 0
        click.echo(f"  {name}  partitions={len(parts)}  replication={rf}")
