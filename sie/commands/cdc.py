"""`sie cdc run|convert|publish`: the CDC stage from a connector spec.

* ``run``     converts the connector's source topic into scoring requests exactly once (``sie.connectors.cdc_stage``);
* ``convert`` is the offline dry run: CDC events from a file -> the requests it would produce (no Kafka);
* ``publish`` writes CDC events from a file to the source topic as-is (demos and tests without a database).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from sie.commands._runtime import configure_logging, stop_on_signals
from sie.kernel.settings import Settings

_SPEC = click.Path(exists=True, dir_okay=False, path_type=Path)


def _model_spec(settings: Settings, connector, model_spec: Path | None, offline: bool):
    """The target model's spec (field types for coercion): a file, else the cluster, else None (uncast)."""
    if model_spec is not None:
        from sie.schemas.spec import load_spec

        spec = load_spec(model_spec, topic_prefix=settings.topic_prefix)
        if spec.name != connector.model:
            raise click.UsageError(f"--model-spec {model_spec} is model {spec.name!r} but connector "
                                   f"{connector.name!r} feeds {connector.model!r}")
        return spec
    if offline:
        return None
    from sie.commands.produce import resolve_spec
    from sie.kernel.errors import ConfigError

    try:
        return resolve_spec(settings, connector.model, None)
    except ConfigError as exc:
        click.echo(f"warning: {exc}; values are sent as decoded (not coerced to the model's types)", err=True)
        return None


def _iter_lines(handle):
    for raw in handle:
        line = raw.strip()
        if line:
            yield line


@click.group("cdc")
def command() -> None:
    """CDC connectors: database change streams (canal, Debezium, Maxwell) -> scoring requests."""


@command.command("run")
@click.option("-f", "--connector", "connector_file", required=True, type=_SPEC, help="CDC connector spec (YAML).")
@click.option("--model-spec", type=_SPEC, help="The model's spec file (default: the spec applied on the cluster).")
@click.option("--instance", help="Stable, unique instance name: transactional.id = sie.cdc.<connector>.<instance>. "
                                 "Default: <hostname>-0.")
