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

from sie.commands._runtime import configure_logging, require_kafka, stop_on_signals
from sie.kernel.settings import Settings

_SPEC = click.Path(exists=True, dir_okay=False, path_type=Path)


def _model_spec(settings: Settings, connector, model_spec: Path | None, offline: bool):
    """The target model's spec (field types for coercion): a file, else the cluster, else None (uncast)."""
    if model_spec is not None:
        from sie.schemas.spec import load

        spec = load(model_spec, topic_prefix=settings.topic_prefix)
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


def _records(handle, keyed: bool):
    """(line number, key, value) per non-empty line: ``KEY<TAB>VALUE`` with ``--keyed`` (what ``kcat -K'\t'``
    prints; an empty or ``null`` KEY is a null key), else the whole line is the value and the key is None."""
    for n, line in enumerate(_iter_lines(handle), start=1):
        if not keyed:
            yield n, None, line
            continue
        key, sep, value = line.partition(b"\t")
        if not sep:
            raise click.UsageError(f"line {n}: no TAB; with --keyed every line is KEY<TAB>VALUE")
        yield n, (None if key.strip() in (b"", b"null") else key.strip()), value.strip()


def debezium_key(connector, value: bytes) -> bytes | None:
    """The record key Debezium's JsonConverter (schemas off) would write, ``{"<pk column>": value, ...}``, for a
    table whose primary key the connector spec lists (``primaryKeys``); None otherwise."""
    import orjson

    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    payload = doc.get("payload", doc) if isinstance(doc, dict) else None
    if not isinstance(payload, dict) or not isinstance(payload.get("source"), dict):
        return None
    source = payload["source"]
    columns = connector.primary_keys.get(f"{source.get('db')}.{source.get('table')}")
    image = payload.get("after") if isinstance(payload.get("after"), dict) else payload.get("before")
    if not columns or not isinstance(image, dict) or any(c not in image for c in columns):
        return None
    return orjson.dumps({c: image[c] for c in columns})


_KEYED = click.option("--keyed", is_flag=True,
                      help="Lines are KEY<TAB>VALUE (as `kcat -C -K'\t'` prints them): Debezium's record key "
                           "carries the primary key.")


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
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535),
              help="Serve Prometheus /metrics here (0 = any free port; the ready line prints the one bound).")
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
    from sie.kernel.authz import needs_role

    needs_role("sie cdc run", "cdc", "--connector NAME --source-topic TOPIC --model MODEL")
    from sie.kernel.admin import ensure_model_topics, ensure_topics
    from sie.kernel.topics import TopicSpec
    from sie.streams.scorer import default_instance

    connector = load_connector_spec(connector_file)
    require_kafka(settings)  # one line within seconds if Kafka does not answer (logs start after it)
    configure_logging(log_level)
    model = _model_spec(settings, connector, model_spec, offline=False)
    request_topic = connector.request_topic or (model.topics.requests if model is not None else None)
    config = CdcStageConfig(
        settings=settings, connector=connector, instance=instance or default_instance(0),
        input_schema=model.input_schema if model is not None else None, request_topic=request_topic,
        dead_letter_topic=dead_letter_topic, max_batch=max_batch, max_wait_ms=max_wait_ms,
        session_timeout_ms=session_timeout_ms, metrics_port=metrics_port, log_interval_s=log_interval)
    from sie.connectors.cdc import CdcConverter

    target = CdcConverter(connector, request_topic=request_topic, input_schema=config.input_schema,
                          topic_prefix=settings.topic_prefix).request_topic
    parts = partitions or settings.request_partitions
    ensure_model_topics(settings, [target], parts)
    ensure_topics(settings, [TopicSpec(config.dlq, parts, False, f"dead letters of CDC connector {connector.name}")])

    stop = stop_on_signals()

    def ready(stage) -> None:
        click.echo(f"ready: {connector.format} {connector.source_topic} -> {target} (dlq {config.dlq}) "
                   f"as {config.transactional_id}, group {config.group_id}"
                   + (f", metrics on {settings.metrics_bind}:{stage.metrics.port}" if metrics_port is not None else ""))
        sys.stdout.flush()

    started = time.monotonic()
    summary = run_cdc_stage(config, stop, on_ready=ready)
    click.echo(f"stopped after {time.monotonic() - started:.1f}s: {summary.line()}")


