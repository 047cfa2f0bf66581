"""The ``sie`` command line: one entry point, one subcommand module per concern.

Each module in ``sie.commands`` exposes a click command (or group) named
``command``; heavy imports (torch, confluent_kafka) stay inside the commands so
``sie --help`` is instant.  Exit codes (the same for every command; ``sie.commands._runtime`` names them):

    0    success
    1    ``error: <reason>`` on one line (any ``SieError``, Kafka unreachable, a Kafka client error)
    2    usage error (click's convention)
    3    stopped by SIGTERM/SIGINT before the work was complete (resumable where the command says so)
    4    finished, but some input was rejected or not delivered (counts on stdout)
    130  aborted at a prompt or by Ctrl-C outside a command's clean stop
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
    "sie.commands.rollout",
    "sie.commands.score",
    "sie.commands.predict",
    "sie.commands.agent",
    "sie.commands.produce",
    "sie.commands.cdc",
    "sie.commands.connector",
    "sie.commands.backfill",
    "sie.commands.control",
    "sie.commands.operator",
    "sie.commands.token",
    "sie.commands.acls",
    "sie.commands.cluster",
    "sie.commands.replica",
    "sie.commands.tail",
    "sie.commands.logs",
    "sie.commands.dlq",
    "sie.commands.prometheus",
    "sie.commands.status",
    "sie.commands.demo",
]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="sie", prog_name="sie", message="%(prog)s %(version)s")
@click.option("--bootstrap-servers", envvar="SIE_BOOTSTRAP_SERVERS", help="Kafka bootstrap servers.")
@click.option("-v", "--verbose", is_flag=True, help="Show SIE's and librdkafka's log lines on stderr.")
@click.pass_context
def cli(ctx: click.Context, bootstrap_servers: str | None, verbose: bool) -> None:
    """SIE: a Kafka-native inference cluster.

    Settings come from SIE_* environment variables (see sie/kernel/settings.py);
    options given here override them.  Exit codes: 0 ok, 1 error (one line), 2 usage,
    3 stopped before complete, 4 some input rejected or undelivered.
    """
    from sie.commands._runtime import quiet_kafka_logs

    try:
        settings = Settings()
    except Exception as exc:  # pydantic ValidationError from a bad SIE_* variable
        raise click.UsageError(f"bad SIE_* setting: {exc}") from exc
    quiet_kafka_logs(verbose)
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
    """Run the CLI; turn SieError (and a Kafka client error) into a one-line reason and a non-zero exit.

    Under ``standalone_mode=False`` click hands back the code of ``ctx.exit(code)`` as the return value of
    ``cli.main``; it is this process's exit status (``sie backfill`` interrupted: 3).
    """
    try:
        code = cli.main(args=argv, prog_name="sie", standalone_mode=False)
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
    except Exception as exc:
        if type(exc).__module__.split(".")[0] != "confluent_kafka":
            raise  # a bug: its traceback is what a report needs
        from sie.kernel.admin import kafka_error_text

        click.echo(f"error: Kafka: {kafka_error_text(exc)}; check the broker (sie kafka status) and "
                   "SIE_BOOTSTRAP_SERVERS", err=True)
        return 1
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


if __name__ == "__main__":
    sys.exit(main())
