"""`sie tail results|dlq --model M [--follow]`: the last records of a model's results or dead letters.

Read ``read_committed`` (what a consumer of the topic sees: never a record of an aborted transaction), with
a throwaway group that is never joined or committed.  Results print as their JSON value; dead letters as one
line with their reason, source and detail, then the value (``-o json``: one JSON object per dead letter with
every ``sie.*`` header).  ``--follow`` keeps printing until Ctrl-C (exit 0).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import click

from sie.kernel.settings import Settings


def dead_letter_json(msg: Any) -> dict[str, Any]:
    """A dead letter as one JSON object: its ``sie.*`` headers by name, key and value as UTF-8 (replaced)."""
    from sie.streams.eos.records import safe_headers

    headers = {k: (v or b"").decode("utf-8", "replace") for k, v in safe_headers(msg) or ()}
    return {
        "reason": headers.get("sie.reason"),
        "detail": headers.get("sie.detail"),
        "model": headers.get("sie.model"),
        "version": headers.get("sie.version"),
        "source": {"topic": headers.get("sie.source.topic"), "partition": headers.get("sie.source.partition"),
                   "offset": headers.get("sie.source.offset")},
        "dlq": {"topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset()},
        "headers": {k: v for k, v in headers.items() if k.startswith("sie.") and k not in (
            "sie.reason", "sie.detail", "sie.model", "sie.version", "sie.source.topic", "sie.source.partition",
            "sie.source.offset")},
        "key": msg.key().decode("utf-8", "replace") if msg.key() is not None else None,
        "value": msg.value().decode("utf-8", "replace") if msg.value() is not None else None,
    }


def _line(kind: str, msg: Any, output: str) -> str:
    if kind == "results":
        return (msg.value() or b"").decode("utf-8", "replace")
    doc = dead_letter_json(msg)
    if output == "json":
        return json.dumps(doc)
    src = doc["source"]
    value = doc["value"] or ""
    return (f"{doc['reason']}  {src['topic']}:{src['partition']}:{src['offset']}  {doc['detail']}\n"
            f"    {value[:300]}{'...' if len(value) > 300 else ''}")


@click.command("tail")
@click.argument("what", type=click.Choice(["results", "dlq"]))
@click.option("--model", help="Name of an applied model (its topics are read from its spec on the cluster).")
@click.option("--spec", "spec_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Take the topics from this spec file instead.")
@click.option("-n", "--lines", "count", type=click.IntRange(min=0), default=10, show_default=True,
              help="How many of the latest records to print first.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new records until Ctrl-C.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="dlq only: a line per dead letter, or one JSON object each.")
@click.pass_obj
def command(settings: Settings, what: str, model: str | None, spec_file: Path | None, count: int, follow: bool,
            output: str) -> None:
    """Print the latest results or dead letters of a model (read_committed); --follow for new ones."""
    from sie.commands._runtime import require_kafka
    from sie.commands.produce import resolve_spec
    from sie.kernel.authz import from_kafka_error, needs_role, topic_partitions
    from sie.kernel.clients import KafkaClients, state_reader_config
    from sie.kernel.errors import SieError
    from sie.kernel.replay import read_to_end

    needs_role("sie tail", "consumer", f"--model {model}" if model else "--spec FILE")
    require_kafka(settings)
    spec = resolve_spec(settings, model, spec_file)
    topic = spec.topics.results if what == "results" else spec.topics.dead_letters
    names = settings.names
    config = state_reader_config(settings, names.reader_group("tail", uuid.uuid4().hex[:8]),
                                 names.cli_client_id("tail"), partition_eof=True)
    consumer = KafkaClients().consumer(config)
    try:
        # missing, or not this principal's to read (NotAuthorized names the principal and the ACL)
        partitions = topic_partitions(consumer, topic, config, "READ", settings.connect_timeout_s)
        if partitions is None:
            raise SieError(f"topic {topic} does not exist on {settings.bootstrap_servers}: nothing was scored for "
                           f"{spec.name} yet")
        backlog: list[Any] = []

        def refused(msg: Any) -> None:
            denied = from_kafka_error(msg.error(), config, "READ", topic)
            if denied is not None:  # Describe granted, Read not
                raise denied

        # the latest N per partition (to the end each has now, past transaction markers), then the newest N overall
        read_to_end(consumer, topic, backlog.append, timeout_s=30, partitions=partitions,
                    start=lambda low, end: end - count, on_error=refused)
        backlog.sort(key=lambda m: (m.timestamp()[1], m.partition(), m.offset()))
        for msg in backlog[-count:] if count else ():
            click.echo(_line(what, msg, output))
        if not follow:
            return
        try:
            while True:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    click.echo(_line(what, msg, output))
        except KeyboardInterrupt:
            return  # Ctrl-C is how a follow ends
    finally:
        consumer.close()