@command.command("convert")
@click.option("-f", "--connector", "connector_file", required=True, type=_SPEC, help="CDC connector spec (YAML).")
@click.option("--model-spec", type=_SPEC, help="The model's spec: values are coerced to its input types.")
@click.option("--file", "events", type=click.File("rb"), default="-", show_default="stdin",
              help="CDC events, one JSON record value per line (as they appear on the source topic).")
@_KEYED
@click.pass_obj
def convert(settings: Settings, connector_file: Path, model_spec: Path | None, events, keyed: bool) -> None:
    """Dry run, no Kafka: print the requests (key TAB value) the stage would produce for each event.

    Skipped events and dead letters are reported on stderr with their reasons; a summary follows.
    A Debezium row's primary key is in the record KEY, which a values-only file does not have: give
    KEY<TAB>VALUE lines (--keyed), or list the table's key columns in the connector's primaryKeys;
    otherwise each row is a dead letter missing_primary_key, as it would be in the stage.
    """
    from sie.connectors.cdc import CdcConverter, load_connector_spec

    connector = load_connector_spec(connector_file)
    model = _model_spec(settings, connector, model_spec, offline=True)
    converter = CdcConverter(connector, input_schema=model.input_schema if model is not None else None,
                             request_topic=connector.request_topic or (model.topics.requests if model else None),
                             topic_prefix=settings.topic_prefix)
    out = sys.stdout
    for n, key, line in _records(events, keyed):
        outcome = converter.convert(key, line)
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
              help="CDC events, one JSON record value per line, produced unchanged.")
@_KEYED
@click.option("--partitions", type=click.IntRange(min=1), default=1, show_default=True,
              help="Partitions of the source topic if it has to be created.")
@click.pass_obj
def publish(settings: Settings, connector_file: Path, events, keyed: bool, partitions: int) -> None:
    """Write CDC events to the connector's source topic as-is (stands in for canal/Debezium in demos).

    Keys: with --keyed the given ones; else for Debezium events of a table in the connector's primaryKeys,
    the key Debezium writes ({"<pk column>": value}); else none (canal writes none; a Debezium row without
    a key is dead-lettered missing_primary_key by the stage unless primaryKeys lists its table).
    """
    from sie.connectors.cdc import load_connector_spec
    from sie.kernel.admin import ensure_topics
    from sie.kernel.clients import KafkaClients, idempotent_producer_config
    from sie.kernel.errors import KafkaUnavailable
    from sie.kernel.topics import TopicSpec

    connector = load_connector_spec(connector_file)
    require_kafka(settings)
    ensure_topics(settings, [TopicSpec(connector.source_topic, partitions, False, "CDC source (demo)")])
    producer = KafkaClients().producer(idempotent_producer_config(settings, settings.names.cli_client_id("cdc-publish")))
    failures: list[str] = []

    def delivered(err, _msg) -> None:
        if err is not None:
            failures.append(str(err))

    count = keyless = 0
    derive = connector.format == "debezium-json" and not keyed
    for _n, key, line in _records(events, keyed):
        if derive:
            key = debezium_key(connector, line)
        keyless += key is None
        producer.produce(connector.source_topic, line, key, on_delivery=delivered)
        producer.poll(0)
        count += 1
    left = producer.flush(30)
    if left or failures:
        raise KafkaUnavailable(f"publishing to {connector.source_topic}: {left} undelivered, "
                               f"errors {failures[:3]}; check the broker at {settings.bootstrap_servers}")
    click.echo(f"published {count} events to {connector.source_topic} ({count - keyless} with a key)")
    if keyless and connector.format == "debezium-json":
        click.echo(f"warning: {keyless} Debezium event(s) without a key: the stage dead-letters their rows "
                   f"missing_primary_key unless primaryKeys lists their table; pass KEY<TAB>VALUE lines (--keyed)",
                   err=True)