@click.option("--max-batch", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Source records per transaction.")
@click.option("--max-wait-ms", type=click.IntRange(min=0), default=20, show_default=True)
@click.option("--dead-letter-topic", help="Where poison CDC events go (default: sie.cdc.<connector>.dlq).")
@click.option("--partitions", type=click.IntRange(min=1),
              help="Partitions of the request/dead-letter topics if created (default: SIE_REQUEST_PARTITIONS).")
@click.option("--metrics-port", type=click.IntRange(min=1, max=65535), help="Serve Prometheus /metrics here.")
@click.option("--log-interval", type=click.FloatRange(min=0.5), default=30.0, show_default=True,
              help="Seconds between progress log lines.")
@click.option("--session-timeout-ms", type=click.IntRange(min=1000), default=10_000, show_default=True)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
@click.pass_obj
def run(settings: Settings, connector_file: Path, model_spec: Path | None, instance: str | None, max_batch: int,
        max_wait_ms: int, dead_letter_topic: str | None, partitions: int | None, metrics_port: int | None,
        log_interval: float, session_timeout_ms: int, log_level: str) -> None:
    """Convert the connector's source topic into scoring requests, exactly once, until SIGTERM/SIGINT.

    Prints `ready ...` once subscribed; on SIGTERM it finishes and commits the current batch,
    leaves the consumer group and prints a summary.
    """
    from sie.connectors.cdc import load_connector_spec
    from sie.connectors.cdc_stage import CdcStageConfig, run_cdc_stage
    from sie.kernel.admin import ensure_model_topics, ensure_topics
    from sie.kernel.topics import TopicSpec
    from sie.streams.scorer import default_instance

    configure_logging(log_level)
    connector = load_connector_spec(connector_file)
    model = _model_spec(settings, connector, model_spec, offline=False)
    request_topic = connector.request_topic or (model.topics.requests if model is not None else None)
    config = CdcStageConfig(
        settings=settings, connector=connector, instance=instance or default_instance(0),
        input_schema=model.input_schema if model is not None else None, request_topic=request_topic,
        dead_letter_topic=dead_letter_topic, max_batch=max_batch, max_wait_ms=max_wait_ms,
        session_timeout_ms=session_timeout_ms, metrics_port=metrics_port, log_interval_s=log_interval)
    from sie.connectors.cdc import CdcConverter

    target = CdcConverter(connector, request_topic=request_topic, input_schema=config.input_schema).request_topic
    parts = partitions or settings.request_partitions
    ensure_model_topics(settings, [target], parts)
    ensure_topics(settings, [TopicSpec(config.dlq, parts, False, f"dead letters of CDC connector {connector.name}")])

    stop = stop_on_signals()

    def ready(_stage) -> None:
        click.echo(f"ready: {connector.format} {connector.source_topic} -> {target} (dlq {config.dlq}) "
                   f"as {config.transactional_id}, group {config.group_id}"
                   + (f", metrics on :{metrics_port}" if metrics_port else ""))
        sys.stdout.flush()

    started = time.monotonic()
    summary = run_cdc_stage(config, stop, on_ready=ready)
    click.echo(f"stopped after {time.monotonic() - started:.1f}s: {summary.line()}")


@command.command("convert")
@click.option("-f", "--connector", "connector_file", required=True, type=_SPEC, help="CDC connector spec (YAML).")
@click.option("--model-spec", type=_SPEC, help="The model's spec: values are coerced to its input types.")
@click.option("--file", "events", type=click.File("rb"), default="-", show_default="stdin",
              help="CDC events, one JSON record value per line (as they appear on the source topic).")
@click.pass_obj
def convert(settings: Settings, connector_file: Path, model_spec: Path | None, events) -> None:
    """Dry run, no Kafka: print the requests (key TAB value) the stage would produce for each event.

    Skipped events and dead letters are reported on stderr with their reasons; a summary follows.
    Debezium keys are not in a values-only file, so primary keys come from the row image here.
    """
    from sie.connectors.cdc import CdcConverter, load_connector_spec

    connector = load_connector_spec(connector_file)
    model = _model_spec(settings, connector, model_spec, offline=True)
    converter = CdcConverter(connector, input_schema=model.input_schema if model is not None else None,
                             request_topic=connector.request_topic or (model.topics.requests if model else None))
    out = sys.stdout
    for n, line in enumerate(_iter_lines(events), start=1):
        outcome = converter.convert(None, line)
        for req in outcome.requests:
            out.write(f"{req.key.decode()}\t{req.value.decode()}\n")
        for reason, count in (outcome.skipped or {}).items():
            click.echo(f"line {n}: skipped {count} ({reason})", err=True)
        if outcome.error is not None:
            click.echo(f"line {n}: dead letter {outcome.error.reason.value}: {outcome.error.detail}", err=True)
    s = converter.stats()
    skipped = {k.removeprefix("skipped."): v for k, v in s.items() if k.startswith("skipped.")}
    errors = {k.removeprefix("errors."): v for k, v in s.items() if k.startswith("errors.")}
    click.echo(f"{s.get('records', 0)} events -> {s.get('requests', 0)} requests for {converter.request_topic}; "
               f"skipped {skipped or 'none'}; dead letters {errors or 'none'}", err=True)


@command.command("publish")
@click.option("-f", "--connector", "connector_file", required=True, type=_SPEC, help="CDC connector spec (YAML).")
@click.option("--file", "events", type=click.File("rb"), default="-", show_default="stdin",
              help="CDC events, one JSON record value per line, produced unchanged (null key, like canal).")
@click.option("--partitions", type=click.IntRange(min=1), default=1, show_default=True,
              help="Partitions of the source topic if it has to be created.")
@click.pass_obj
def publish(settings: Settings, connector_file: Path, events, partitions: int) -> None:
    """Write CDC events to the connector's source topic as-is (stands in for canal/Debezium in demos)."""
    from confluent_kafka import Producer

    from sie.connectors.cdc import load_connector_spec
    from sie.kernel.admin import ensure_topics
    from sie.kernel.errors import KafkaUnavailable
    from sie.kernel.topics import TopicSpec

    connector = load_connector_spec(connector_file)
    ensure_topics(settings, [TopicSpec(connector.source_topic, partitions, False, "CDC source (demo)")])
    producer = Producer(settings.kafka_client_config(**{"acks": "all", "enable.idempotence": True}))
    failures: list[str] = []

    def delivered(err, _msg) -> None:
        if err is not None:
            failures.append(str(err))

    count = 0
    for line in _iter_lines(events):
        producer.produce(connector.source_topic, line, None, on_delivery=delivered)
        producer.poll(0)
        count += 1
    left = producer.flush(30)
    if left or failures:
        raise KafkaUnavailable(f"publishing to {connector.source_topic}: {left} undelivered, "
                               f"errors {failures[:3]}; check the broker at {settings.bootstrap_servers}")
    click.echo(f"published {count} events to {connector.source_topic}")
