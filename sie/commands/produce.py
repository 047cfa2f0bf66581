"""`sie produce`: send JSON scoring requests to a model's request topic."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from sie.kernel.errors import ConfigError
from sie.kernel.settings import Settings


def resolve_spec(settings: Settings, model: str | None, spec_file: Path | None):
    """The model's spec: from a file, or the latest one applied to the cluster (the specs topic)."""
    if spec_file is not None:
        from sie.schemas.spec import load_spec

        return load_spec(spec_file, topic_prefix=settings.topic_prefix)
    if model is None:
        raise click.UsageError("give --model NAME (an applied model) or --spec FILE")
    from sie.schemas.spec_store import read_specs

    specs = read_specs(settings)
    if model not in specs:
        known = ", ".join(sorted(specs)) or "none"
        raise ConfigError(f"model {model!r} is not applied on {settings.bootstrap_servers} "
                          f"(applied: {known}); run `sie apply -f SPEC` or pass --spec FILE")
    return specs[model]


@click.command("produce")
@click.option("--model", "model", help="Name of an applied model (its spec is read from the cluster).")
@click.option("--spec", "spec_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Read the model's spec from this file instead of the cluster.")
@click.option("--file", "input_file", type=click.File("rb"), default="-", show_default="stdin",
              help="JSON lines: full requests {\"id\", \"inputs\"} or bare inputs objects.")
@click.option("--key-field", help="Input field (or request field) whose value becomes the Kafka key.")
@click.option("--rate", type=float, help="At most N requests per second.")
@click.option("--no-validate", is_flag=True, help="Send without checking the model's input_schema first.")
@click.option("--topic", help="Override the model's request topic.")
@click.pass_obj
def command(settings: Settings, model: str | None, spec_file: Path | None, input_file, key_field: str | None,
            rate: float | None, no_validate: bool, topic: str | None) -> None:
    """Send JSON requests to a model's request topic (idempotent producer).

    Each line is validated against the model's input_schema before it is sent (unless --no-validate);
    rejected lines are counted with their reasons. Prints progress every second and a summary.
    """
    from sie.connectors.producer import produce_jsonl
    from sie.kernel.tracing import tracing_from_settings
    from sie.schemas.validation import compile_validator

    spec = resolve_spec(settings, model, spec_file)
    target = topic or spec.topics.requests
    validator = None if no_validate else compile_validator(spec.input_schema)

    def progress(summary) -> None:
        click.echo(f"  ... sent {summary.sent}, delivered {summary.delivered}, rejected {summary.rejected_total}",
                   err=True)

    tracing = tracing_from_settings(settings, "sie-produce")  # SIE_TRACING: a trace per request, sampled
    try:
        summary = produce_jsonl(settings, target, input_file, validator=validator, key_field=key_field,
                                rate=rate, progress=progress, tracing=tracing)
    finally:
        tracing.shutdown()  # export what is buffered before the process exits
    click.echo(f"{spec.name} -> {target}")
    for line in summary.lines():
        click.echo(line)
    if summary.delivery_failures:
        sys.exit(1)
