"""The ``sie`` command line: one entry point, one subcommand module per concern.

Each module in ``sie.commands`` exposes a click command (or group) named
``command`` (or several, ``commands``); ``COMMANDS`` maps each command to its module, which is imported
only when that command runs (``LazyGroup``), and heavy imports (torch, confluent_kafka) stay inside the
commands.  Exit codes (the same for every command; ``sie.commands._runtime`` names them):

    0    success
    1    ``error: <reason>`` on one line (any ``SieError``, Kafka unreachable, a Kafka client error)
    2    usage error (click's convention)
    3    stopped by SIGTERM/SIGINT before the work was complete (resumable where the command says so)
    4    finished, but some input was rejected or not delivered (counts on stdout)
    130  aborted at a prompt or by Ctrl-C outside a command's clean stop
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from sie.kernel.errors import SieError
from sie.kernel.settings import Settings

#: each command -> the module that defines it (a module's ``command``, or its ``commands``).  A process imports only
#: the module of the command it runs: importing every module would about double a command's start-up CPU (the test
#: suite starts hundreds of agents, control planes and CLI commands).
#: ``sie --help`` imports them all.  tests/commands/test_cli.py checks this table against the modules.
COMMANDS: dict[str, str] = {
    "kafka": "sie.commands.kafka",
    "topics": "sie.commands.topics",
    "validate": "sie.commands.spec",
    "apply": "sie.commands.spec",
    "get": "sie.commands.spec",
    "delete": "sie.commands.spec",
    "rollout": "sie.commands.rollout",
    "score": "sie.commands.score",
    "predict": "sie.commands.predict",
    "agent": "sie.commands.agent",
    "produce": "sie.commands.produce",
    "cdc": "sie.commands.cdc",
    "connector": "sie.commands.connector",
    "backfill": "sie.commands.backfill",
    "control": "sie.commands.control",
    "operator": "sie.commands.operator",
    "token": "sie.commands.token",
    "acls": "sie.commands.acls",
    "describe": "sie.commands.cluster",
    "replica": "sie.commands.replica",
    "scale": "sie.commands.scale",
    "node": "sie.commands.node",
    "tail": "sie.commands.tail",
    "logs": "sie.commands.logs",
    "dlq": "sie.commands.dlq",
    "prometheus": "sie.commands.prometheus",
    "status": "sie.commands.status",
    "demo": "sie.commands.demo",
}
#: the subcommand modules, each once
COMMAND_MODULES = list(dict.fromkeys(COMMANDS.values()))
#: modules that add subcommands to another module's groups, loaded with it: ``sie get nodes`` / ``get replicas`` and
#: ``sie get rollouts`` are cluster's and rollout's (tests/commands/test_cli.py finds any other)
EXTENSIONS: dict[str, tuple[str, ...]] = {"sie.commands.spec": ("sie.commands.cluster", "sie.commands.rollout")}


class LazyGroup(click.Group):
    """A group whose commands are imported when one is looked up (``COMMANDS``), not when ``sie`` starts."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | {name for name, module in COMMANDS.items() if _present(module)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            _load(COMMANDS[cmd_name], self)
        return self.commands.get(cmd_name)


def _present(module_name: str) -> bool:
    return importlib.util.find_spec(module_name) is not None


def _load(module_name: str, group: click.Group) -> None:
    """Add the commands of one module (and of the modules that extend its groups, ``EXTENSIONS``) to ``group``;
    a module listed but absent (a partial checkout) adds none (tests/commands/test_cli.py asserts all are
    present); a real import error inside it surfaces."""
    for name in (module_name, *EXTENSIONS.get(module_name, ())):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        for cmd in getattr(module, "commands", (module.command,)):  # a module may add several top-level commands
            group.add_command(cmd)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; turn SieError (and a Kafka client error) into a one-line reason and a non-zero exit.

    Under ``standalone_mode=False`` click hands back the code of ``ctx.exit(code)`` as the return value of
    ``cli.main``; it is this process's exit status (``sie backfill`` interrupted: 3).
    """
    import contextvars

    try:
        # in a context of its own: what a command sets for its errors (authz.needs_role) ends with it
        code = contextvars.copy_context().run(cli.main, args=argv, prog_name="sie", standalone_mode=False)
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
