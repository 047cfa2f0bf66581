"""`sie produce`: send JSON scoring requests to a model's request topic.

Exit codes: 0 every line delivered; 4 some lines rejected (bad JSON, schema, missing key) or not
delivered; 3 stopped by SIGINT/SIGTERM before the input ended; 1 an error.  The counts are printed on
every exit.
"""

from __future__ import annotations

import signal
from pathlib import Path

import click

from sie.kernel.errors import ConfigError
from sie.kernel.settings import Settings


def resolve_spec(settings: Settings, model: str | None, spec_file: Path | None):
    """The model's spec: from a file, or the latest one applied to the cluster (the specs topic)."""
    if spec_file is not None:
        from sie.schemas.spec import load

        return load(spec_file, topic_prefix=settings.topic_prefix)
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
@click.option("--key-field", help="Field whose value becomes the Kafka key (per-key order): a dotted path looked up "
                                  "in inputs, then in the request, e.g. card_id or metadata.customer_id. A line "
                                  "without it is rejected.")
@click.option("--allow-missing-key", is_flag=True,
              help="Send a line without the --key-field value with a null key (counted) instead of rejecting it.")
@click.option("--rate", type=float, help="At most N requests per second.")
@click.option("--no-validate", is_flag=True, help="Send without checking the model's input_schema first.")
@click.option("--topic", help="Override the model's request topic.")
@click.pass_obj
def command(settings: Settings, model: str | None, spec_file: Path | None, input_file, key_field: str | None,
            allow_missing_key: bool, rate: float | None, no_validate: bool, topic: str | None) -> None:
    """Send JSON requests to a model's request topic (idempotent producer).

    Each line is validated against the model's input_schema before it is sent (unless --no-validate);
    rejected lines are counted with their reasons. Prints progress every second and a summary.
    """
    from sie.commands._runtime import EXIT_INTERRUPTED, EXIT_PARTIAL, require_kafka
    from sie.connectors.producer import ProduceError, ProduceSummary, produce_jsonl
    from sie.kernel.authz import needs_role
    from sie.kernel.tracing import tracing_from_settings
    from sie.schemas.validation import compile_validator

    if allow_missing_key and not key_field:
        raise click.UsageError("--allow-missing-key needs --key-field")
    needs_role("sie produce", "producer", f"--model {model}" if model else "--spec FILE")
    if spec_file is None:
        require_kafka(settings)  # the spec comes from the cluster
    spec = resolve_spec(settings, model, spec_file)
    if spec_file is not None:
        require_kafka(settings)
    target = topic or spec.topics.requests
    validator = None if no_validate else compile_validator(spec.input_schema)

    def progress(summary) -> None:
        click.echo(f"  ... sent {summary.sent}, delivered {summary.delivered}, rejected {summary.rejected_total}",
                   err=True)

    def on_sigterm(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt  # like Ctrl-C: stop reading, flush what was sent, print the counts

    signal.signal(signal.SIGTERM, on_sigterm)
    holder: list[ProduceSummary] = []
    tracing = tracing_from_settings(settings, "sie-produce")  # SIE_TRACING: a trace per request, sampled
    try:
        summary = produce_jsonl(settings, target, input_file, validator=validator, key_field=key_field,
                                allow_missing_key=allow_missing_key, rate=rate, progress=progress,
                                summary_out=holder, tracing=tracing)
    except ProduceError:
        click.echo(f"{spec.name} -> {target}")
        for line in holder[0].lines() if holder else ():
            click.echo(line)
        raise
    finally:
        tracing.shutdown()  # export what is buffered before the process exits
    click.echo(f"{spec.name} -> {target}")
    for line in summary.lines():
        click.echo(line)
    if summary.delivery_failures.get("TOPIC_AUTHORIZATION_FAILED"):  # a missing ACL, not an outage: say the grant
        from sie.kernel.authz import NotAuthorized

        raise NotAuthorized(settings.sasl_username, "WRITE", "topic", target, "TOPIC_AUTHORIZATION_FAILED")
    if summary.interrupted:
        click.get_current_context().exit(EXIT_INTERRUPTED)
    if not summary.complete:
        click.get_current_context().exit(EXIT_PARTIAL)
