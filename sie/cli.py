"""The ``sie`` command line: one entry point, one subcommand module per concern.

Each module in ``sie.commands`` exposes a click command (or group) named
``command``; heavy imports (torch, confluent_kafka) stay inside the commands so
``sie --help`` is instant.  Exit codes: 0 success; 1 with ``error: <reason>``
on one line for any ``SieError``; 2 for usage errors (click's convention).
"""

from __future__ import annotations

import importlib
import sys

import click

from sie.kernel.errors import SieError
from sie.kernel.settings import Settings

# Subcommand modules, in the order `sie --help` lists them.
COMMAND_MODULES = [
    "sie.commands.kafka",
    "sie.commands.topics",
    "sie.commands.spec",
    "sie.commands.score",
    "sie.commands.agent",
    "sie.commands.produce",
    "sie.commands.cdc",
    "sie.commands.connector",
    "sie.commands.backfill",
    "sie.commands.control",
    "sie.commands.token",
    "sie.commands.acls",
    "sie.commands.cluster",
    "sie.commands.demo",
]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--bootstrap-servers", envvar="SIE_BOOTSTRAP_SERVERS", help="Kafka bootstrap servers.")
@click.pass_context
def cli(ctx: click.Context, bootstrap_servers: str | None) -> None:
    """SIE: a Kafka-native inference cluster.

    Settings come from SIE_* environment variables (see sie/kernel/settings.py);
    options given here override them.
    """
    try:
        settings = Settings()
    except Exception as exc:  # pydantic ValidationError from a bad SIE_* variable
        raise click.UsageError(f"bad SIE_* setting: {exc}") from exc
    ctx.obj = settings.with_overrides(bootstrap_servers=bootstrap_servers)


def _register() -> None:
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a real import error inside the module: surface it
                raise
            continue  # listed but absent (partial checkout); tests/test_cli.py asserts all are present
        for cmd in getattr(module, "commands", (module.command,)):  # a module may add several top-level commands
            cli.add_command(cmd)


_register()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; turn SieError into a one-line reason and a non-zero exit."""
    try:
        cli.main(args=argv, prog_name="sie", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except SieError as exc:
        click.echo(f"error: {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
