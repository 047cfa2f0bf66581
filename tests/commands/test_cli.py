"""The CLI's shape: every listed subcommand module exists and `--help` works everywhere."""

from __future__ import annotations

import importlib

import click
import pytest
from click.testing import CliRunner

from sie.cli import COMMAND_MODULES, COMMANDS, EXTENSIONS, cli, main


@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_every_listed_command_module_imports(module: str) -> None:
    assert isinstance(importlib.import_module(module).command, click.Command)


def test_the_command_table_names_what_each_module_defines() -> None:
    """``sie.cli.COMMANDS`` says which module to import for a command; it must match the modules."""
    defined = {}
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        defined.update({cmd.name: name for cmd in getattr(module, "commands", (module.command,))})
    assert defined == COMMANDS


def test_every_subcommand_comes_with_its_top_level_command_s_module() -> None:
    """A subcommand another module adds to a group (``@get.command("replicas")`` in cluster.py) exists only once
    that module is imported: it must be listed in ``EXTENSIONS`` under the group's module, or ``sie get replicas``
    says "No such command" when only the group's module is loaded (a dry run's scale harness did)."""
    for name in COMMAND_MODULES:
        importlib.import_module(name)  # every subcommand registered
    ctx = click.Context(cli)
    missing = []
    for top, module in COMMANDS.items():
        loaded = {module, *EXTENSIONS.get(module, ())}

        def walk(command: click.Command, path: tuple[str, ...]) -> None:
            defined_in = getattr(command.callback, "__module__", module) if command.callback else module
            if defined_in.startswith("sie.commands.") and defined_in not in loaded:
                missing.append((path, defined_in))
            if isinstance(command, click.Group):
                for sub_name, sub in command.commands.items():
                    walk(sub, (*path, sub_name))

        walk(cli.get_command(ctx, top), (top,))
    assert not missing, f"subcommands whose module is not loaded with their group's: {missing}"


def test_get_replicas_nodes_and_rollouts_run_when_only_sie_get_is_looked_up() -> None:
    import subprocess
    import sys

    code = ("from sie.cli import main; import sys; "
            "sys.exit(sum(main(['get', sub, '--help']) for sub in ('replicas', 'nodes', 'rollouts')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_command_imports_its_own_module_and_not_the_others() -> None:
    """A process runs one command and pays for that command's imports only (``sie.cli.LazyGroup``)."""
    import subprocess
    import sys

    code = ("import sys; from sie.cli import main; main(['token', '--help']); "
            "print(sorted(m for m in sys.modules if m.startswith('sie.commands.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    loaded = out.strip().splitlines()[-1]
    assert "'sie.commands.token'" in loaded and "'sie.commands.score'" not in loaded, loaded


def _all_commands(group: click.Group, prefix: tuple[str, ...] = ()):
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        yield prefix + (name,)
        if isinstance(command, click.Group):
            yield from _all_commands(command, prefix + (name,))


def test_help_everywhere() -> None:
    runner = CliRunner()
    paths = list(_all_commands(cli))
    assert len(paths) >= len(COMMAND_MODULES)
    for path in paths:
        result = runner.invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage:" in result.output


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["no-such-command"]) == 2
    assert "No such command" in capsys.readouterr().err


def test_bad_setting_names_the_variable(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SIE_REQUEST_PARTITIONS", "many")
    assert main(["kafka", "status"]) == 2
    assert "request_partitions" in capsys.readouterr().err
